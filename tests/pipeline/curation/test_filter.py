import dataclasses
import json
import shutil
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openalign.pipeline.curation.filter_rules import FilterConfig
from openalign.pipeline.curation import filter as filters
from openalign.pipeline.curation import filter_sql
from openalign.pipeline.curation.filter_sql import DuckDBSql
from openalign.pipeline.curation.filter_rules import DUCKDB, vocab_cut
from openalign.data.pairs import PAIR_SCHEMA, pair_uid, read_keep
from conftest import mark_ingested
from openalign import cli
from openalign.config import ConfigError
from openalign.data.engine import Engine


class Table:
    """Hand-made pair tables: add(image, text, size) and remember the uid under a name."""

    def __init__(self):
        self.rows, self.uids = [], {}

    def add(self, image: str, text: str, w: int = 400, h: int = 400, name: str = "") -> str:
        uid = pair_uid(image, text)
        self.rows.append({"uid": uid, "image_key": image, "text": text, "width": w, "height": h, "bytes": 1,
                          "format": "JPEG", "mode": "RGB", "conversions": "", "source": "test", "path": image,
                          "member": None, "url": None})
        if name:
            self.uids[name] = uid
        return uid

    def write(self, path):
        pq.write_table(pa.Table.from_pylist(self.rows, PAIR_SCHEMA), path)
        return mark_ingested(path)


def kept(tmp_path, table: Table, engine="local", **cfg) -> tuple[set, dict]:
    pairs = table.write(tmp_path / "pairs.parquet")
    report = filters.filter_pairs(pairs, tmp_path / engine, FilterConfig(**cfg), engine=Engine(engine, "local[1]"),
                                  progress=False)
    return set(read_keep(tmp_path / engine)), report.report  # the report as written


def test_boundaries_of_every_rule(tmp_path):
    t = Table()
    ok = "a plain caption here"
    t.add("side200", ok + " 1", 200, 300, name="side200")
    t.add("side201", ok + " 2", 201, 300, name="side201")
    t.add("aspect3", ok + " 3", 201, 603, name="aspect3")
    t.add("aspect<3", ok + " 4", 201, 602, name="aspect<3")
    for i in range(10):
        t.add(f"ten{i}", "shared by ten images", name=f"ten{i}")
    for i in range(11):
        t.add(f"eleven{i}", "shared by eleven images", name=f"eleven{i}")
    for i in range(14):  # 14 pairs (4 rows repeated) but 10 images: images are counted, not pairs
        t.add(f"tenimg{i % 10}", "on ten images in fourteen pairs", name=f"tenimg{i % 10}")
    t.add("w2", "two words", name="w2")
    t.add("w3", "three words\there", name="w3")
    t.add("w20", " ".join(["word"] * 20), name="w20")
    t.add("w21", " ".join(["word"] * 21), name="w21")
    for i in range(3):
        t.add("three_texts", f"text number {i} of three", name=f"three{i}")
    for i in range(4):
        t.add("four_texts", f"text number {i} of four", name=f"four{i}")
    keep, report = kept(tmp_path, t, max_texts_per_image=3)
    expect_kept = ["side201", "aspect<3", "w3", "w20", *(f"ten{i}" for i in range(10)),
                   *(f"tenimg{i}" for i in range(10)), *(f"three{i}" for i in range(3))]
    expect_dropped = ["side200", "aspect3", "w2", "w21", *(f"eleven{i}" for i in range(11)),
                      *(f"four{i}" for i in range(4))]
    assert all(t.uids[n] in keep for n in expect_kept)
    assert not any(t.uids[n] in keep for n in expect_dropped)
    alone = {r["rule"]: r["removed_alone"] for r in report["rules"]}
    assert alone == {"image_small": 1, "image_aspect": 1, "image_many_texts": 4, "text_shared": 11,
                     "text_length": 2, "text_rare": 0}
    repeated = 4  # rows of the 14-pair text that repeat a pair: counted as pairs, one uid each in the keep-list
    assert report["kept_pairs"] - repeated == len(keep) == len(expect_kept)
    assert len(keep) == report["pairs"] - repeated - len(expect_dropped)
    assert (tmp_path / "local" / "filter_report.png").stat().st_size > 0


