"""openalign: ALIGN's image/text dual encoders, from a web crawl to a served model.

The public API (docs/api.md), each name imported on first use so that `import openalign` stays cheap and
`import openalign.data` (a pool worker, a Spark executor) does not import torch through it:

    openalign.load(dir) -> Model            encode images and texts, classify (api.py)
    openalign.train(config) -> TrainResult  a run from a preset or config (train/trainer.py)
    openalign.evaluate(model, data) -> EvalResult                            (eval/evaluate.py)
    openalign.extract / fetch               web archives -> candidate pairs -> images (pipeline/)

The modules each job lives in list their public names in `__all__`.
"""

LAZY = {"load": "openalign.api", "Model": "openalign.api",
        "evaluate": "openalign.eval.evaluate", "EvalResult": "openalign.eval.evaluate",
        "EvalOptions": "openalign.eval.options",
        "extract": "openalign.pipeline.extract", "ExtractOptions": "openalign.pipeline.extract",
        "fetch": "openalign.pipeline.fetch", "FetchOptions": "openalign.pipeline.fetch"}
__all__ = list(LAZY)


def __getattr__(name: str):
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'openalign' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY))
