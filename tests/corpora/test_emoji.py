from pathlib import Path

import pytest

from conftest import needs_emoji_data
from openalign.config import ConfigError
from openalign.corpora import emoji
from openalign.data import tars


def make(cp, name):
    return emoji.Emoji(cp, names={"en": name}, keywords={"en": [name]})


def test_variants_of_one_base_emoji_form_one_family():
    variants = [make("👍", "thumbs up"), make("👍🏽", "thumbs up: medium skin tone"),
                make("🧑‍⚕️", "health worker"), make("👩‍⚕️", "woman health worker"),
                make("👨🏿‍⚕️", "man health worker: dark skin tone"), make("🇩🇪", "flag: Germany"),
                make("🇫🇷", "flag: France")]
    emoji.assign_families(variants)
    fam = [e.family for e in variants]
    assert fam[0] == fam[1]
    assert fam[2] == fam[3] == fam[4]
    assert fam[5] != fam[6] and fam[0] != fam[2]  # flags are not one family


def test_missing_font_names_the_package(tmp_path):
    with pytest.raises(ConfigError, match="apt-get install fonts-noto-color-emoji"):
        emoji.build(tmp_path, font_path=str(tmp_path / "none.ttf"))


def test_bad_rates_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="--noise must be in"):
        emoji.build(tmp_path, noise=1.5)


@needs_emoji_data
def test_missing_cldr_names_the_package(tmp_path):
    with pytest.raises(ConfigError, match="unicode-cldr-core"):
        emoji.build(tmp_path, cldr_path=str(tmp_path))


@needs_emoji_data
def test_corpus_is_split_by_family_with_noisy_training_texts(tmp_path):
    summary = emoji.build(tmp_path, languages=("en", "de"), noise=0.5, heldout=0.3, limit=300)
    train = [tars.sample_meta(s) for s in tars.read_samples(tars.list_shards(str(tmp_path / "train")))]
    held = [tars.sample_meta(s) for s in tars.read_samples(tars.list_shards(str(tmp_path / "eval")))]
    assert len(train) + len(held) == 300 and summary["eval_images"] == len(held) > 0
    assert not {m["family"] for m in train} & {m["family"] for m in held}
    assert all(len(m["texts"]) == 4 for m in train)  # name + keywords in en and de
    kinds = {k for m in train for k in m["noise"]}
    assert kinds == {"clean", *emoji.NOISE_KINDS}
    assert all("noise" not in m for m in held)  # evaluation texts are the clean CLDR texts


