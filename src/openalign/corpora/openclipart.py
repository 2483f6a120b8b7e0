"""Built-in corpus `openclipart`: ~8,100 public-domain clipart PNGs whose only text is noisy.

The Debian package openclipart-png ships the images in a category tree
(`/usr/share/openclipart/png/animals/birds/acquila_architetto_franc_01.png`); the alt-text of each file
is its name and category path as words ("acquila architetto franc 01 animals birds"): author names,
Italian, numbering, truncated words, exactly the kind of text ALIGN's filters are for. The same image
filed under several categories (symlinks) becomes one image with several alt-texts.

The corpus goes through the real pipeline: a JSONL table -> `ingest` -> `filter` (the paper's rules,
overridable) -> `shard`, with a held-out split of whole images chosen by a hash of the image key:

    DIR/raw.jsonl  DIR/pairs.parquet (+ .manifest.json, .rejects.parquet)  DIR/filter/  DIR/train/  DIR/eval/
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from openalign.config import ConfigError
from openalign.pipeline import filter as filters
from openalign.pipeline.filter_rules import FilterConfig
from openalign.pipeline.ingest import IngestOptions, ingest
from openalign.data.seeds import stable_seed
from openalign.pipeline.shard import ShardOptions, kept_images, write_samples

DEFAULT_ROOT = "/usr/share/openclipart/png"


def alt_text(path: Path, root: Path) -> str:
    words = re.split(r"[_\-\s.]+", path.stem) + list(path.relative_to(root).parent.parts)
    return " ".join(w for w in words if w)


def raw_table(root: Path, out: Path) -> int:
    """Write one JSONL row {image, text} per PNG file (symlinks included); returns the count."""
    rows = 0
    with open(out, "w") as f:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            dirnames.sort()
            for name in sorted(filenames):
                if name.lower().endswith(".png"):
                    path = Path(dirpath) / name
                    f.write(json.dumps({"image": str(path), "text": alt_text(path, root)}) + "\n")
                    rows += 1
    return rows


def build(out: Path, root: str = DEFAULT_ROOT, heldout: float = 0.1, seed: int = 0, image_size: int = 346,
          filter_cfg: FilterConfig = FilterConfig(), engine: str = "local", samples_per_shard: int = 1000,
          min_short_side: int = -1, progress: bool = True, **_ignored) -> dict:
    """Ingest, filter and shard the clipart under `root` into `out`. `min_short_side` (>= 0) replaces the
    paper's image-size rule (shorter side > 200 px, for 289 px training) of `filter_cfg`: a model trained at 64 px
    can use the ~2,600 clipart images between 97 and 200 px that the paper's rule drops (`--preset clipart`)."""
    if min_short_side >= 0:
        filter_cfg = dataclasses.replace(filter_cfg, min_short_side=min_short_side)
    root_path, out = Path(root), Path(out)
    if not root_path.is_dir():
        raise ConfigError(f"openclipart images not found at {root}; install them with "
                          "`apt-get install openclipart-png` or pass --root PATH")
    if not 0.0 <= heldout < 1.0:
        raise ConfigError(f"--heldout must be in [0, 1), not {heldout}")
    out.mkdir(parents=True, exist_ok=True)
    files = raw_table(root_path, out / "raw.jsonl")
    if not files:
        raise ConfigError(f"no .png files under {root}")
    ingested = ingest([str(out / "raw.jsonl")], out / "pairs.parquet", IngestOptions(), progress=progress)
    report = filters.filter_pairs(out / "pairs.parquet", out / "filter", filter_cfg, engine=engine, progress=progress)
    samples = kept_images(out / "pairs.parquet", [out / "filter"])
    is_eval = [stable_seed(seed, "heldout", s["image_key"]) % 10_000 < heldout * 10_000 for s in samples]
    options = ShardOptions(image_size=image_size, samples_per_shard=samples_per_shard, prefix="openclipart")
    info = {"corpus": "openclipart", "pairs": str(out / "pairs.parquet"), "keep": [str(out / "filter")]}
    train = write_samples([s for s, e in zip(samples, is_eval) if not e], out / "train", options, progress,
                          info | {"split": "train"})
    evaluation = write_samples([s for s, e in zip(samples, is_eval) if e], out / "eval", options, progress,
                               info | {"split": "eval"}) if heldout else None
    return {
        "out": str(out), "files": files, "pairs": ingested.pairs, "images": ingested.images,
        "rejected": ingested.rejected, "kept_pairs": report.kept_pairs,
        "filter_report": str(out / "filter" / "filter_report.json"),
        "train_images": train.samples, "eval_images": evaluation.samples if evaluation else 0,
        "removed_by_rule": {r.rule: r.removed_in_sequence for r in report.rules},
    }