def test_alone_versus_in_sequence(tmp_path):
    t = Table()
    t.add("small", "x", 100, 100)  # small and too short: counted alone by both, in sequence by the first only
    t.add("big", "y z", 400, 400)  # too short only
    _, report = kept(tmp_path, t)
    rules = {r["rule"]: r for r in report["rules"]}
    assert (rules["image_small"]["removed_alone"], rules["image_small"]["removed_in_sequence"]) == (1, 1)
    assert (rules["text_length"]["removed_alone"], rules["text_length"]["removed_in_sequence"]) == (2, 1)
    assert rules["text_length"]["examples"] and report["kept_pairs"] == 0


@pytest.mark.parametrize("ngrams,k,rare", [
    # unigram counts: red 4, blue 4, green 3, yellow 1; bigrams: "red blue" 4, "blue green" 3, "blue yellow" 1
    (2, 7, set()), (2, 6, {"t2"}), (2, 5, {"t2"}), (2, 2, {"t1", "t2"}),
    (1, 4, set()), (1, 3, {"t2"}), (1, 2, {"t1", "t2"}),  # ties broken by bytes: blue, red, green, yellow
])
def test_rare_terms_top_k_of_unigrams_and_bigrams(tmp_path, ngrams, k, rare):
    t = Table()
    for i in range(3):
        t.add(f"i{i}", ["red blue green", "Red BLUE green", "red  blue green"][i], name=f"t1_{i}")
    t.add("j", "red blue yellow", name="t2")
    keep, report = kept(tmp_path, t, vocab_size=k, vocab_ngrams=ngrams)
    dropped = {n.split("_")[0] for n, uid in t.uids.items() if uid not in keep}
    assert dropped == rare
    assert report["distinct_terms"] == (7 if ngrams == 2 else 4)


