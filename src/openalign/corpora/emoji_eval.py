"""The built-in emoji corpus written out in every public evaluation layout, so each `openalign eval`
task can be run offline on a model trained on it (`openalign corpus emoji-eval --out DIR`).

From the corpus' held-out families (never seen in training) and, for fine-tuned retrieval, its
training images:

    images/*.jpg                      every image, named by shard key
    karpathy.json                     Karpathy layout: split train (training images, their noisy
                                      alt-texts) and test (held-out, clean CLDR name + keywords)
    captions.csv                      the test split as a caption table (image, caption)
    classes/{train,test}/LABEL/*.jpg  held-out families with >= 2 variants (skin tones, genders, hair)
                                      as classes, variants dealt alternately to train and test;
    classnames.txt                    `label,name` (the family's English CLDR name)
    vtab/emoji-families/{train,test}  the same classes as one VTAB-style task
    multi30k/test.txt + test.LANG     CLDR names of the held-out emoji per language (Multi30k layout)
    cxc/{sts,sis,sits}_test.csv       CxC-layout ratings derived from the corpus structure, NOT human
                                      judgments: 5 same emoji, 4 same family, 0 unrelated
    simlex.txt, sts.csv               SimLex-999 / STS layouts, scored the same structural way (keywords
                                      of one emoji 7 vs of two unrelated emoji 1, on SimLex's 0-10)

CLDR has no human similarity judgments: the structural scores exercise the tasks end to end and
say whether a model groups what the corpus groups; they are not comparable to published numbers.
"""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path

from tqdm import tqdm

from openalign.config import ConfigError
from openalign.corpora import emoji as emoji_lib
from openalign.data import tars

LANGUAGES = ("en", "de", "fr", "cs")  # Multi30k's four


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "x"


def _read(split_dir: Path) -> list[dict]:
    if not (split_dir / tars.MANIFEST).is_file():
        raise ConfigError(f"no emoji corpus shards in {split_dir}; build it with `openalign corpus emoji --out DIR`")
    rows = []
    for sample in tars.read_samples(tars.list_shards(str(split_dir))):
        meta = tars.sample_meta(sample)
        rows.append({"key": sample["__key__"], "image": tars.image_bytes(sample),
                     "texts": tars.sample_texts(sample), "name": meta.get("name", ""),
                     "family": meta.get("family", ""), "cp": meta.get("cp", "")})
    return rows


def family_names(rows: list[dict]) -> dict[str, str]:
    """A readable name per family: its root emoji's name where present, else its shortest member name."""
    names: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: len(r["name"])):
        root = row["family"].removeprefix("cp:")
        if row["cp"].replace("\ufe0f", "") == root.replace("\ufe0f", ""):
            names[row["family"]] = row["name"]
        names.setdefault(row["family"], row["name"])
    return names


