"""openalign: ALIGN's image/text dual encoders. `openalign.load(dir)` is the Python API (openalign/api.py); the front of
the corpus pipeline is `openalign.extract` (web archives -> candidate pairs) and `openalign.fetch` (their images),
with their options classes. Each is imported on first use so that `import openalign.data` (a pool worker, a Spark
executor) does not import torch through it."""

LAZY = {"load": "openalign.api", "Model": "openalign.api",
        "extract": "openalign.pipeline.extract", "ExtractOptions": "openalign.pipeline.extract",
        "fetch": "openalign.pipeline.fetch", "FetchOptions": "openalign.pipeline.fetch"}


def __getattr__(name: str):
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'openalign' has no attribute {name!r}")
