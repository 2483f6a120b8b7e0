"""Built-in corpus `tuxpaint`: Tux Paint's rubber stamps, drawings and photos of things with a sentence about each.

The Debian package tuxpaint-stamps-default installs ~800 PNG stamps in a category tree
(`/usr/share/tuxpaint/stamps/animals/birds/duck.png`), each with a description beside it (`duck.txt`): an English
sentence on the first line ("A duck."), then one line per translation (`de.utf8=Eine Ente.`), written by people for
children, in up to ~70 languages. Each description in `languages` is an alt-text of its stamp; the label for
zero-shot evaluation is the stamp's top-level category (16 of them: "animals", "food", "vehicles", ...).

Stamps that exist only as SVG (~165 of ~950) are left out and counted: they would need an SVG renderer.
Descriptions are short ("A duck."), so the paper's three-word minimum would drop most of them: its rule is for web
boilerplate ("image 1"), which these are not, so the corpus keeps texts of one word and more (`min_words`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog, names_filter

__all__ = ["DEFAULT_ROOT", "build", "descriptions", "entries"]

DEFAULT_ROOT = "/usr/share/tuxpaint/stamps"
LICENCE = "GPL-2+ (Debian's copyright file of tuxpaint-stamps-default)"
CATEGORIES = {"naturalforces": "natural forces"}  # directory names that are not words


def descriptions(path: Path) -> dict[str, str]:
    """A stamp's descriptions by language: the first line is English, then `LANG.utf8=TEXT` lines (`en_GB` and
    `pt_BR` are variants of `en` and `pt`: their first text wins)."""
    out: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if lines and "=" not in lines[0].split(" ")[0]:
        out["en"] = lines[0].strip()
    for line in lines[1:]:
        tag, sep, text = line.partition("=")
        language = tag.split(".")[0].split("_")[0].split("@")[0].strip()
        if sep and text.strip() and language.isalpha():
            out.setdefault(language, text.strip())
    return {language: text for language, text in out.items() if text}


def entries(root: Path, languages: tuple[str, ...]) -> tuple[list[Entry], dict]:
    """One entry per PNG stamp with a description in `languages` ("all": every language); and the counts of the
    stamps left out, by reason."""
    out, skipped = [], {"svg_only": 0, "no_description": 0, "no_text_in_languages": 0}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(n for n in filenames if n.endswith(".txt")):
            stem = Path(dirpath) / name[:-4]
            image = stem.with_suffix(".png")
            if not image.is_file():
                skipped["svg_only" if stem.with_suffix(".svg").is_file() else "no_description"] += 1
                continue
            texts = descriptions(stem.with_suffix(".txt"))
            chosen = tuple(t for lang, t in texts.items() if "all" in languages or lang in languages)
            if not chosen:
                skipped["no_text_in_languages"] += 1
                continue
            top = image.relative_to(root).parts[0]
            out.append(Entry(str(image), chosen, CATEGORIES.get(top, top)))
    return out, skipped


def build(out: Path, root: str = DEFAULT_ROOT, languages: tuple[str, ...] = ("en",), heldout: float = 0.2,
          seed: int = 0, image_size: int = 346, min_short_side: int = 0, min_words: int = 1, engine: str = "local",
          samples_per_shard: int = 1000, progress: bool = True) -> dict:
    """Ingest, filter and shard the stamps under `root` into `out`, with their descriptions in `languages` (or
    `all`). The paper's filters, but for the two rules these stamps are not the web's case of: the image-size rule
    (`min_short_side`, 0: most stamps are 60-200 px drawings) and the three-word minimum (`min_words`). A fifth
    is held out (not the usual tenth), so that a retrieval over it ranks ~150 images, not ~75."""
    root_path = Path(root)
    if not root_path.is_dir():
        raise ConfigError(f"Tux Paint's stamps not found at {root}; install them with "
                          "`apt-get install tuxpaint-stamps-default` or pass root=PATH")
    found, skipped = entries(root_path, tuple(languages))
    cfg = dataclasses.replace(names_filter(min_short_side), min_words=min_words)
    return build_catalog("tuxpaint", found, Path(out), Origin("tuxpaint-stamps-default", LICENCE, root),
                         heldout=heldout, seed=seed, image_size=image_size, filter_cfg=cfg, engine=engine,
                         samples_per_shard=samples_per_shard, progress=progress, extra={"skipped_stamps": skipped})
