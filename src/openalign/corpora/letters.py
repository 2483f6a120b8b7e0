"""Built-in corpus `letters`: the letters and digits of the Latin and Greek scripts, each drawn by eight Noto faces.

Each letter (Unicode general category L, LETTER in its name) and decimal digit (Nd) of `blocks` that a face draws is
rendered black on white in each of `fonts` (Noto Sans, Serif, Sans Display and Serif Display, regular and bold:
fonts-noto-core), with its Unicode name as words for alt-text ("latin small letter a with diaeresis", "digit nine";
unicode-data). The same concept in several styles is what a model needs to recognise it in a style it never saw; the
symbols corpus draws each symbol once, in the one face that has it.

Every drawing of a character is held out together (the split is by character), so the held-out split measures
letters the model never saw in any face. The label for zero-shot evaluation is the character's kind: "latin capital
letter", "latin small letter", "greek small letter", "digit". Glyphs that look alike across scripts in one face
(Latin A, Greek Alpha) are one image with both names, as the catalog merges identical images.

The paper's text-frequency rule drops an alt-text shared by more than 10 images, so more than ten faces would lose
every letter: the default is eight.
"""

from __future__ import annotations

from pathlib import Path

from PIL import ImageFont
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog, names_filter
from openalign.corpora.symbols import (DEFAULT_UNICODE, NOTO, SIZE, check_fonts, cmap, glyph_file, read_blocks,
                                       read_names)

__all__ = ["DEFAULT_BLOCKS", "DEFAULT_FONTS", "build", "kind"]

DEFAULT_FONTS = tuple(NOTO + f"{family}-{weight}.ttf" for family in ("NotoSans", "NotoSerif", "NotoSansDisplay",
                                                                     "NotoSerifDisplay")
                      for weight in ("Regular", "Bold"))
DEFAULT_BLOCKS = ("Basic Latin", "Latin-1 Supplement", "Greek and Coptic")
LICENCE = ("OFL-1.1 (the Noto fonts, Debian's copyright file of fonts-noto-core); the names: Unicode's licence "
           "(unicode-data)")


def kind(name: str) -> str:
    """A character's kind from its Unicode name: "latin capital letter", "digit", "greek small letter"."""
    words = name.lower().split()
    for i, word in enumerate(words):
        if word == "letter":
            return " ".join(words[:i + 1])
    return words[0]


def build(out: Path, fonts: tuple[str, ...] = DEFAULT_FONTS, blocks: tuple[str, ...] = DEFAULT_BLOCKS,
          unicode_path: str = DEFAULT_UNICODE, heldout: float = 0.1, seed: int = 0, engine: str = "local",
          samples_per_shard: int = 1000, progress: bool = True) -> dict:
    """Render every face's letters and digits of `blocks` into `out/images/` and ingest, filter and shard them into
    `out`. The paper's filters, but for the three-word minimum ("digit nine")."""
    out = Path(out)
    check_fonts(fonts)
    names, spans = read_names(Path(unicode_path)), read_blocks(Path(unicode_path))
    unknown = sorted(set(blocks) - {name for _, _, name in spans})
    if unknown:
        raise ConfigError(f"unknown Unicode block {unknown[0]!r}; name blocks as Blocks.txt does "
                          f"(\"Basic Latin\", \"Greek and Coptic\", \"Cyrillic\")")
    chosen = [(first, last) for first, last, name in spans if name in blocks]
    images = out.resolve() / "images"  # absolute: the table's relative paths are read from its own folder
    images.mkdir(parents=True, exist_ok=True)
    entries, blank = [], 0
    for path in tqdm(fonts, desc="render letters", unit="face", disable=not progress):
        font = ImageFont.truetype(path, size=SIZE * 5 // 8)
        face = Path(path).stem
        for cp in sorted(cmap(path)):
            name, category = names.get(cp, ("", ""))
            if not (category.startswith("L") and " LETTER " in f" {name} " or category == "Nd") \
                    or not any(a <= cp <= b for a, b in chosen):
                continue
            if not glyph_file(file := images / f"U+{cp:04X}-{face}.png", chr(cp), font):
                blank += 1
                continue
            entries.append(Entry(str(file), (name.lower(),), kind(name), group=f"U+{cp:04X}"))
    origin = Origin("fonts-noto-core, unicode-data", LICENCE, NOTO)
    return build_catalog("letters", entries, out, origin, heldout=heldout, seed=seed, image_size=SIZE,
                         filter_cfg=names_filter(0), engine=engine, samples_per_shard=samples_per_shard,
                         progress=progress, extra={"blank_glyphs": blank, "faces": len(fonts)})
