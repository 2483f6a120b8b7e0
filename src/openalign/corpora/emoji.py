"""Built-in corpus `emoji`: Noto Color Emoji glyphs paired with Unicode CLDR names and keywords.

~3,700 real images with human-written texts in many languages (Debian packages fonts-noto-color-emoji
and unicode-cldr-core), made web-like by alt-text noise at a configurable rate: file names,
boilerplate strings shared by many images, partial keywords and wrong captions.

The held-out split contains whole *families*: every variant of one base emoji (skin tones, genders,
hair styles, man/woman/person forms) falls on the same side. A random split leaks: a sibling variant in
training makes a held-out emoji trivially retrievable (a prototype measured R@10 0.995 that way).
"""

from __future__ import annotations

import random
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.data.seeds import stable_seed
from openalign.data.tars import ShardWriter, encode_image

DEFAULT_FONT = "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf"
DEFAULT_CLDR = "/usr/share/unicode/cldr/common"
GLYPH_SIZE = 109  # Noto Color Emoji is a bitmap font with 136x128 glyphs at size 109
IMAGE_SIZE = 136

SKIN_TONES = {chr(c) for c in range(0x1F3FB, 0x1F400)}
HAIR = {chr(c) for c in range(0x1F9B0, 0x1F9B4)}
GENDER = {"\u2640", "\u2642"}
VARIATION = {"\ufe0f", "\ufe0e"}
ZWJ = "\u200d"
PERSON_FORMS = {"\U0001F468": "\U0001F9D1", "\U0001F469": "\U0001F9D1", "\U0001F466": "\U0001F9D2",
                "\U0001F467": "\U0001F9D2", "\U0001F474": "\U0001F9D3", "\U0001F475": "\U0001F9D3"}
GENDER_WORDS = re.compile(r"\b(man|woman|men|women|person|people|boy|girl|child|old)\b")

BOILERPLATE = ("image", "click to enlarge", "free download", "stock illustration", "icon", "logo design vector",
               "view image", "photo", "thumbnail", "untitled", "emoji icon set", "see more", "no description")
NOISE_KINDS = ("filename", "boilerplate", "partial", "wrong")


@dataclass
class Emoji:
    cp: str
    names: dict[str, str] = field(default_factory=dict)  # language -> CLDR tts name
    keywords: dict[str, list[str]] = field(default_factory=dict)  # language -> CLDR keywords
    family: str = ""


def _missing(what: str, path: str, package: str, option: str) -> ConfigError:
    return ConfigError(f"{what} not found at {path}; install it with `apt-get install {package}` or pass {option} PATH")


def read_cldr(cldr: Path, languages: list[str]) -> dict[str, Emoji]:
    emoji: dict[str, Emoji] = {}
    for lang in languages:
        files = [cldr / "annotations" / f"{lang}.xml", cldr / "annotationsDerived" / f"{lang}.xml"]
        if not files[0].is_file():
            if lang == "en":
                raise _missing("Unicode CLDR annotations", str(files[0]), "unicode-cldr-core", "--cldr")
            raise ConfigError(f"CLDR has no annotations for language {lang!r} (no {files[0]})")
        for path in files:
            if not path.is_file():
                continue
            for node in ET.parse(path).getroot().iter("annotation"):
                cp, text = node.get("cp"), (node.text or "").strip()
                if not cp or not text or text == "↑↑↑":  # ↑↑↑ = inherited, no own value
                    continue
                entry = emoji.setdefault(cp, Emoji(cp))
                if node.get("type") == "tts":
                    entry.names[lang] = text
                else:
                    entry.keywords[lang] = [k.strip() for k in text.split("|") if k.strip()]
    return {cp: e for cp, e in emoji.items() if "en" in e.names}


def family_keys(e: Emoji) -> list[str]:
    """Keys shared by all variants of one base emoji; emoji sharing any key are one family."""
    base = "".join(PERSON_FORMS.get(c, c) for c in e.cp if c not in SKIN_TONES | HAIR | GENDER | VARIATION)
    base = base.strip(ZWJ).replace(ZWJ + ZWJ, ZWJ)
    keys = ["cp:" + base]
    name = e.names["en"]
    head = name.split(":")[0]
    if ":" in name and head not in ("flag", "keycap"):  # "man: red hair", "thumbs up: dark skin tone"
        keys.append("name:" + GENDER_WORDS.sub("", head).strip())
    stripped = GENDER_WORDS.sub("", head).strip()
    if stripped != head and stripped:  # "man health worker" ~ "woman health worker" ~ "health worker"
        keys.append("name:" + stripped)
    return keys