def random_corpus(n: int, seed: int = 0) -> Table:
    """Zipf-like words (some non-ASCII), sizes around the thresholds, shared and repeated texts."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(300)] + ["Über", "café", "naïve", "日本語", "emoji😀", "ΑΘΗΝΑ", "straße"]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    shared = [" ".join(rng.choices(vocab, weights, k=4)) for _ in range(20)]
    t = Table()
    for i in range(n):
        text = rng.choice(shared) if rng.random() < 0.3 else " ".join(rng.choices(vocab, weights, k=rng.randint(1, 23)))
        if rng.random() < 0.1:
            text = text.upper() + "\t "
        image = f"img{rng.randrange(n // 2)}" if rng.random() < 0.2 else f"img{i}"
        side = rng.choice([150, 200, 201, 300, 600])
        t.add(image, text, side, side * rng.choice([1, 2, 3]) if rng.random() < 0.5 else side)
    return t


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="the Spark engine needs Java (apt-get install default-jre-headless)")
def test_duckdb_and_spark_keep_lists_are_identical(tmp_path):
    t = random_corpus(3000)
    cfg = {"vocab_size": 250, "max_texts_per_image": 2, "max_images_per_text": 5}
    keep_duck, report_duck = kept(tmp_path, t, "local", **cfg)
    keep_spark, report_spark = kept(tmp_path, t, "spark", **cfg)
    assert keep_duck == keep_spark
    assert 0 < len(keep_duck) < 3000
    assert read_keep(tmp_path / "spark") == sorted(keep_spark)  # part files are in uid order
    strip = ("engine", "seconds", "keep")
    assert {k: v for k, v in report_duck.items() if k not in strip} == \
           {k: v for k, v in report_spark.items() if k not in strip}
    assert all(r["removed_alone"] > 0 for r in report_duck["rules"])
    json.dumps(report_duck)  # serializable


def test_vocab_cut_from_the_count_histogram():
    histogram = [(9, 2), (5, 3), (1, 10)]  # 2 terms counted 9 times, 3 counted 5, 10 counted once
    assert vocab_cut(histogram, 15) is None  # everything fits
    assert vocab_cut(histogram, 100) is None
    assert vocab_cut(histogram, 2) == (5, 0)  # cut between counts: all terms counted <= 5 are rare
    assert vocab_cut(histogram, 3) == (5, 1)  # one of the three 5-count terms (the smallest) is in
    assert vocab_cut(histogram, 14) == (1, 9)


def test_terms_counted_by_hash_then_exactly_give_the_exact_vocabulary_even_with_collisions(tmp_path, monkeypatch):
    """Terms are counted by a 64-bit hash, then only those that can reach the vocabulary by their strings: a
    hash that collides (here: 3,000 buckets for ~9,000 terms) must still give the exact keep-list."""
    t = random_corpus(3000, seed=5)
    cfg = {"vocab_size": 400}
    (tmp_path / "exact").mkdir()
    keep, report = kept(tmp_path / "exact", t, **cfg)
    assert 0 < report["exactly_counted_terms"] < report["distinct_terms"] / 4  # only the candidates, by strings
    rounds = []
    materialize = DuckDBSql.materialize

    def counting(self, name, query):
        rounds.append(name)
        materialize(self, name, query)

    monkeypatch.setattr(DuckDBSql, "materialize", counting)
    monkeypatch.setattr(DuckDBSql, "dialect", dataclasses.replace(DUCKDB, hash64="hash({x}) % 3000"))
    (tmp_path / "collide").mkdir()
    keep_collide, report_collide = kept(tmp_path / "collide", t, **cfg)
    assert rounds.count("term_counts") > 1  # collisions lifted the first floor above the true cut: lowered
    assert keep_collide == keep
    strip = ("input", "pair_table", "seconds", "keep", "distinct_terms", "exactly_counted_terms")
    assert {k: v for k, v in report_collide.items() if k not in strip} == \
           {k: v for k, v in report.items() if k not in strip}


def test_terms_counted_and_texts_flagged_in_parts_give_the_same_keep_list(tmp_path, monkeypatch):
    """Past its memory limit DuckDB groups the term hashes (split by hash into Parquet files) and finds the rare
    texts (split by text id) in parts: the same keep-list and report as in one pass."""
    t = random_corpus(3000, seed=7)
    cfg = {"vocab_size": 300}
    (tmp_path / "whole").mkdir()
    keep, report = kept(tmp_path / "whole", t, **cfg)
    seen = []
    parts = DuckDBSql.parts
    monkeypatch.setattr(DuckDBSql, "parts", lambda self, q: seen.append(parts(self, q)) or seen[-1])
    monkeypatch.setattr(filter_sql, "GROUP_ROW_BYTES", 10**6)  # as if each group took 1 MB: many parts
    (tmp_path / "parts").mkdir()
    keep_parts, report_parts = kept(tmp_path / "parts", t, **cfg)
    assert seen and seen[0] >= 5
    assert keep_parts == keep and 0 < len(keep) < 3000
    strip = ("input", "pair_table", "seconds", "keep", "spilled_bytes")
    assert {k: v for k, v in report_parts.items() if k not in strip} == \
           {k: v for k, v in report.items() if k not in strip}
    assert not list((tmp_path / "parts" / "local" / "tmp").rglob("*.parquet"))  # the split files are removed


def test_a_glob_of_pair_tables_equals_one_table(tmp_path):
    t = random_corpus(400, seed=3)
    (tmp_path / "one").mkdir()
    whole, _ = kept(tmp_path / "one", t, vocab_size=150)
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(2):
        pq.write_table(pa.Table.from_pylist(t.rows[i * 200:(i + 1) * 200], PAIR_SCHEMA), parts / f"part-{i}.parquet")
        mark_ingested(parts / f"part-{i}.parquet")
    report = filters.filter_pairs(str(parts / "*.parquet"), tmp_path / "glob", FilterConfig(vocab_size=150),
                                 progress=False)
    assert set(read_keep(tmp_path / "glob")) == whole and report.pairs == 400


def test_a_rule_that_removes_most_of_a_corpus_is_said_first(tmp_path):
    # A collection of small images (as a real one with median shorter side 113 px): before, only "image_small -N"
    t = Table()
    for i in range(10):
        side = 120 if i < 8 else 400
        t.add(f"img{i}", f"a small picture number {i}", side, side)
    _, report = kept(tmp_path, t)
    assert report["warnings"] == ["image_small alone removes 80% of the pairs (shorter side <= 200 px): if this "
                                  "collection is meant to be kept, change min_short_side=200 (e.g. `openalign filter "
                                  "... min_short_side=...`)"]
    assert filters.summary_lines(report)[0].startswith("warning: image_small alone removes 80%")
    (tmp_path / "lower").mkdir()
    _, fine = kept(tmp_path / "lower", t, min_short_side=100)
    assert fine["warnings"] == [] and fine["kept_pairs"] == 10


def test_duckdb_spills_under_a_memory_limit_says_so_and_keeps_the_same_pairs(tmp_path):
    # 60,000 texts of random words: the term table's hash aggregate does not fit 40 MB
    rng = random.Random(5)
    t = Table()
    for i in range(60_000):
        t.add(f"img{i}", " ".join(f"{rng.getrandbits(40):x}" for _ in range(rng.randint(3, 12))))
    pairs = t.write(tmp_path / "pairs.parquet")
    cfg = FilterConfig(vocab_size=50_000)
    free = filters.filter_pairs(pairs, tmp_path / "free", cfg, progress=False)
    tight = filters.filter_pairs(pairs, tmp_path / "tight", cfg, engine=Engine(workers=1, memory="40MB"),
                                 progress=False)
    assert free.report["spilled_bytes"] == 0 and not any("spilled" in line for line in free.lines())
    assert tight.report["spilled_bytes"] > 0 and tight.report["memory_limit"] == 40 * 2**20  # bytes: one size parser
    note = next(line for line in tight.lines() if "spilled" in line)
    assert "out-of-core" in note and "its memory limit (40M)" in note
    assert read_keep(tmp_path / "tight") == read_keep(tmp_path / "free")
    assert tight.rules == free.rules


def test_words_split_on_every_whitespace_character_and_only_those(tmp_path):
    t = Table()
    t.add("i1", "a\x0bb\x0cc", name="vt_ff")  # vertical tab, form feed: 3 words
    t.add("i2", " a\r\nb  c\t", name="cr_lf_runs")  # carriage return + line feed, runs, ends: 3 words
    t.add("i3", "a\u00a0b c", name="nbsp")  # a no-break space is not a word break here: 2 words
    t.add("i4", "a b", name="two")
    keep, _ = kept(tmp_path, t, min_words=3, max_words=3)
    assert keep == {t.uids["vt_ff"], t.uids["cr_lf_runs"]}


def test_duckdb_out_of_memory_is_one_sentence_with_what_to_do(tmp_path, capsys):
    from openalign import cli

    pairs = random_corpus(3000).write(tmp_path / "pairs.parquet")
    code = cli.main(["filter", str(pairs), "--out", str(tmp_path / "out"), "--memory-limit", "1MB", "--threads", "1",
                     "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "DuckDB ran out of memory in the filter's" in err and "--memory-limit 1M" in err
    assert "raise --memory-limit" in err and "--engine spark" in err


@pytest.mark.parametrize("change, message", [
    # before: a DuckDB BinderException traceback for a text column of integers or lists
    (lambda t: t.set_column(2, "text", pa.array(range(t.num_rows))), "column text holds int64, not text"),
    (lambda t: t.set_column(2, "text", pa.array([["a", "b"]] * t.num_rows)), "column text holds list<"),
    # before: a keep-list of one NULL row, and a report that said every pair was kept
    (lambda t: t.set_column(0, "uid", pa.array([None] * t.num_rows, pa.string())), "rows without a uid"),
])
def test_a_table_whose_columns_are_of_other_types_is_one_sentence(tmp_path, capsys, change, message):
    from openalign import cli

    table = Table()
    for i in range(5):
        table.add(f"img{i}", f"a photo of a cat number {i}")
    pairs = table.write(tmp_path / "pairs.parquet")
    pq.write_table(change(pq.read_table(pairs)), pairs)
    assert cli.main(["filter", str(pairs), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "out" / "keep.parquet").exists()


def test_one_engine_vocabulary_for_every_stage(tmp_path, capsys):
    # Before: filter took --engine duckdb|spark, every other stage --engine local|spark.
    from openalign.cli import main

    t = random_corpus(300, seed=11)
    pairs = t.write(tmp_path / "pairs.parquet")
    assert main(["filter", str(pairs), "--out", str(tmp_path / "local"), "--quiet"]) == 0
    assert "DuckDB (local)" in capsys.readouterr().out
    assert json.loads((tmp_path / "local" / "filter_report.json").read_text())["engine"] == "local"
    with pytest.raises(SystemExit):
        main(["filter", str(pairs), "--out", str(tmp_path / "old"), "--engine", "duckdb", "--quiet"])
    assert "invalid choice: 'duckdb'" in capsys.readouterr().err and not (tmp_path / "old").exists()


# (url, text, width, height, the rules that fire on it): the text rules by URL, the size rules where the table has
# sizes; Chinese and Japanese texts count their segmented words
CANDIDATES = [
    ("https://a.example/1.jpg", "a shared caption here", 400, 400, {"text_shared"}),
    ("https://a.example/2.jpg", "a shared caption here", 400, 400, {"text_shared"}),
    ("https://a.example/3.jpg", "a shared caption here", None, None, {"text_shared"}),
    ("https://a.example/4.jpg", "twice shared caption", 400, 400, set()),  # on exactly 2 images: kept
    ("https://a.example/5.jpg", "twice shared caption", 400, 400, set()),
    ("https://b.example/1.jpg", "two words", 400, 400, {"text_length"}),
    ("https://b.example/2.jpg", "exactly three words", 400, 400, set()),
    ("https://b.example/3.jpg", "one two three four five six seven eight", 400, 400, set()),  # 8: the maximum
    ("https://b.example/4.jpg", "one two three four five six seven eight nine", 400, 400, {"text_length"}),
    ("https://c.example/1.jpg", "红色的自行车", 400, 400, set()),  # 红色 的 自行车: 3 words, not 1
    ("https://c.example/2.jpg", "自行车", 400, 400, {"text_length"}),  # one word
    ("https://c.example/3.jpg", "東京タワーの夜景", 400, 400, set()),  # 東京 タワー の 夜景
    ("https://d.example/1.jpg", "first text of crowded image", 400, 400, {"image_many_texts"}),
    ("https://d.example/1.jpg", "second text of crowded image", 400, 400, {"image_many_texts"}),
    ("https://d.example/1.jpg", "third crowded", 400, 400, {"image_many_texts", "text_length"}),  # two rules
    ("https://d.example/2.jpg", "first text of busy image", 400, 400, set()),  # 2 texts: kept
    ("https://d.example/2.jpg", "second text of busy image", 400, 400, set()),
    ("https://e.example/1.jpg", "a small picture here", 200, 300, {"image_small"}),
    ("https://e.example/2.jpg", "a bigger picture here", 201, 300, set()),
    ("https://e.example/3.jpg", "a long thin banner", 300, 900, {"image_aspect"}),
    ("https://e.example/4.jpg", "a less thin banner", 301, 900, set()),
    ("https://e.example/5.jpg", "a picture of unknown size", None, None, set()),  # not judged by the size rules
]
RULE_ORDER = ("image_small", "image_aspect", "image_many_texts", "text_shared", "text_length", "text_rare")
CANDIDATE_RULES = {"max_images_per_text": 2, "min_words": 3, "max_words": 8, "max_texts_per_image": 2,
                   "min_short_side": 200, "max_aspect": 3.0}


def candidate_table(tmp_path):
    """CANDIDATES as COYO-700M's layout (id, url, text, width, height, and scores the rules ignore), through extract."""
    from openalign.pipeline.web.extract import extract

    coyo = {"id": list(range(len(CANDIDATES))), "url": [c[0] for c in CANDIDATES],
            "text": [c[1] for c in CANDIDATES],
            "width": pa.array([c[2] for c in CANDIDATES], pa.int64()),
            "height": pa.array([c[3] for c in CANDIDATES], pa.int64()),
            "clip_similarity_vitb32": [0.3] * len(CANDIDATES)}
    pq.write_table(pa.table(coyo), tmp_path / "coyo.parquet")
    extract([str(tmp_path / "coyo.parquet")], tmp_path / "web", progress=False)
    return tmp_path / "web" / "candidates.parquet"


