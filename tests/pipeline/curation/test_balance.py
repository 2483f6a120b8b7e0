"""pipeline/curation/balance.py: MetaCLIP's substring matching of alt-texts against metadata entries and its balancing, each
entry capped at t pairs by sampling."""

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openalign.cli import main
from openalign.data.engine import Engine
from openalign.data.pairs import pair_uids, read_keep
from openalign.pipeline.curation import balance as balance_lib
from openalign.pipeline.curation import concepts
from openalign.pipeline.curation.balance import BalanceOptions, balance, keep_probabilities, sample_pairs


def write_table(path: Path, texts: list[str]) -> Path:
    keys = [f"img{i}" for i in range(len(texts))]
    pq.write_table(pa.table({"uid": pair_uids(keys, texts), "image_key": keys, "text": texts}), path)
    path.with_suffix(".manifest.json").write_text(json.dumps({"stage": "ingest", "pairs": len(texts)}))
    return path


# ---------------------------------------------------------------------------------------------- matching


def metaclip_matches(text: str, entries: list[str]) -> list[int]:
    """MetaCLIP's own pure-Python matcher (metaclip1/substr_matching.py): `f" {entry} " in spacing(text)`, for
    entries that begin and end with a letter (where its later `get_spaced_metadata` pads both sides too)."""
    spaced = f" {text} "
    for mark in [",", ".", ";", ":", "?", "!", "`"]:
        spaced = spaced.replace(mark, f" {mark} ")
    for char in ["\t", "\n", "\r"]:
        spaced = spaced.replace(char, " ")
    return [i for i, entry in enumerate(entries) if f" {entry} " in spaced]


def automaton(entries: list[str]):
    import ahocorasick

    a = ahocorasick.Automaton()
    for i, entry in enumerate(entries):
        a.add_word(concepts.spaced_entry(entry), i)
    a.make_automaton()
    return a


def test_the_automaton_finds_what_metaclips_pure_python_matcher_finds():
    words = ["dog", "Dog", "hot", "hot dog", "dog house", "cat", "catalog", "a", "red", "red cat", "sea lion", "lion"]
    rng = random.Random(0)
    fillers = words + ["the", "dogs", "cats", ",", ".", "!", "\t", "\n", "?", "house", "sea", "hotdog"]
    found = automaton(words)
    for _ in range(2_000):
        text = "".join(rng.choice(fillers) + rng.choice([" ", "", ", ", ".", "\t"]) for _ in range(rng.randint(0, 12)))
        assert concepts.match_entries(found, text) == metaclip_matches(text, words), repr(text)


@pytest.mark.parametrize("text, entries, expected", [
    ("A hot dog, with a dog house.", ["hot dog", "dog", "dog house", "house"], [0, 1, 2, 3]),  # overlapping entries
    ("a catalog of cats", ["cat"], []),  # whole words only
    ("Dog on the beach", ["dog"], []),  # case-sensitive, as MetaCLIP
    ("dog:cat;bird?", ["dog", "cat", "bird"], [0, 1, 2]),  # punctuation wrapped in spaces
    ("我家的猫很可爱", ["猫", "可爱"], [0, 1]),  # an entry of a script written without spaces matches inside words
    ("", ["dog"], []),
])
def test_matching_rules(text, entries, expected):
    assert concepts.match_entries(automaton(entries), text) == expected


def test_ignore_case_lowercases_both():
    found = automaton(["dog"])
    assert concepts.match_entries(found, "Dog", ignore_case=True) == [0]
    assert concepts.match_entries(found, "Dog") == []


def test_wordnet_names_are_the_first_lemma_of_each_synset(tmp_path):
    (tmp_path / "data.noun").write_text(
        "  1 This software and database is being provided ...\n"
        "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived\n"
        "02084071 05 n 02 dog 0 domestic_dog 0 042 @ 02083346 n 0000 | a member of the genus Canis\n"
        "10967562 18 n 01 Einstein 0 001 @ 10705615 n 0000 | physicist born in Germany\n"
        "07697537 13 n 02 hotdog 0 hot_dog 0 003 @ 07697100 n 0000 | a frankfurter served hot\n")
    (tmp_path / "data.verb").write_text("01168468 34 v 01 dog 0 001 @ 02000868 v 0000 | go after\n")
    (tmp_path / "data.adj").write_text("00004413 00 s 01 absolute(a) 0 001 & 00003356 a 0000 | perfect\n")
    (tmp_path / "data.adv").write_text("00001740 02 r 01 a_cappella 0 000 | without musical accompaniment\n")
    assert concepts.wordnet_entries(str(tmp_path)) == ["entity", "dog", "einstein", "hotdog", "absolute",
                                                          "a cappella"]