@needs_emoji_data
def test_emoji_eval_export_writes_every_layout_consistently(tmp_path):
    import csv
    import json

    from openalign.corpora import emoji_eval
    from openalign.data.sources import karpathy_items, listing

    emoji.build(tmp_path / "corpus", heldout=0.5, limit=300)
    out = tmp_path / "formats"
    summary = emoji_eval.export(tmp_path / "corpus", out, progress=False)
    test = karpathy_items(out / "karpathy.json", out / "images", "test")
    train = karpathy_items(out / "karpathy.json", out / "images", "train")
    assert (len(train), len(test)) == (summary["train_images"], summary["test_images"])
    assert all(Path(item.path).is_file() for item in test + train)
    sentids = {i for item in test for i in item.caption_ids}
    all_ids = [i for item in test + train for i in item.caption_ids]
    assert len(set(all_ids)) == len(all_ids)  # unique
    # class folders: only families with >= 2 variants, dealt to both sides, named in classnames.txt
    labels = {item.label for item in listing(str(out / "classes" / "test"))}
    assert labels == {item.label for item in listing(str(out / "classes" / "train"))} and len(labels) == summary["classes"]
    assert {line.split(",")[0] for line in (out / "classnames.txt").read_text().splitlines()} == labels
    # Multi30k: one line per test image in each language
    names = (out / "multi30k" / "test.txt").read_text().splitlines()
    assert names == [Path(item.path).name for item in test]
    for lang in emoji_eval.LANGUAGES:
        assert len((out / "multi30k" / f"test.{lang}").read_text().splitlines()) == len(names)
    # CxC-style ratings refer only to test-split captions and images
    for kind, first, second in (("sts", "caption1", "caption2"), ("sis", "image1", "image2"), ("sits", "caption", "image")):
        with open(out / "cxc" / f"{kind}_test.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows
        for row in rows:
            for column in (first, second):
                ref = row[column]
                assert (ref.rsplit(":", 1)[-1] in sentids) if column.startswith("caption") else ref in names
    assert json.loads((out / "manifest.json").read_text()) == summary
    header, *pairs = (out / "simlex.txt").read_text().splitlines()
    assert header.split("\t") == ["word1", "word2", "SimLex999"] and len(pairs) == summary["word_pairs"] > 0
    with open(out / "sts.csv") as f:
        assert len(list(csv.DictReader(f))) == summary["sentence_pairs"] > 0


def test_corpus_options_are_typed_builder_arguments_with_their_own_directory(tmp_path, monkeypatch):
    from openalign import config as config_lib
    from openalign.config import ConfigError, DataConfig
    from openalign import corpora

    cfg = config_lib.override(config_lib.Config(), ["data.corpus_options=noise=0.5,languages=en+de,limit=40"])
    options = cfg.data.corpus_options
    assert options == ("noise=0.5", "languages=en+de", "limit=40")
    assert corpora.corpus_options("emoji", options) == {"noise": 0.5, "languages": ("en", "de"), "limit": 40}
    assert corpora.corpus_dir("emoji", options) == "emoji-languagesen.de-limit40-noise0.5"
    assert corpora.corpus_dir("emoji", ()) == "emoji"
    with pytest.raises(ConfigError, match="did you mean noise"):
        corpora.corpus_options("emoji", ("noize=0.5",))
    with pytest.raises(ConfigError, match="not a valid float"):
        corpora.corpus_options("emoji", ("noise=lots",))
    import functools

    built = []

    @functools.wraps(emoji.build)
    def recording(out, **kw):
        built.append((out, kw))
        return emoji.build(out, **kw)

    monkeypatch.setitem(corpora.CORPORA, "emoji", recording)
    data = DataConfig(corpus="emoji", data_dir=str(tmp_path), corpus_options=("noise=0.0", "limit=60"))
    train, evaluation = corpora.resolve_data(data, progress=False)
    assert built[0] == (tmp_path / "emoji-limit60-noise0.0", {"noise": 0.0, "limit": 60, "progress": False})
    assert train and evaluation and all("emoji-limit60-noise0.0" in s for s in train + evaluation)
    corpora.resolve_data(data, progress=False)
    assert len(built) == 1  # built once


def test_copies_scale_the_training_split_with_augmented_views_and_fresh_noise(tmp_path):
    one = emoji.build(tmp_path / "x1", noise=0.5, limit=200)
    three = emoji.build(tmp_path / "x3", noise=0.5, limit=200, copies=3)
    assert three["train_images"] == 3 * one["train_images"] and three["eval_images"] == one["eval_images"]
    samples = [s | {"json": tars.sample_meta(s)}
               for s in tars.read_samples(tars.list_shards(str(tmp_path / "x3" / "train")))]
    keys = [s["__key__"] for s in samples]
    assert len(set(keys)) == len(keys) and sum(k.endswith("_v2") for k in keys) == one["train_images"]
    by_cp: dict = {}
    for s in samples:
        by_cp.setdefault(s["json"]["cp"], []).append(s)
    views = next(v for v in by_cp.values() if len(v) == 3)
    assert len({v["jpg"] for v in views}) == 3  # three different images of one emoji
    assert len({tuple(v["json"]["noise"]) for s in by_cp.values() for v in s}) > 1  # noise drawn per view
    with pytest.raises(ConfigError, match="copies"):
        emoji.build(tmp_path / "x0", copies=0)