def _write_csv(path: Path, header: list[str], rows: list[tuple]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def export(corpus: Path, out: Path, cldr: str = emoji_lib.DEFAULT_CLDR, seed: int = 0, progress: bool = True) -> dict:
    train, test = _read(corpus / "train"), _read(corpus / "eval")
    (out / "images").mkdir(parents=True, exist_ok=True)
    for row in tqdm(train + test, desc="write images", unit="img", disable=not progress, leave=False):
        (out / "images" / f"{row['key']}.jpg").write_bytes(row["image"])

    entries, sid = [], {}  # sid: shard key -> the sentids of its texts
    for split, rows in (("train", train), ("test", test)):
        for row in rows:
            first = sum(len(v) for v in sid.values())
            sid[row["key"]] = list(range(first, first + len(row["texts"])))
            sentences = [{"raw": t, "sentid": i} for t, i in zip(row["texts"], sid[row["key"]])]
            entries.append({"filename": f"{row['key']}.jpg", "filepath": "", "split": split, "sentences": sentences})
    (out / "karpathy.json").write_text(json.dumps({"images": entries, "dataset": "emoji"}, ensure_ascii=False))
    _write_csv(out / "captions.csv", ["image", "caption"], [(f"{r['key']}.jpg", t) for r in test for t in r["texts"]])

    # classification: held-out families with >= 2 variants, variants dealt alternately to train / test
    names = family_names(test)
    members: dict[str, list[dict]] = {}
    for row in test:
        members.setdefault(row["family"], []).append(row)
    classes = {f: rows for f, rows in members.items() if len(rows) >= 2}
    labels = {f: _slug(names[f]) for f in classes}
    for root in (out / "classes", out / "vtab" / "emoji-families"):
        for family, rows in classes.items():
            for i, row in enumerate(rows):
                target = root / ("train" if i % 2 == 0 else "test") / labels[family]
                target.mkdir(parents=True, exist_ok=True)
                (target / f"{row['key']}.jpg").write_bytes(row["image"])
    (out / "classnames.txt").write_text("".join(f"{labels[f]},{names[f]}\n" for f in sorted(classes, key=labels.get)))

    # multilingual: CLDR names of the held-out emoji in Multi30k's languages
    catalog = emoji_lib.read_cldr(Path(cldr), list(LANGUAGES))
    (out / "multi30k").mkdir(exist_ok=True)
    (out / "multi30k" / "test.txt").write_text("".join(f"{r['key']}.jpg\n" for r in test))
    for lang in LANGUAGES:
        lines = [catalog[r["cp"]].names.get(lang, "") if r["cp"] in catalog else "" for r in test]
        (out / "multi30k" / f"test.{lang}").write_text("".join(f"{line}\n" for line in lines))

    # CxC-layout ratings from the corpus structure (not human judgments)
    rng = random.Random(seed)
    index = {r["key"]: i for i, r in enumerate(test)}
    image_name = lambda i: f"{test[i]['key']}.jpg"  # noqa: E731
    caption = lambda i, j=0: f"emoji:sentid:{sid[test[i]['key']][j]}"  # noqa: E731
    sts, sis, sits = [], [], []
    for family, rows in members.items():
        ids = [index[r["key"]] for r in rows]
        for i in ids:
            if len(test[i]["texts"]) > 1:
                sts.append((caption(i, 0), caption(i, 1), 5.0, "same_emoji"))
            other = rng.randrange(len(test))
            if test[other]["family"] != family:
                sts.append((caption(i), caption(other), 0.0, "random"))
                sis.append((image_name(i), image_name(other), 0.0, "random"))
                sits.append((caption(other), image_name(i), 0.0, "random"))
            sits.append((caption(i), image_name(i), 5.0, "same_emoji"))
        for a, b in zip(ids, ids[1:]):
            sts.append((caption(a), caption(b), 4.0, "same_family"))
            sis.append((image_name(a), image_name(b), 4.0, "same_family"))
            sits.append((caption(a), image_name(b), 4.0, "same_family"))
    (out / "cxc").mkdir(exist_ok=True)
    _write_csv(out / "cxc" / "sts_test.csv", ["caption1", "caption2", "agg_score", "sampling_method"], sts)
    _write_csv(out / "cxc" / "sis_test.csv", ["image1", "image2", "agg_score", "sampling_method"], sis)
    _write_csv(out / "cxc" / "sits_test.csv", ["caption", "image", "agg_score", "sampling_method"], sits)
    # SimLex / STS layouts with the same structural scores
    words, sentences = [], []
    for row in test:
        e = catalog.get(row["cp"])
        single = [k for k in (e.keywords.get("en", []) if e else []) if " " not in k]
        other = test[rng.randrange(len(test))]
        other_e = catalog.get(other["cp"])
        other_single = [k for k in (other_e.keywords.get("en", []) if other_e else []) if " " not in k]
        if len(single) >= 2 and other["family"] != row["family"] and other_single:
            words.append((single[0], single[1], 7.0))
            words.append((single[0], other_single[0], 1.0))
        if len(row["texts"]) > 1:
            sentences.append((row["texts"][0], row["texts"][1], 5.0))
        if other["family"] != row["family"]:
            sentences.append((row["texts"][0], other["texts"][0], 0.0))
    for rows in members.values():
        sentences += [(a["texts"][0], b["texts"][0], 4.0) for a, b in zip(rows, rows[1:])]
    (out / "simlex.txt").write_text("word1\tword2\tSimLex999\n" + "".join(f"{a}\t{b}\t{v}\n" for a, b, v in words))
    _write_csv(out / "sts.csv", ["sentence1", "sentence2", "score"], sentences)
    summary = {"out": str(out), "train_images": len(train), "test_images": len(test), "classes": len(classes),
               "class_images": sum(len(r) for r in classes.values()), "languages": list(LANGUAGES),
               "cxc_pairs": {"sts": len(sts), "sis": len(sis), "sits": len(sits)}, "word_pairs": len(words),
               "sentence_pairs": len(sentences)}
    (out / "manifest.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