def assign_families(emoji: list[Emoji]) -> None:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in emoji:
        keys = family_keys(e)
        for k in keys[1:]:
            parent[find(k)] = find(keys[0])
    for e in emoji:
        e.family = find(family_keys(e)[0])


def render(cp: str, font: ImageFont.FreeTypeFont) -> Image.Image | None:
    """The glyph on white, or None when the font has no single color glyph for this sequence."""
    left, top, right, bottom = font.getbbox(cp)
    if bottom - top < 64 or right - left != IMAGE_SIZE:  # missing glyph, or several glyphs side by side
        return None
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), "white")
    ImageDraw.Draw(image).text((0, (IMAGE_SIZE - (bottom - top)) // 2), cp, font=font, embedded_color=True)
    return image


def augmented(image: Image.Image, rng: random.Random) -> Image.Image:
    """Another view of a glyph: scaled to 60-95%, shifted, on a light tinted background."""
    size = round(IMAGE_SIZE * rng.uniform(0.6, 0.95))
    glyph = image.resize((size, size), Image.Resampling.LANCZOS)
    mask = Image.eval(glyph.convert("L"), lambda v: 255 if v < 250 else 0)  # the glyph, not its white ground
    view = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), tuple(rng.randint(200, 255) for _ in range(3)))
    view.paste(glyph, (rng.randint(0, IMAGE_SIZE - size), rng.randint(0, IMAGE_SIZE - size)), mask)
    return view


def clean_texts(e: Emoji, languages: list[str]) -> list[str]:
    texts = []
    for lang in languages:
        if lang in e.names:
            texts.append(e.names[lang])
        if e.keywords.get(lang):
            texts.append(", ".join(e.keywords[lang]))
    return texts


def texts_by_language(cldr: Path, languages: list[str], min_words: int = 0) -> dict[str, list[str]]:
    """The corpus's clean texts (CLDR names, and keyword lists joined by commas) per language, each distinct text
    once, those of `min_words` or more words (data/words.py) alone: the texts language identification is measured
    on (docs/pipeline.md)."""
    from openalign.data.words import words

    catalog = read_cldr(Path(cldr), languages)
    found: dict[str, list[str]] = {}
    for lang in languages:
        texts = dict.fromkeys(t for e in catalog.values() for t in clean_texts(e, [lang]))
        found[lang] = [t for t in texts if len(words(t, lang)) >= min_words]
    return found


def noisy_text(kind: str, e: Emoji, others: list[Emoji], rng: random.Random) -> str:
    if kind == "filename":
        code = "_".join(f"{ord(c):x}" for c in e.cp if c not in VARIATION)
        return rng.choice([f"emoji_u{code}.png", f"IMG_{rng.randint(1000, 9999)}.JPG",
                           f"DSC{rng.randint(0, 99999):05d}.jpg", f"{rng.getrandbits(32):08x}.png"])
    if kind == "boilerplate":
        return rng.choice(BOILERPLATE)
    if kind == "partial":
        keywords = e.keywords.get("en") or [e.names["en"]]
        return rng.choice(keywords)
    other = rng.choice(others)  # wrong: another emoji's caption
    return rng.choice(clean_texts(other, ["en"]))


