"""openalign: ALIGN's image/text dual encoders. `openalign.load(dir)` is the Python API (openalign/api.py), imported
on first use so that `import openalign.data` (a pool worker, a Spark executor) does not import torch through it."""


def __getattr__(name: str):
    if name in ("load", "Model"):
        from openalign import api

        return getattr(api, name)
    raise AttributeError(f"module 'openalign' has no attribute {name!r}")