def test_the_rules_run_on_a_candidate_table_before_any_download(tmp_path):
    pytest.importorskip("jieba")
    table = candidate_table(tmp_path)
    report = filters.filter_pairs(table, tmp_path / "f", FilterConfig(**CANDIDATE_RULES), progress=False)
    rows = pq.read_table(table, columns=["uid", "url", "text"]).to_pylist()
    rules = {(u, t): fired for u, t, _, _, fired in CANDIDATES}
    expected = {r["uid"] for r in rows if not rules[(r["url"], r["text"])]}
    assert set(read_keep(tmp_path / "f")) == expected and len(expected) == 11
    assert [r.rule for r in report.rules] == list(RULE_ORDER)
    for r in report.rules:  # alone: every pair the rule fires on; in sequence: those no earlier rule took
        assert r.removed_alone == sum(r.rule in fired for *_, fired in CANDIDATES), r.rule
        first = [next((rule for rule in RULE_ORDER if rule in fired), None) for *_, fired in CANDIDATES]
        assert r.removed_in_sequence == first.count(r.rule), r.rule
    assert [r.removed_in_sequence for r in report.rules] != [r.removed_alone for r in report.rules]
    assert report.pairs == len(CANDIDATES) and report.kept_pairs == 11


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="the Spark engine needs Java (apt-get install default-jre-headless)")
def test_a_candidate_table_filters_the_same_on_spark(tmp_path):
    pytest.importorskip("jieba")
    table = candidate_table(tmp_path)
    local = filters.filter_pairs(table, tmp_path / "local", FilterConfig(**CANDIDATE_RULES), progress=False)
    spark = filters.filter_pairs(table, tmp_path / "spark", FilterConfig(**CANDIDATE_RULES), engine="spark",
                                master="local[1]", progress=False)
    assert read_keep(tmp_path / "local") == read_keep(tmp_path / "spark")
    assert [r.removed_alone for r in local.rules] == [r.removed_alone for r in spark.rules]