def build(out: Path, languages: tuple[str, ...] = ("en",), noise: float = 0.2, heldout: float = 0.1, seed: int = 0,
          font_path: str = DEFAULT_FONT, cldr_path: str = DEFAULT_CLDR, samples_per_shard: int = 400,
          limit: int = 0, copies: int = 1, eval_languages: tuple[str, ...] = (), fraction: float = 1.0,
          progress: bool = True) -> dict:
    """Render the corpus into `out/train` and `out/eval` shards; returns the summary (also in manifests).

    Training texts are in `languages`; the held-out split also carries each emoji's clean texts per
    language of `languages` + `eval_languages` in its metadata (`texts_by_language`), for per-language
    retrieval (`--task multilingual`), including languages never trained on.

    `fraction` < 1 keeps that share of the training emoji (a stable random sample; the held-out split is
    unchanged), for the model-vs-data study.

    `copies` > 1 scales the training split: each emoji also appears as copies - 1 augmented views
    (scaled, shifted, on a tinted background), each with its own independently noised texts — more
    (noisy) pairs from the same sources, for the noise-vs-scale study. Two views of one emoji may meet in
    a batch, as near-duplicates do in web data. The held-out split is never copied."""
    if not 0.0 <= noise <= 1.0 or not 0.0 < heldout < 1.0:
        raise ConfigError(f"--noise must be in [0, 1] and --heldout in (0, 1), not {noise} and {heldout}")
    if copies < 1 or not 0.0 < fraction <= 1.0:
        raise ConfigError(f"copies must be at least 1 and fraction in (0, 1], not {copies} and {fraction}")
    if not Path(font_path).is_file():
        raise _missing("Noto Color Emoji font", font_path, "fonts-noto-color-emoji", "--font")
    languages = list(dict.fromkeys(["en", *languages]))
    all_languages = list(dict.fromkeys([*languages, *eval_languages]))
    catalog = read_cldr(Path(cldr_path), all_languages)
    font = ImageFont.truetype(font_path, GLYPH_SIZE, layout_engine=ImageFont.Layout.RAQM)
    images: dict[str, Image.Image] = {}
    for cp in tqdm(sorted(catalog), desc="render emoji", unit="glyph", leave=False, disable=not progress):
        image = render(cp, font)
        if image is not None:
            images[cp] = image
        if limit and len(images) >= limit:
            break
    emoji = [catalog[cp] for cp in images]
    assign_families(emoji)
    # A family is held out as a whole, decided by a hash of its key: stable as CLDR grows.
    is_heldout = {e.cp: stable_seed(seed, "family", e.family) % 10_000 < heldout * 10_000 for e in emoji}
    train = [e for e in emoji if not is_heldout[e.cp]
             and (fraction == 1.0 or stable_seed(seed, "fraction", e.cp) % 10_000 < fraction * 10_000)]
    rng = random.Random(seed)
    info = {"corpus": "emoji", "languages": languages, "eval_languages": all_languages, "noise": noise,
            "heldout": heldout, "seed": seed, "fraction": fraction}
    noise_counts = dict.fromkeys(NOISE_KINDS, 0)
    info["copies"] = copies
    writer = ShardWriter(Path(out) / "train", "emoji-train", samples_per_shard, info | {"split": "train"})
    views = [(e, c) for e in train for c in range(copies)]
    for e, copy in rng.sample(views, len(views)):  # shuffled, so every shard is a fair sample
        texts, kinds = [], []
        for text in clean_texts(e, languages):
            kind = rng.choice(NOISE_KINDS) if rng.random() < noise else "clean"
            if kind != "clean":
                noise_counts[kind] += 1
                text = noisy_text(kind, e, train, rng)
            texts.append(text)
            kinds.append(kind)
        meta = {"texts": texts, "noise": kinds, "name": e.names["en"], "family": e.family, "cp": e.cp}
        image = images[e.cp] if copy == 0 else augmented(images[e.cp], random.Random(stable_seed(seed, e.cp, copy)))
        writer.write(_key(e) + (f"_v{copy}" if copy else ""), encode_image(image), "jpg", texts[0],
                     meta | {"view": copy})
    train_manifest = writer.close()
    writer = ShardWriter(Path(out) / "eval", "emoji-eval", samples_per_shard, info | {"split": "eval"})
    for e in (e for e in emoji if is_heldout[e.cp]):
        texts = clean_texts(e, languages)
        by_language = {lang: t for lang in all_languages if (t := clean_texts(e, [lang]))}
        meta = {"texts": texts, "name": e.names["en"], "family": e.family, "cp": e.cp, "names": e.names,
                "texts_by_language": by_language}
        writer.write(_key(e), encode_image(images[e.cp]), "jpg", texts[0], meta)
    eval_manifest = writer.close()
    return {
        "out": str(out), "train_images": train_manifest["n_samples"], "eval_images": eval_manifest["n_samples"],
        "families": len({e.family for e in emoji}),
        "heldout_families": len({e.family for e in emoji if is_heldout[e.cp]}),
        "skipped_no_glyph": len(catalog) - len(emoji) if not limit else None, "noise_texts": noise_counts,
        "languages": languages, "eval_languages": all_languages,
    }


def _key(e: Emoji) -> str:
    return "u" + "_".join(f"{ord(c):x}" for c in e.cp)
