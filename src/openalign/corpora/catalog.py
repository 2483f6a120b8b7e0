"""A built-in corpus from a packaged collection of real images with human-written text.

Each collection (openclipart's clipart, Tux Paint's stamps, an icon theme, Unicode's symbols and letters, Symbola's
emoji, GCompris's pictures) lists its images as `Entry`s: an image file, its alt-texts and its category. They go
through the real pipeline as any user's table does: a JSONL table -> `ingest` -> `filter` -> `shard`, with a
held-out split of whole images chosen by a hash of the image key (or of the entry's group: every drawing of one
letter on the same side). The category becomes each shard sample's label (`name` in its JSON), so `openalign eval
--task zeroshot` classifies a held-out split into its collection's categories, and the licence and package go into
both manifests:

    DIR/raw.jsonl  DIR/pairs.parquet (+ .manifest.json, .rejects.parquet)  DIR/filter/  DIR/train/  DIR/eval/
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from openalign.config import ConfigError
from openalign.data.seeds import stable_seed
from openalign.pipeline.curation import filter as filters
from openalign.pipeline.curation.filter_rules import FilterConfig
from openalign.pipeline.ingest import IngestOptions, ingest
from openalign.pipeline.shard import ShardOptions, kept_images, write_samples

__all__ = ["VERSION", "Entry", "Origin", "build_catalog", "heldout_split", "names_filter"]

VERSION = 2  # of what a build writes (2: each sample's category as its label); an older build is built again


@dataclass(frozen=True)
class Entry:
    image: str  # the image file
    texts: tuple[str, ...]  # its alt-texts, one pair each
    category: str  # its class for zero-shot evaluation
    group: str = ""  # images of one group are held out together (a letter in every font); "": the image alone


@dataclass(frozen=True)
class Origin:
    """Where a corpus comes from, recorded in its manifests."""
    package: str  # the Debian package that ships it
    licence: str  # the licence of its images and texts, as the package's copyright file states it
    root: str  # where the package installs it


def check_heldout(heldout: float) -> None:
    if not 0.0 <= heldout < 1.0:
        raise ConfigError(f"heldout must be in [0, 1), not {heldout}")


def names_filter(min_short_side: int) -> FilterConfig:
    """The paper's filters for a collection of names: texts of one word and more, images over `min_short_side` px."""
    return dataclasses.replace(FilterConfig(), min_short_side=min_short_side, min_words=1)


def heldout_split(keys: list[str], heldout: float, seed: int) -> list[bool]:
    """Whether each image is held out: `heldout` of the images by a hash of their keys, the same on every rebuild."""
    check_heldout(heldout)
    return [stable_seed(seed, "heldout", key) % 10_000 < heldout * 10_000 for key in keys]


def build_catalog(name: str, entries: list[Entry], out: Path, origin: Origin, *, heldout: float = 0.1, seed: int = 0,
                  image_size: int = 346, filter_cfg: FilterConfig = FilterConfig(), engine: str = "local",
                  samples_per_shard: int = 1000, progress: bool = True, extra: dict | None = None) -> dict:
    """Ingest, filter and shard `entries` into `out`; returns the summary. An image listed twice (a symlink, the same
    file under two names) is one image with the alt-texts of both; its category and group are its first listing's."""
    if not entries:
        raise ConfigError(f"the {name} corpus found no images under {origin.root}; is {origin.package} installed?")
    check_heldout(heldout)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    category: dict[str, str] = {}
    group: dict[str, str] = {}
    with open(out / "raw.jsonl", "w") as f:
        for entry in entries:
            image = os.path.abspath(entry.image)  # the table's relative paths would be read from its own folder
            category.setdefault(image, entry.category)
            group.setdefault(image, entry.group)
            for text in dict.fromkeys(entry.texts):
                f.write(json.dumps({"image": image, "text": text}, ensure_ascii=False) + "\n")
    ingested = ingest([str(out / "raw.jsonl")], out / "pairs.parquet", IngestOptions(), progress=progress)
    report = filters.filter_pairs(out / "pairs.parquet", out / "filter", filter_cfg, engine=engine, progress=progress)
    samples = [s | {"name": category.get(s["path"], "")} for s in kept_images(out / "pairs.parquet", [out / "filter"])]
    is_eval = heldout_split([group.get(s["path"]) or s["image_key"] for s in samples], heldout, seed)
    options = ShardOptions(image_size=image_size, samples_per_shard=samples_per_shard, prefix=name)
    info = {"corpus": name, "version": VERSION, "pairs": str(out / "pairs.parquet"), "keep": [str(out / "filter")],
            "package": origin.package, "licence": origin.licence, "root": origin.root}
    train = write_samples([s for s, e in zip(samples, is_eval) if not e], out / "train", options, progress,
                          info | {"split": "train"})
    evaluation = write_samples([s for s, e in zip(samples, is_eval) if e], out / "eval", options, progress,
                               info | {"split": "eval"}) if heldout else None
    return {
        "out": str(out), "files": len(entries), "pairs": ingested.pairs, "images": ingested.images,
        "rejected": ingested.rejected, "kept_pairs": report.kept_pairs,
        "filter_report": str(out / "filter" / "filter_report.json"),
        "train_images": train.samples, "eval_images": evaluation.samples if evaluation else 0,
        "removed_by_rule": {r.rule: r.removed_in_sequence for r in report.rules},
        "categories": dict(Counter(s["name"] for s in samples).most_common()),
        "package": origin.package, "licence": origin.licence,
    } | (extra or {})