def test_the_size_rules_say_when_no_size_is_known(tmp_path):
    from openalign.pipeline.web.extract import extract

    (tmp_path / "urls.csv").write_text("url,caption\nhttps://a.example/1.jpg,a red bicycle here\n"
                                       "https://a.example/2.jpg,two cats asleep here\n", encoding="utf-8")
    extract([str(tmp_path / "urls.csv")], tmp_path / "web", progress=False)
    report = filters.filter_pairs(tmp_path / "web" / "candidates.parquet", tmp_path / "f", progress=False)
    assert report.not_applied == {"image_small": "no image's size is known",
                                     "image_aspect": "no image's size is known"} and report.kept_pairs == 2
    assert report.report["sizes"] == {"original": 0, "as_stored": 0, "unknown": 2}
    assert "note: image_small, image_aspect not applied (no image's size is known; they run on the pair table after " \
           "the download)" in report.lines()


def test_a_candidate_table_s_report_counts_each_language_and_host(tmp_path):
    pytest.importorskip("jieba")
    table = candidate_table(tmp_path)
    report = filters.filter_pairs(table, tmp_path / "f", FilterConfig(**CANDIDATE_RULES), progress=False)
    rows = pq.read_table(table, columns=["url", "text", "language", "host"]).to_pylist()
    fired = {(u, t): f for u, t, _, _, f in CANDIDATES}
    for column, groups in (("language", report.report["by_language"]), ("host", report.report["by_host"])):
        assert sum(g["pairs"] for g in groups) == len(CANDIDATES)
        for g in groups:
            mine = [r for r in rows if r[column] == g["value"]]
            assert g["pairs"] == len(mine) and g["kept"] == sum(not fired[(r["url"], r["text"])] for r in mine)
            for rule, n in g["removed_alone"].items():
                assert n == sum(rule in fired[(r["url"], r["text"])] for r in mine), (column, g["value"], rule)
    languages = {g["value"] for g in report.report["by_language"]}
    assert {"en", "zh", "ja"} <= languages and report.report["by_host"][0]["value"] == "a.example"
    assert (tmp_path / "f" / "filter_report.png").stat().st_size > 10_000


