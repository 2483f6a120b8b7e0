"""The unsafe-image hook: run any image classifier over the corpus and drop what it flags (off by default).

    openalign screen pairs.parquet --classifier my_package.nsfw:score --out DIR [--threshold 0.5]

The paper removes pornographic images with a classifier; openalign does not ship one (no model may be
downloaded here, and the choice of classifier is the user's). Plug one in as a Python callable

    def score(images: list[PIL.Image.Image]) -> list[float]:   # RGB, upright; one score per image
        ...                                                    # higher = more likely unsafe

named `module:function` (importable) or `path/to/file.py:function`. Every distinct image of the pair
table is scored in batches; images scoring >= threshold are dropped. The stage writes DIR/keep.parquet
(uids of the surviving pairs) and DIR/screen_report.json; intersect with the filter keep-list in
`openalign shard --keep FILTER_DIR --keep SCREEN_DIR`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable

from openalign.config import ConfigError, Options
from openalign.data import images, sources
from openalign.data.engine import Engine, read_plan
from openalign.pipeline.runner import Run, Stage, run_stage
from openalign.pipeline.curation.scoring import FINITE, score_summary, write_scores

__all__ = ["ScreenOptions", "ScreenResult", "screen"]


@dataclass(frozen=True)
class ScreenOptions(Options):
    classifier: str = ""  # module:function or file.py:function taking a list of RGB PIL images, returning scores
    threshold: float = 0.5  # images scoring at or above it are dropped
    encode_batch: int = 64  # images per classifier call
    workers: int = 1  # local engine: processes, each with its own classifier
    examples: int = 10  # highest-scoring removed images listed in the report
    images_per_task: int = 2_000  # the unit of distribution, retry and resume


def load_classifier(spec: str) -> Callable:
    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function:
        raise ConfigError(f"--classifier {spec!r} must look like package.module:function or file.py:function")
    try:
        if module_name.endswith(".py"):
            loader_spec = importlib.util.spec_from_file_location("openalign_user_classifier", module_name)
            if loader_spec is None or loader_spec.loader is None or not Path(module_name).is_file():
                raise ImportError(f"no file {module_name}")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"cannot import the classifier module {module_name!r}: {err}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(f"{module_name} has no callable {function!r}")
    return fn


_CLASSIFIERS: dict = {}  # per process: a task loads the classifier once


def screen_task(plan: str, index: int, scores_path: str, classifier: str, batch_size: int) -> dict:
    """One task: the classifier's score for each of its images (None: unreadable)."""
    module = classifier.rpartition(":")[0]
    version = (classifier, Path(module).stat().st_mtime_ns) if module.endswith(".py") else classifier
    if version not in _CLASSIFIERS:  # a file edited since it was loaded is loaded again
        _CLASSIFIERS[version] = load_classifier(classifier)
    classify = _CLASSIFIERS[version]
    rows = read_plan(plan, index)
    scores: list = [None] * len(rows)
    batch: list = []

    def flush():
        results = list(classify([image for _, image in batch]))
        if len(results) != len(batch):
            raise ConfigError(f"the classifier returned {len(results)} scores for {len(batch)} images")
        for (i, _), score in zip(batch, results):
            scores[i] = float(score)
        batch.clear()

    for i, row in enumerate(rows):
        data = sources.read_bytes(row["path"], row["member"])
        if data is None:
            continue
        try:
            batch.append((i, images.load_rgb(data)))
        except images.BadImage:
            continue
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    write_scores(scores_path, rows, scores, [None] * len(rows))
    return {"images": len(rows), "unreadable": sum(s is None for s in scores)}


@dataclass(frozen=True)
class ScreenReport:
    """OUT/screen_report.json, after `stage` and `pairs`."""

    classifier: str
    threshold: float
    engine: str
    images: int  # distinct images
    scored_images: int
    unreadable_images: int  # kept: nothing decided them
    removed_images: int
    removed_pairs: int
    keep: str
    resumed_tasks: int
    examples: list  # the highest-scoring removed images: {image, score}
    nonfinite_scores: int  # NaN or infinite: counted, never removed


@dataclass(frozen=True)
class ScreenResult:
    """What `screen` removed (its report, OUT/screen_report.json, holds the same and more: examples)."""

    keep: Path  # OUT/keep.parquet: the uids of the pairs whose image scored under the threshold
    images: int  # distinct images
    removed_images: int  # scored at or above the threshold
    removed_pairs: int  # their pairs
    unreadable_images: int  # could not be read (kept: nothing decided them)
    resumed_tasks: int  # tasks a rerun did not redo
    seconds: float
    report: dict  # the report as written


class Screen(Stage):
    name = "screen"
    options = ScreenOptions
    result = ScreenResult

    def check(self, run: Run) -> None:
        load_classifier(run.options.classifier)  # fails here, in one sentence, before any task starts

    def plan(self, run: Run) -> list:
        options = run.options
        module, _, function = options.classifier.rpartition(":")
        file = module.endswith(".py")
        classifier = f"{Path(module).resolve()}:{function}" if file else options.classifier
        key = asdict(options) | {"workers": 0, "classifier": classifier,  # the file itself: sources_key fingerprints it
                                 "file": str(Path(module).resolve()) if file else None}
        return run.image_jobs(screen_task, (classifier, options.encode_batch), key, options.images_per_task)

    def merge(self, run: Run, results: dict) -> ScreenReport:
        options = run.options
        where = f"{FINITE} AND score >= {float(options.threshold)!r}"  # a NaN score never removes an image
        removed_images, examples, _, nonfinite = score_summary(run.out, run.score_files, where, "DESC",
                                                               options.examples, engine=run.engine)
        removed_pairs = run.keep_without(where)
        unreadable = sum(r["unreadable"] for r in results.values())
        return ScreenReport(
            classifier=options.classifier, threshold=options.threshold, engine=run.engine.name, images=run.images,
            scored_images=run.images - unreadable, unreadable_images=unreadable, removed_images=removed_images,
            removed_pairs=removed_pairs, keep=str(run.keep), resumed_tasks=run.resumed,
            examples=[{"image": image, "score": score} for image, _, score in examples], nonfinite_scores=nonfinite)

    def summary(self, result: ScreenResult, options: ScreenOptions) -> list[str]:
        return [f"{result.removed_images:,} of {result.images:,} images ({result.removed_pairs:,} pairs) scored >= "
                f"{options.threshold} by {options.classifier}; {result.unreadable_images:,} unreadable"]


def screen(pairs: str | Path, out: Path, options: ScreenOptions, progress: bool = True,
           engine: Engine = Engine()) -> ScreenResult:
    """Score every image in tasks of `images_per_task` (local processes or Spark); drop those at or above the
    threshold. A classifier given as a file is named by its absolute path, so executors find it."""
    return run_stage(Screen(), pairs, out, options, progress, engine)
