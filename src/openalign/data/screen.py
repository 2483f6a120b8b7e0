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
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from openalign.config import ConfigError
from openalign.data import images
from openalign.data.dedup import train_images
from openalign.data.filters import write_keep_without_images
from openalign.data.ingest import IMAGE_COLUMNS, check_pair_table
from openalign.data.shard import SOURCES


@dataclass(frozen=True)
class ScreenOptions:
    classifier: str = ""  # module:function or file.py:function
    threshold: float = 0.5
    batch_size: int = 64
    examples: int = 10


def load_classifier(spec: str) -> Callable:
    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function:
        raise ConfigError(f"--classifier {spec!r} must look like package.module:function or file.py:function")
    try:
        if module_name.endswith(".py"):
            loader_spec = importlib.util.spec_from_file_location("openalign_user_classifier", module_name)
            if loader_spec is None or not Path(module_name).is_file():
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


def screen(pairs: Path, out: Path, options: ScreenOptions, progress: bool = True) -> dict:
    pairs, out = Path(pairs), Path(out)
    check_pair_table(pairs, IMAGE_COLUMNS)
    classify = load_classifier(options.classifier)
    start = time.perf_counter()
    train = train_images(pairs)
    flagged, scores, unreadable = [], {}, 0
    batch: list = []

    def flush():
        results = list(classify([image for _, image in batch]))
        if len(results) != len(batch):
            raise ConfigError(f"the classifier returned {len(results)} scores for {len(batch)} images")
        for (item, _), score in zip(batch, results):
            scores[item[0]] = float(score)
            if float(score) >= options.threshold:
                flagged.append((item, float(score)))
        batch.clear()

    for item in tqdm(train, desc="screen", unit="img", disable=not progress):
        try:
            batch.append((item, images.load_rgb(SOURCES.read(item[1], item[2]))))
        except (images.BadImage, OSError):
            unreadable += 1
            continue
        if len(batch) == options.batch_size:
            flush()
    if batch:
        flush()
    out.mkdir(parents=True, exist_ok=True)
    removed_pairs = write_keep_without_images(pairs, [f[0][0] for f in flagged], out)
    flagged.sort(key=lambda f: -f[1])
    report = {
        "stage": "screen", "pairs": str(pairs), "classifier": options.classifier, "threshold": options.threshold,
        "images": len(train), "scored_images": len(scores), "unreadable_images": unreadable,
        "removed_images": len(flagged), "removed_pairs": int(removed_pairs), "keep": str(out / "keep.parquet"),
        "examples": [{"image": item[2] or item[1], "score": score} for item, score in flagged[:options.examples]],
        "seconds": round(time.perf_counter() - start, 2),
    }
    (out / "screen_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