@pytest.mark.parametrize("rules", ["text", "image"])
def test_rules_selects_the_text_or_the_image_rules(tmp_path, rules, capsys):
    pytest.importorskip("jieba")
    from openalign import cli

    table = candidate_table(tmp_path)
    overrides = [f"{k}={v}" for k, v in CANDIDATE_RULES.items()]
    assert cli.main(["filter", str(table), "--out", str(tmp_path / "f"), "--rules", rules, *overrides]) == 0
    report = json.loads((tmp_path / "f" / "filter_report.json").read_text())
    selected = [rule for rule in RULE_ORDER if rule.startswith(rules)]
    rows = pq.read_table(table, columns=["uid", "url", "text"]).to_pylist()
    fired = {(u, t): f & set(selected) for u, t, _, _, f in CANDIDATES}
    assert set(read_keep(tmp_path / "f")) == {r["uid"] for r in rows if not fired[(r["url"], r["text"])]}
    assert {r["rule"] for r in report["rules"] if r["removed_alone"]} == set().union(*fired.values())
    assert set(report["not_applied"]) == set(RULE_ORDER) - set(selected)
    assert f"(--rules {rules})" in capsys.readouterr().out


def test_filter_takes_the_engine_and_its_older_keywords_still_work_with_a_warning(tmp_path, capsys):
    # issue 84: filter_pairs took engine="local", master=, memory_limit=, threads= where every other stage takes Engine
    t = Table()
    for i in range(30):
        t.add(f"img{i % 20}", f"a picture of thing number {i % 7} here", w=300 + i)
    pairs = t.write(tmp_path / "pairs.parquet")
    cfg = FilterConfig(min_short_side=310, max_images_per_text=3)
    new = filters.filter_pairs(pairs, tmp_path / "new", cfg, engine=Engine(workers=1, memory="64MB"), progress=False)
    with pytest.warns(DeprecationWarning, match="pass engine=Engine"):
        old = filters.filter_pairs(pairs, tmp_path / "old", cfg, engine="local", memory_limit="64MB", threads=1,
                                   progress=False)
    assert read_keep(tmp_path / "old") == read_keep(tmp_path / "new") and old.rules == new.rules
    assert old.report["memory_limit"] == new.report["memory_limit"] == 64 * 2**20
    with pytest.raises(ConfigError, match="in the Engine"):
        filters.filter_pairs(pairs, tmp_path / "x", cfg, engine=Engine("spark"), master="local[1]")
    # its flags come from FilterConfig and the Engine, and key=value still sets a threshold
    base = ["filter", str(pairs), "--quiet", "--threads", "1", "--memory-limit", "64MB"]
    assert cli.main([*base, "--out", str(tmp_path / "flags"), "--min-short-side", "310",
                     "--max-images-per-text", "3"]) == 0
    assert cli.main([*base, "--out", str(tmp_path / "keys"), "min_short_side=310", "max_images_per_text=3"]) == 0
    assert read_keep(tmp_path / "flags") == read_keep(tmp_path / "keys") == read_keep(tmp_path / "new")
    with pytest.raises(SystemExit):
        cli.main([*base, "--out", str(tmp_path / "bad"), "--memory-limit", "lots"])
    assert "argument --memory-limit: 'lots' is not a size" in capsys.readouterr().err
