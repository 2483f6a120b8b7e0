"""Evaluation data in the public formats, as a stream of `EvalSample`s (pixels, captions, metadata).

    --data DIR_OF_SHARDS                          webdataset shards (json `texts`, `name`)
    --data dataset_flickr30k.json --images DIR    Karpathy split: images[].filename (+ filepath),
                                                  split, sentences[].raw; `--split test` by default
    --data captions.csv|.tsv|.jsonl --images DIR  one row per caption: image, caption (grouped by image;
                                                  a JSONL row may instead carry a `captions` list)

The paper's protocols are the Karpathy test splits: Flickr30K 1K test images and MSCOCO 5K test
images, 5 captions each (`--split test` of dataset_flickr30k.json / dataset_coco.json).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator

from openalign.config import ConfigError
from openalign.data import images, transforms
from openalign.data.loader import EvalSample, eval_samples
from openalign.data.shards import list_shards

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")


def karpathy_items(path: Path, root: Path, split: str) -> list[tuple[Path, list[str]]]:
    try:
        data = json.loads(path.read_text())
        entries = data["images"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a Karpathy-split JSON (expected {{'images': [...]}})") from None
    items = []
    for entry in entries:
        if split != "all" and entry.get("split") != split:
            continue
        name = Path(entry.get("filepath", "")) / entry["filename"]
        captions = [s["raw"].strip() if "raw" in s else " ".join(s["tokens"]) for s in entry.get("sentences", [])]
        items.append((root / name, [c for c in captions if c]))
    if not items:
        splits = sorted({e.get("split", "?") for e in entries})
        raise ConfigError(f"no images with split {split!r} in {path}; its splits are {', '.join(splits)}")
    return items


def table_items(path: Path, root: Path, image_column: str = "image", text_column: str = "caption"
                ) -> list[tuple[Path, list[str]]]:
    grouped: dict[str, list[str]] = {}
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    for row in rows:
        if image_column not in row or (text_column not in row and "captions" not in row):
            raise ConfigError(f"{path} rows need an {image_column!r} column and a {text_column!r} column "
                              f"(or a 'captions' list in JSONL); found {', '.join(row)}")
        captions = row.get("captions") or [row[text_column]]
        grouped.setdefault(row[image_column], []).extend(c.strip() for c in captions if c and c.strip())
    return [((root / name), caps) for name, caps in grouped.items()]


def file_samples(items: list[tuple[Path, list[str]]], resize: int, crop: int, counter: dict) -> Iterator[EvalSample]:
    for path, captions in items:
        try:
            image = images.load_rgb(path.read_bytes())
        except (OSError, images.BadImage):
            counter["skipped"] = counter.get("skipped", 0) + 1
            continue
        yield EvalSample(transforms.eval_transform(image, resize, crop), captions,
                         {"name": captions[0] if captions else path.stem, "path": str(path)})


def eval_stream(data: str, resize: int, crop: int, counter: dict, images_root: str = "",
                split: str = "test") -> Iterator[EvalSample]:
    """Samples of any supported evaluation format, in file order; unreadable images are counted."""
    path = Path(data)
    root = Path(images_root) if images_root else path.parent
    if path.suffix == ".json" and path.is_file():
        return file_samples(karpathy_items(path, root, split), resize, crop, counter)
    if path.suffix in TABLE_SUFFIXES and path.is_file():
        return file_samples(table_items(path, root), resize, crop, counter)
    return eval_samples(list_shards(data), resize, crop, counter)