def test_debians_wordnet_gives_metaclips_count_of_synset_names():
    if not Path(concepts.WORDNET, "data.noun").is_file():
        pytest.skip("Debian's wordnet-base is not installed (make setup installs it as root)")
    names = concepts.wordnet_entries()
    # MetaCLIP's metadata counts 86,654 WordNet synsets from NLTK's copy of WordNet 3.0; distinct names here
    assert 85_000 < len(names) < 87_000 and len(set(names)) == len(names)
    assert {"dog", "hotdog", "golden retriever", "person"} <= set(names)


# ---------------------------------------------------------------------------------------------- sampling


def test_each_pair_is_kept_with_one_minus_the_product_of_its_entries_misses():
    """Over 400 seeds, each pair's kept frequency matches 1 - prod(1 - p_i) of its entries (a statistical test at
    fixed seeds: every z-score below 4.5)."""
    counts = np.array([1000, 400, 100, 50, 5])
    p = keep_probabilities(counts, 50)
    assert p.tolist() == [0.05, 0.125, 0.5, 1.0, 1.0]
    entries = [[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2], [3], [0, 3], [2, 4]]
    uids = [f"u{i:04d}" for i in range(len(entries) * 30)]
    per_pair = [entries[i % len(entries)] for i in range(len(uids))]
    want = np.array([1 - np.prod(1 - p[e]) for e in per_pair])
    seeds = 400
    kept = np.zeros(len(uids))
    for seed in range(seeds):
        kept += sample_pairs(uids, per_pair, p, seed)
    for group in range(len(entries)):  # the 30 pairs of a group share their probability
        rows = np.arange(group, len(uids), len(entries))
        q, trials = want[rows[0]], seeds * len(rows)
        observed = kept[rows].sum() / trials
        if q in (0.0, 1.0):
            assert observed == q
            continue
        z = abs(observed - q) / np.sqrt(q * (1 - q) / trials)
        assert z < 4.5, (entries[group], observed, q, z)
    assert sample_pairs(["x"], [[]], p, 0).tolist() == [False]  # a pair with no entry is never kept


def test_draws_are_uniform_and_differ_by_seed_uid_and_entry():
    hashes = balance_lib.uid_hashes([f"uid{i}" for i in range(20_000)])
    a = balance_lib.draws(0, hashes, np.zeros(len(hashes), np.int64))
    b = balance_lib.draws(1, hashes, np.zeros(len(hashes), np.int64))
    c = balance_lib.draws(0, hashes, np.ones(len(hashes), np.int64))
    for d in (a, b, c):
        assert d.min() >= 0 and d.max() < 1
        assert np.histogram(d, bins=10, range=(0, 1))[0].min() > 1_850  # 2,000 expected per tenth
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03 and abs(np.corrcoef(a, c)[0, 1]) < 0.03


# ---------------------------------------------------------------------------------------------- the stage


def corpus_texts() -> list[str]:
    return ([f"a photo of a dog, number {i}" for i in range(120)] + [f"a cat on a mat {i}" for i in range(30)] +
            [f"Dog and cat {i}" for i in range(10)] + ["nothing to see", "nothing at all"])


@pytest.fixture()
def table(tmp_path):
    meta = tmp_path / "meta.txt"
    meta.write_text("dog\ncat\nmat\nphoto\nnot there\ncat\n\n")
    return write_table(tmp_path / "pairs.parquet", corpus_texts()), meta


def test_balance_end_to_end(table, tmp_path):
    pairs, meta = table
    out = tmp_path / "out"
    assert main(["balance", str(pairs), "--metadata", str(meta), "--per-entry", "20", "--out", str(out), "--quiet",
                 "--seed", "3"]) == 0
    report = json.loads((out / "balance_report.json").read_text())
    assert (out / "metadata.txt").read_text() == "dog\ncat\nmat\nphoto\nnot there\n"  # a repeated entry once
    assert report["metadata"]["repeated_lines"] == 1
    entries = {r["entry"]: r for r in pq.read_table(out / "entries.parquet").to_pylist()}
    assert {e: r["pairs"] for e, r in entries.items()} == {"dog": 120, "cat": 40, "mat": 30, "photo": 120,
                                                           "not there": 0}
    assert entries["dog"]["probability"] == pytest.approx(20 / 120) and entries["cat"]["probability"] == 0.5
    assert report["unmatched_pairs"] == 2 and report["total_pairs"] == 162
    assert sorted(e["text"] for e in report["unmatched_examples"]) == ["nothing at all", "nothing to see"]
    # the keep-list is exactly the public rule at this seed, over the matches it wrote
    matches = pq.read_table(out / "matches.parquet").to_pylist()
    p = keep_probabilities(np.array([entries[e]["pairs"] for e in ["dog", "cat", "mat", "photo", "not there"]]), 20)
    kept = sample_pairs([m["uid"] for m in matches], [m["entries"] for m in matches], p, 3)
    assert read_keep(out) == sorted(m["uid"] for m, k in zip(matches, kept) if k)
    assert report["kept_pairs"] == int(kept.sum())
    assert (out / "balance_report.png").stat().st_size > 1_000 and not (out / "_work").exists()
    # a rerun reproduces it; another seed reuses the matches and keeps other pairs
    again = balance(pairs, tmp_path / "again", BalanceOptions(metadata=str(meta), per_entry=20, seed=3),
                    progress=False)
    assert read_keep(tmp_path / "again") == read_keep(out) and not again.reused_matches
    other = balance(pairs, out, BalanceOptions(metadata=str(meta), per_entry=20, seed=4), progress=False)
    assert other.reused_matches and read_keep(out) != read_keep(tmp_path / "again")
    # a changed metadata file matches again
    meta.write_text("dog\n")
    changed = balance(pairs, out, BalanceOptions(metadata=str(meta), per_entry=20, seed=4), progress=False)
    assert not changed.reused_matches and changed.entries == 1 and changed.unmatched_pairs == 162 - 120


