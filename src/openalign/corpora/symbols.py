"""Built-in corpus `symbols`: Unicode's symbols drawn by the Noto fonts, with their Unicode and CLDR names.

Every symbol (general category S: arrows, mathematical operators, chess pieces, musical notes, dingbats, ...) that
the Noto symbol fonts of fonts-noto-core draw, except those the emoji font draws (they are the emoji corpus's), is
rendered black on white. Its alt-texts are its Unicode name as words ("rightwards arrow with hook", named by the
Unicode editors; unicode-data's UnicodeData.txt) and, where CLDR has one, its short name in each of `languages`
("right-pointing arrow"; unicode-cldr-core, as the emoji corpus reads it). Its label for zero-shot evaluation is
its Unicode block ("Arrows", "Mathematical Operators", "Chess Symbols").

The rendered images are written under DIR/images/ once, then go through the pipeline (corpora/catalog.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog, names_filter

__all__ = ["DEFAULT_FONTS", "build", "check_fonts", "cmap", "glyph_file", "read_blocks", "read_names", "render"]

NOTO = "/usr/share/fonts/truetype/noto/"
DEFAULT_FONTS = tuple(NOTO + f for f in ("NotoSansSymbols-Regular.ttf", "NotoSansSymbols2-Regular.ttf",
                                         "NotoSansMath-Regular.ttf", "NotoMusic-Regular.ttf"))
DEFAULT_EMOJI_FONT = NOTO + "NotoColorEmoji.ttf"
DEFAULT_UNICODE = "/usr/share/unicode"
DEFAULT_CLDR = "/usr/share/unicode/cldr/common"
LICENCE = ("OFL-1.1 (the Noto fonts, Debian's copyright file of fonts-noto-core); the names: Unicode's licence "
           "(unicode-data, unicode-cldr-core)")
SIZE = 128  # the rendered image's side in pixels


def read_names(unicode_dir: Path) -> dict[int, tuple[str, str]]:
    """{code point: (name, general category)} of UnicodeData.txt's named characters (ranges and controls left out)."""
    path = unicode_dir / "UnicodeData.txt"
    if not path.is_file():
        raise ConfigError(f"Unicode's character names not found at {path}; install them with `apt-get install "
                          "unicode-data` or pass --unicode-path DIR")
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split(";")
        if len(fields) > 2 and not fields[1].startswith("<"):
            out[int(fields[0], 16)] = (fields[1], fields[2])
    return out


def read_blocks(unicode_dir: Path) -> list[tuple[int, int, str]]:
    """Blocks.txt's (first, last, block name)."""
    out = []
    for line in (unicode_dir / "Blocks.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if ";" in line:
            span, name = line.split(";")
            first, last = span.split("..")
            out.append((int(first, 16), int(last, 16), name.strip()))
    return out


def cldr_names(cldr: Path, languages: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """{character: {language: CLDR short name}} from CLDR's annotations (a language CLDR lacks is left out)."""
    out: dict[str, dict[str, str]] = {}
    for language in languages:
        path = cldr / "annotations" / f"{language}.xml"
        if not path.is_file():
            continue
        for node in ET.parse(path).getroot().iter("annotation"):
            text = (node.text or "").strip()
            if node.get("type") == "tts" and node.get("cp") and text and text != "↑↑↑":
                out.setdefault(node.get("cp"), {})[language] = text
    return out


def render(char: str, font: ImageFont.FreeTypeFont) -> Image.Image | None:
    """The glyph black on white, centred on a SIZE x SIZE square; None when it draws nothing."""
    left, top, right, bottom = font.getbbox(char)
    if right - left < 2 and bottom - top < 2:
        return None
    image = Image.new("L", (SIZE, SIZE), 255)
    ImageDraw.Draw(image).text(((SIZE - (right - left)) / 2 - left, (SIZE - (bottom - top)) / 2 - top), char,
                               font=font, fill=0)
    return image if image.getextrema()[0] < 128 else None


def check_fonts(fonts: tuple[str, ...]) -> None:
    """A ConfigError naming the first of the Noto `fonts` that is not installed."""
    missing = [f for f in fonts if not Path(f).is_file()]
    if missing:
        raise ConfigError(f"font not found: {missing[0]}; install the Noto fonts with `apt-get install "
                          "fonts-noto-core` or pass --fonts PATH,PATH")


def glyph_file(file: Path, char: str, font: ImageFont.FreeTypeFont) -> bool:
    """Whether `file` holds the glyph of `char` (`render`ed and saved the first time); False when it draws nothing."""
    if file.is_file():
        return True
    image = render(char, font)
    if image is None:
        return False
    image.save(file)
    return True


def cmap(path: str) -> set[int]:
    from fontTools.ttLib import TTFont

    with TTFont(path, lazy=True) as font:
        return set(font.getBestCmap() or {})


def build(out: Path, fonts: tuple[str, ...] = DEFAULT_FONTS, emoji_font: str = DEFAULT_EMOJI_FONT,
          unicode_path: str = DEFAULT_UNICODE, cldr_path: str = DEFAULT_CLDR, languages: tuple[str, ...] = ("en",),
          heldout: float = 0.1, seed: int = 0, engine: str = "local", samples_per_shard: int = 1000,
          progress: bool = True) -> dict:
    """Render the fonts' symbols into `out/images/` and ingest, filter and shard them into `out`. The paper's
    filters, but for the three-word minimum (a Unicode name is often two words: "black star")."""
    out = Path(out)
    check_fonts(fonts)
    names, blocks = read_names(Path(unicode_path)), read_blocks(Path(unicode_path))
    emoji = cmap(emoji_font) if Path(emoji_font).is_file() else set()
    short = cldr_names(Path(cldr_path), tuple(languages))
    images = out.resolve() / "images"  # absolute: the table's relative paths are read from its own folder
    images.mkdir(parents=True, exist_ok=True)
    entries, seen, blank = [], set(emoji), 0
    for path in tqdm(fonts, desc="render symbols", unit="font", disable=not progress):
        font = ImageFont.truetype(path, size=SIZE * 5 // 8)
        for cp in sorted(cmap(path) - seen):
            name, category = names.get(cp, ("", ""))
            if not category.startswith("S"):
                continue
            seen.add(cp)
            file = images / f"U+{cp:04X}.png"
            if not glyph_file(file, chr(cp), font):
                blank += 1
                continue
            block = next((b for first, last, b in blocks if first <= cp <= last), "")
            texts = (name.lower(), *(t for language, t in short.get(chr(cp), {}).items() if language in languages))
            entries.append(Entry(str(file), texts, block))
    cfg = names_filter(0)
    origin = Origin("fonts-noto-core, unicode-data, unicode-cldr-core", LICENCE, NOTO)
    return build_catalog("symbols", entries, out, origin, heldout=heldout, seed=seed, image_size=SIZE, filter_cfg=cfg,
                         engine=engine, samples_per_shard=samples_per_shard, progress=progress,
                         extra={"blank_glyphs": blank, "emoji_left_out": len(emoji)})
