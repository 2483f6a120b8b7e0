"""Built-in corpus `icons`: a desktop icon theme's drawings with their names.

An icon theme (the Debian package oxygen-icon-theme by default: KDE's Oxygen, ~1,300 distinct icons outside the
file types) installs one PNG per icon, size and context (`/usr/share/icons/oxygen/base/128x128/devices/
audio-headphones.png`). The names follow the freedesktop.org Icon Naming Specification, written by the artists:
"audio-headphones", "edit-copy", "weather-storm"; an application's icon carries the program's name ("amarok"), as
web alt-texts carry brand names. The alt-text is the name as words ("audio headphones"), the image the icon at its
largest size (at least `min_size` px), and the label for zero-shot evaluation its context ("device", "action",
"place", ...). File-type icons ("application-vnd-rar") are left out unless `contexts` names `mimetypes`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog, names_filter

__all__ = ["CONTEXTS", "DEFAULT_ROOT", "build", "entries", "icon_text"]

DEFAULT_ROOT = "/usr/share/icons/oxygen/base"
LICENCE = "LGPL-3+ (Debian's copyright file of oxygen-icon-theme)"
# the Icon Naming Specification's contexts (directory names) as labels
CONTEXTS = {"actions": "action", "animations": "animation", "applets": "applet", "apps": "application",
            "categories": "menu category", "devices": "device", "emblems": "emblem", "emotes": "emoticon",
            "mimetypes": "file type", "places": "place", "status": "status"}
SIZE = re.compile(r"^(\d+)x\1$")


def icon_text(name: str) -> str:
    """An icon name as words: `audio-headphones` -> "audio headphones", `application-rss+xml` -> "application rss
    xml"."""
    return " ".join(w for w in re.split(r"[-_+.\s]+", name) if w)


def entries(root: Path, contexts: tuple[str, ...], min_size: int) -> list[Entry]:
    """One entry per (context, icon name): the PNG of its largest size of at least `min_size` px."""
    best: dict[tuple[str, str], tuple[int, Path]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        parts = Path(dirpath).relative_to(root).parts
        sizes = [int(m.group(1)) for part in parts if (m := SIZE.match(part))]
        context = next((part for part in parts if part in CONTEXTS), "")
        if not sizes or sizes[0] < min_size or context not in contexts:
            continue
        for name in sorted(n for n in filenames if n.endswith(".png")):
            key = (context, name[:-4])
            if key not in best or sizes[0] > best[key][0]:
                best[key] = (sizes[0], Path(dirpath) / name)
    return [Entry(str(path), (icon_text(name),), CONTEXTS[context])
            for (context, name), (_, path) in sorted(best.items())]


DEFAULT_CONTEXTS = tuple(c for c in CONTEXTS if c != "mimetypes")


def build(out: Path, root: str = DEFAULT_ROOT, contexts: tuple[str, ...] = DEFAULT_CONTEXTS, min_size: int = 48,
          heldout: float = 0.2, seed: int = 0, image_size: int = 346, engine: str = "local",
          samples_per_shard: int = 1000, progress: bool = True) -> dict:
    """Ingest, filter and shard the theme's icons under `root` into `out`. The paper's filters, but for the image-size
    rule (icons are drawn at 256 px at most: `min_size` chooses which sizes count) and the three-word minimum (an icon
    name is one to four words). A fifth is held out, so that a retrieval over it ranks a few hundred icons."""
    root_path = Path(root)
    if not root_path.is_dir():
        raise ConfigError(f"icon theme not found at {root}; install it with `apt-get install oxygen-icon-theme` or "
                          "pass root=PATH (a theme's directory of SIZExSIZE/CONTEXT/NAME.png)")
    unknown = [c for c in contexts if c not in CONTEXTS]
    if unknown:
        raise ConfigError(f"icons: unknown context {unknown[0]!r}; choose from {', '.join(CONTEXTS)}")
    cfg = names_filter(min_size - 1)
    return build_catalog("icons", entries(root_path, tuple(contexts), min_size), Path(out),
                         Origin("oxygen-icon-theme", LICENCE, root), heldout=heldout, seed=seed, image_size=image_size,
                         filter_cfg=cfg, engine=engine, samples_per_shard=samples_per_shard, progress=progress)