def test_spark_keeps_what_the_local_engine_keeps(table, tmp_path):
    pairs, meta = table
    options = BalanceOptions(metadata=str(meta), per_entry=20, seed=5, pairs_per_task=50)
    local = balance(pairs, tmp_path / "local", options, progress=False)
    spark = balance(pairs, tmp_path / "spark", options, progress=False, engine=Engine("spark", "local[2]", retries=2))
    assert read_keep(tmp_path / "local") == read_keep(tmp_path / "spark") and local.kept_pairs == spark.kept_pairs
    assert (pq.read_table(tmp_path / "local" / "matches.parquet").to_pylist() ==
            pq.read_table(tmp_path / "spark" / "matches.parquet").to_pylist())


def test_default_metadata_is_wordnet_and_the_corpus_words(table, tmp_path):
    pairs, _ = table
    wordnet = tmp_path / "wordnet"
    wordnet.mkdir()
    (wordnet / "data.noun").write_text("02084071 05 n 02 dog 0 domestic_dog 0 042 @ 02083346 n 0000 | a dog\n")
    for pos in ("verb", "adj", "adv"):
        (wordnet / f"data.{pos}").write_text("")
    result = balance(pairs, tmp_path / "out", BalanceOptions(wordnet=str(wordnet), term_min_pairs=30, per_entry=50),
                     progress=False)
    # "a" is in 150 texts, "photo" and "of" in 120, "cat" 40 ("Dog and cat" too), "mat" and "on" 30; "dog" is
    # WordNet's already; "number" 120
    assert (tmp_path / "out" / "metadata.txt").read_text().split("\n")[:-1] == [
        "dog", "a", "number", "of", "photo", "cat", "mat", "on"]
    assert result.report["metadata"]["corpus_words"] == 7 and result.unmatched_pairs == 2


@pytest.mark.parametrize("argv, message", [
    (["--metadata", "missing.txt"], "does not exist"),
    (["--metadata", "empty.txt"], "holds no entry"),
    (["--per-entry", "0"], "must be at least 1"),
    (["--wordnet", "nowhere"], "wordnet-base"),
    # before: pyahocorasick segfaulted (exit 139) on an entry of 10 MB
    (["--metadata", "long.txt"], "line 2 is an entry of 10,000,000 characters"),
])
def test_bad_input_is_one_sentence(table, tmp_path, capsys, monkeypatch, argv, message):
    pairs, _ = table
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "long.txt").write_text("cat\n" + "x" * 10_000_000 + "\ndog\n")
    assert main(["balance", str(pairs), "--out", str(tmp_path / "out"), "--quiet", *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_killed_run_leaves_no_keep_list_and_its_rerun_keeps_what_a_fresh_run_keeps(table, tmp_path, monkeypatch):
    from conftest import run_killed
    from openalign.config import ConfigError
    from openalign.data.pairs import keep_source

    pairs, meta = table
    argv = ["balance", str(pairs), "--metadata", str(meta), "--per-entry", "20", "--quiet", "--workers", "1"]
    run_killed(monkeypatch, balance_lib, "keep_probabilities", [*argv, "--out", str(tmp_path / "killed")])
    assert (tmp_path / "killed" / "matches.parquet" / "part-000000.parquet").is_file()  # matched, then killed
    with pytest.raises(ConfigError, match="did not finish"):
        keep_source(tmp_path / "killed")
    assert main([*argv, "--out", str(tmp_path / "killed")]) == 0
    assert main([*argv, "--out", str(tmp_path / "fresh")]) == 0
    report = json.loads((tmp_path / "killed" / "balance_report.json").read_text())
    assert report["reused_matches"] and read_keep(tmp_path / "killed") == read_keep(tmp_path / "fresh")
