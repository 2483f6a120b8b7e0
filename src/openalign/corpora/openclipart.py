"""Built-in corpus `openclipart`: ~8,100 public-domain clipart PNGs whose only text is noisy.

The Debian package openclipart-png ships the images in a category tree
(`/usr/share/openclipart/png/animals/birds/acquila_architetto_franc_01.png`); the alt-text of each file
is its name and category path as words ("acquila architetto franc 01 animals birds"): author names,
Italian, numbering, truncated words, exactly the kind of text ALIGN's filters are for. The same image
filed under several categories (symlinks) becomes one image with several alt-texts. Its label for zero-shot
evaluation is its top-level category (22 of them: "animals", "signs and symbols", ...).

The corpus goes through the real pipeline with the paper's filters, overridable (corpora/catalog.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog
from openalign.pipeline.curation.filter_rules import FilterConfig

DEFAULT_ROOT = "/usr/share/openclipart/png"
LICENCE = "public domain (Creative Commons Public Domain Dedication, per the Debian package's copyright file)"


def alt_text(path: Path, root: Path) -> str:
    words = re.split(r"[_\-\s.]+", path.stem) + list(path.relative_to(root).parent.parts)
    return " ".join(w for w in words if w)


def category(path: Path, root: Path) -> str:
    """The drawing's top-level category ("signs and symbols"), its label for zero-shot evaluation."""
    parts = path.relative_to(root).parts
    return parts[0].replace("_", " ") if len(parts) > 1 else ""


def entries(root: Path) -> list[Entry]:
    """One entry per PNG file (symlinks included), in a stable order."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            if name.lower().endswith(".png"):
                path = Path(dirpath) / name
                out.append(Entry(str(path), (alt_text(path, root),), category(path, root)))
    return out


def build(out: Path, root: str = DEFAULT_ROOT, heldout: float = 0.1, seed: int = 0, image_size: int = 346,
          filter_cfg: FilterConfig = FilterConfig(), engine: str = "local", samples_per_shard: int = 1000,
          min_short_side: int = -1, progress: bool = True, **_ignored) -> dict:
    """Ingest, filter and shard the clipart under `root` into `out`. `min_short_side` (>= 0) replaces the
    paper's image-size rule (shorter side > 200 px, for 289 px training) of `filter_cfg`: a model trained at 64 px
    can use the ~2,600 clipart images between 97 and 200 px that the paper's rule drops (`--preset clipart`)."""
    if min_short_side >= 0:
        filter_cfg = dataclasses.replace(filter_cfg, min_short_side=min_short_side)
    root_path = Path(root)
    if not root_path.is_dir():
        raise ConfigError(f"openclipart images not found at {root}; install them with "
                          "`apt-get install openclipart-png` or pass --root PATH")
    return build_catalog("openclipart", entries(root_path), Path(out), Origin("openclipart-png", LICENCE, root),
                         heldout=heldout, seed=seed, image_size=image_size, filter_cfg=filter_cfg, engine=engine,
                         samples_per_shard=samples_per_shard, progress=progress)
