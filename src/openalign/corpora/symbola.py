"""Built-in corpus `symbola`: the emoji drawn as black line art by the Symbola font, with their CLDR names.

The emoji corpus draws each emoji once, in Noto Color Emoji's cartoon style; a model trained on it learns that
style as much as the concepts. Symbola (George Douros; fonts-symbola) draws 1,188 of the same emoji as monochrome
line drawings: a horse's head in ink, a bee with its veins, a dog standing. Each emoji that both fonts draw is
rendered black on white with its CLDR short name in each of `languages` ("gorilla"; unicode-cldr-core, as the emoji
corpus reads it) and its Unicode name as words ("gorilla", "face with tears of joy"), so the same names now come with
two styles. Its label for zero-shot evaluation is the emoji's group in Unicode's emoji-test.txt ("Animals & Nature",
"Food & Drink", "Objects"; unicode-data).

The rendered images are written under DIR/images/ once, then go through the pipeline (corpora/catalog.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from PIL import ImageFont
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog, names_filter
from openalign.corpora.symbols import (DEFAULT_CLDR, DEFAULT_EMOJI_FONT, DEFAULT_UNICODE, SIZE, cldr_names, cmap,
                                       glyph_file, read_names)

__all__ = ["DEFAULT_FONT", "build", "emoji_groups"]

DEFAULT_FONT = "/usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf"
LICENCE = ("Symbola: \"free for any use; they may be opened, edited, modified, regenerated, packaged and "
           "redistributed\" (George Douros; Debian's copyright file of fonts-symbola); the names: Unicode's licence "
           "(unicode-data, unicode-cldr-core)")
ENTRY = re.compile(r"^([0-9A-F]{4,6})(?: FE0F)?\s*;\s*fully-qualified\b")


def emoji_groups(unicode_dir: Path) -> dict[int, str]:
    """{code point: its group ("Animals & Nature")} of emoji-test.txt's single-code-point emoji."""
    path = unicode_dir / "emoji" / "emoji-test.txt"
    if not path.is_file():
        raise ConfigError(f"Unicode's emoji list not found at {path}; install it with `apt-get install unicode-data` "
                          "or pass --unicode-path DIR")
    out, group = {}, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# group:"):
            group = line.partition(":")[2].strip()
        elif match := ENTRY.match(line):
            out.setdefault(int(match.group(1), 16), group)
    return out


def build(out: Path, font_path: str = DEFAULT_FONT, emoji_font: str = DEFAULT_EMOJI_FONT,
          unicode_path: str = DEFAULT_UNICODE, cldr_path: str = DEFAULT_CLDR, languages: tuple[str, ...] = ("en",),
          heldout: float = 0.1, seed: int = 0, engine: str = "local", samples_per_shard: int = 1000,
          progress: bool = True) -> dict:
    """Render the emoji both fonts draw, in Symbola, into `out/images/` and ingest, filter and shard them into
    `out`. The paper's filters, but for the three-word minimum (a CLDR name is often one word: "gorilla")."""
    out = Path(out)
    if not Path(font_path).is_file():
        raise ConfigError(f"the Symbola font not found at {font_path}; install it with `apt-get install "
                          "fonts-symbola` or pass --font PATH")
    if not Path(emoji_font).is_file():
        raise ConfigError(f"Noto Color Emoji not found at {emoji_font} (it says which characters are emoji); install "
                          "it with `apt-get install fonts-noto-color-emoji` or pass --emoji-font PATH")
    names, groups = read_names(Path(unicode_path)), emoji_groups(Path(unicode_path))
    short = cldr_names(Path(cldr_path), tuple(languages))
    images = out.resolve() / "images"  # absolute: the table's relative paths are read from its own folder
    images.mkdir(parents=True, exist_ok=True)
    font = ImageFont.truetype(font_path, size=SIZE * 5 // 8)
    drawn = sorted(cmap(font_path) & cmap(emoji_font) & set(groups))
    entries, blank = [], 0
    for cp in tqdm(drawn, desc="render symbola", unit="glyph", disable=not progress):
        texts = tuple(short.get(chr(cp), {}).get(language) for language in languages)
        texts = tuple(t for t in (*texts, names.get(cp, ("", ""))[0].lower()) if t)
        if not texts:
            continue
        if not glyph_file(file := images / f"U+{cp:04X}.png", chr(cp), font):
            blank += 1
            continue
        entries.append(Entry(str(file), texts, groups[cp]))
    origin = Origin("fonts-symbola, unicode-data, unicode-cldr-core", LICENCE, font_path)
    return build_catalog("symbola", entries, out, origin, heldout=heldout, seed=seed, image_size=SIZE,
                         filter_cfg=names_filter(0), engine=engine, samples_per_shard=samples_per_shard,
                         progress=progress, extra={"blank_glyphs": blank})
