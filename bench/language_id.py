"""Language identification on short texts: accuracy per language and texts/s per core of extract's identifier
(data/language.py: fastText lid.176, the script deciding among zh, ja and ko), and of the alternatives it was chosen
among, each in its own venv, on the same texts: the built-in emoji corpus's CLDR names and keyword lists of 3+ words
(data/words.py) in 18 languages.

    .venv/bin/python bench/language_id.py [--others-python /tmp/lid/bin/python]

where /tmp/lid is `python3 -m venv /tmp/lid && /tmp/lid/bin/pip install lingua-language-detector==2.1.1
py3langid==0.4.0 pycld2==0.42`. Writes the table into docs/pipeline.md (the `language-id` block).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_section

LANGUAGES = ["en", "de", "fr", "es", "it", "pt", "nl", "ru", "pl", "cs", "ja", "zh", "ko", "ar", "tr", "vi", "th", "hi"]

OTHERS = """
import json, sys, time
texts = json.load(open(sys.argv[1]))
out = {}
def measure(name, fn):
    start, right, n = time.perf_counter(), {}, 0
    for lang, items in texts.items():
        right[lang] = sum(fn(t) == lang for t in items) / len(items)
        n += len(items)
    out[name] = {"accuracy": right, "rate": n / (time.perf_counter() - start)}
try:
    from lingua import LanguageDetectorBuilder
    lingua = LanguageDetectorBuilder.from_all_languages().build()
    def by_lingua(t):
        found = lingua.detect_language_of(t)
        return found.iso_code_639_1.name.lower() if found else "und"
    measure("lingua 2.1.1 (all languages, high accuracy)", by_lingua)
except ImportError:
    pass
try:
    import py3langid
    measure("py3langid 0.4.0", lambda t: py3langid.classify(t)[0])
except ImportError:
    pass
try:
    import pycld2
    def by_cld2(t):
        try:
            return pycld2.detect(t)[2][0][1].split("-")[0]
        except Exception:
            return "und"
    measure("pycld2 0.42", by_cld2)
except ImportError:
    pass
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others-python", help="a venv's python with lingua, py3langid and pycld2, to compare")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from openalign.corpora import emoji
    from openalign.data.language import identify

    texts = emoji.texts_by_language(Path(emoji.DEFAULT_CLDR), LANGUAGES, min_words=3)
    identify(["warm up"])
    start, right = time.perf_counter(), {}
    for lang, items in texts.items():
        found, _ = identify(items)
        right[lang] = sum(f == lang for f in found) / len(items)
    results = {"openalign (fastText lid.176 + script for zh/ja/ko)": {
        "accuracy": right, "rate": sum(map(len, texts.values())) / (time.perf_counter() - start)}}
    if args.others_python:
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(texts, f)
            f.flush()
            done = subprocess.run([args.others_python, "-c", OTHERS, f.name], capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
        results |= json.loads(done.stdout.strip().splitlines()[-1])
    head = "| identifier | texts/s per core | " + " | ".join(LANGUAGES) + " |"
    sizes = [len(items) for items in texts.values()]
    rows = [f"Accuracy on the emoji corpus's CLDR names and keyword lists of 3+ words ({min(sizes):,}-{max(sizes):,}"
            f" texts a language; Chinese, Japanese and Thai words by their "
            "segmenters), one thread:", "", head, "|" + "---|" * (len(LANGUAGES) + 2)]
    for name, found in results.items():
        cells = " | ".join(f"{found['accuracy'][lang]:.3f}" for lang in LANGUAGES)
        rows.append(f"| {name} | {found['rate']:,.0f} | {cells} |")
    others = " --others-python PY" if args.others_python else ""
    rows += ["", f"Command: `.venv/bin/python bench/language_id.py{others}` (the alternatives in their own venv: the "
             "script's docstring).", ""]
    print("\n".join(rows))
    write_section("language-id", "\n".join(rows), path=ROOT / "docs" / "pipeline.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
