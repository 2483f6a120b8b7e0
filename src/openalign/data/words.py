"""The words of a text, for the text rules (3..20 words, rare terms): whitespace separates them in most languages;
Chinese, Japanese and Thai are written without spaces, and each has its own segmenter, whose dictionary ships in
its package (no download at run time): jieba for Chinese, fugashi (MeCab) with unidic-lite for Japanese, PyThaiNLP's
newmm for Thai. Splitting such a text on spaces counts it as one word, and `min_words=3` would drop every one.

    words("東京タワーの夜景", "ja")  ->  ["東京", "タワー", "の", "夜景"]
    segment(["東京タワーの夜景", "a red bicycle"], ["ja", "en"])  ->  ["東京 タワー の 夜景", None]

Tokens without a letter or a digit (punctuation, symbols, spaces) are not words.
"""

from __future__ import annotations

import logging
import os
import re
from functools import cache
from pathlib import Path
from collections.abc import Callable

from openalign.config import ConfigError

__all__ = ["SEGMENTED", "check_segmenters", "segment", "words"]

SEGMENTED = ("zh", "ja", "th")  # the languages written without spaces between words, each with its segmenter
PACKAGES = {"zh": ("jieba",), "ja": ("fugashi", "unidic_lite"), "th": ("pythainlp",)}
WORD = re.compile(r"\w")


def check_segmenters() -> None:
    """One sentence where a segmenter's package is missing."""
    import importlib.util

    missing = [name for names in PACKAGES.values() for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"segmenting Chinese, Japanese and Thai texts into words needs {', '.join(missing)}: "
                          "pip install 'openalign[words]' (or give --no-words: such texts then count as one word)")


@cache
def segmenter(language: str) -> Callable[[str], list[str]]:
    """The tokens of a text in `language` (one of SEGMENTED), loaded once a process."""
    check_segmenters()
    if language == "zh":
        import jieba

        jieba.setLogLevel(logging.WARNING)
        tokenizer = jieba.Tokenizer()
        # its prefix dictionary is cached where only this user writes, not in the shared temporary folder
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "openalign" / "jieba"
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        tokenizer.tmp_dir = str(cache)
        return tokenizer.lcut
    if language == "ja":
        import fugashi

        tagger = fugashi.Tagger()  # unidic-lite's dictionary
        return lambda text: [word.surface for word in tagger(text)]
    if language == "th":
        from pythainlp.tokenize import word_tokenize

        return lambda text: word_tokenize(text, engine="newmm", keep_whitespace=False)
    raise ValueError(f"no segmenter for {language!r}")


def words(text: str, language: str | None) -> list[str]:
    """The words of `text` in `language`: its segmenter's tokens for SEGMENTED languages, else split on whitespace;
    tokens without a letter or a digit left out."""
    tokens = segmenter(language)(text) if language in SEGMENTED else text.split()
    return [token for token in tokens if WORD.search(token)]


def segment(texts: list[str], languages: list[str | None]) -> list[str | None]:
    """Each text's words joined by single spaces where its language is segmented, else None (its words are its
    whitespace-separated ones: the rules split `coalesce(words, text)`). Each distinct (text, language) once."""
    found: dict[tuple[str, str], str] = {}
    out: list[str | None] = []
    for text, language in zip(texts, languages):
        if language not in SEGMENTED:
            out.append(None)
            continue
        key = (text, language)
        if key not in found:
            found[key] = " ".join(words(text, language))
        out.append(found[key])
    return out
