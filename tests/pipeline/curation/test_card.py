"""pipeline/curation/card.py: a corpus's data card, its numbers checked against the keep-lists counted in Python."""

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openalign.cli import main
from openalign.data.engine import Engine
from openalign.data.pairs import pair_uids, read_keep
from openalign.pipeline.curation.card import CardOptions, card
from test_balance import metaclip_matches

HOSTS = ["a.example", "b.example", "c.example"]
LANGUAGES = ["en", "en", "fr"]


def rows() -> list[dict]:
    out = []
    for i in range(90):
        words = ["a photo of a dog", "a red cat on a mat", "le chat noir dort", "dog", "tiny icon of a cat"][i % 5]
        out.append({"image_key": f"img{i}", "text": f"{words} {i}", "width": 40 if i % 7 == 0 else 300,
                    "height": 300, "url": f"https://{HOSTS[i % 3]}/p/{i}.jpg", "language": LANGUAGES[i % 3]})
    return out


@pytest.fixture()
def corpus(tmp_path):
    table = rows()
    uids = pair_uids([r["image_key"] for r in table], [r["text"] for r in table])
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"uid": uids, **{k: [r[k] for r in table] for k in table[0]}}), pairs)
    pairs.with_suffix(".manifest.json").write_text(json.dumps({"stage": "ingest", "pairs": len(table),
                                                               "sources": ["made by the test"]}))
    meta = tmp_path / "meta.txt"
    meta.write_text("dog\ncat\nmat\nphoto\nicon\nchat\nunicorn\n")
    assert main(["filter", str(pairs), "--out", str(tmp_path / "filter"), "--quiet", "min_short_side=100",
                 "max_images_per_text=10"]) == 0
    assert main(["balance", str(pairs), "--metadata", str(meta), "--per-entry", "12", "--out",
                 str(tmp_path / "balance"), "--quiet"]) == 0
    return pairs, meta, dict(zip(uids, table))


def test_the_card_counts_what_the_keep_lists_keep(corpus, tmp_path):
    pairs, meta, table = corpus
    out = tmp_path / "card"
    assert main(["card", str(pairs), "--keep", str(tmp_path / "filter"), "--keep", str(tmp_path / "balance"),
                 "--out", str(out), "--quiet", "--examples", "2"]) == 0
    got = json.loads((out / "card.json").read_text())
    everything = set(table)
    kept = [set(read_keep(tmp_path / s)) for s in ("filter", "balance")]
    removed = [everything - k for k in kept]
    c = got["counts"]
    assert c["pairs"] == 90 and c["kept_pairs"] == len(kept[0] & kept[1])
    assert [s["removed_alone"] for s in c["stages"]] == [len(r) for r in removed]
    assert [s["left_after"] for s in c["stages"]] == [len(kept[0]), len(kept[0] & kept[1])]
    assert [s["removed_only_here"] for s in c["stages"]] == [len(removed[0] - removed[1]), len(removed[1] - removed[0])]
    assert c["removed_by_both"][0][1] == c["removed_by_both"][1][0] == len(removed[0] & removed[1])
    assert {r["rule"] for r in c["stages"][0]["rules"]} >= {"image_small", "text_length"}
    assert all(e["text"] in {table[u]["text"] for u in removed[1]} for e in c["stages"][1]["removed_examples"])
    # per host (from the url) and per language
    final = kept[0] & kept[1]
    def value(uid, column):
        return table[uid]["url"].split("/")[2] if column == "host" else table[uid][column]

    for column in ("host", "language"):
        want = Counter(value(u, column) for u in everything)
        want_kept = Counter(value(u, column) for u in final)
        assert {g[column]: (g["pairs"], g["kept"]) for g in got["groups"][column]["top"]} == {
            v: (n, want_kept[v]) for v, n in want.items()}
    fr = next(g for g in got["groups"]["language"]["top"] if g["language"] == "fr")
    assert fr["removed_by"]["filter"] == sum(table[u]["language"] == "fr" for u in removed[0])
    # concepts: the entries' counts over the table and the kept, by MetaCLIP's own matcher
    entries = meta.read_text().split()
    before = Counter(e for u in everything for e in metaclip_matches(table[u]["text"], entries))
    after = Counter(e for u in final for e in metaclip_matches(table[u]["text"], entries))
    assert {h["entry"]: (h["pairs"], h["kept"]) for h in got["concepts"]["head"]} == {
        entries[e]: (n, after[e]) for e, n in before.items()}
    assert got["concepts"]["entries_without_pairs"] == 1 and got["concepts"]["without_pairs_examples"] == ["unicorn"]
    # provenance and the people's version
    prov = got["provenance"]
    assert prov["made_by"]["sources"] == ["made by the test"] and prov["versions"]["openalign"]
    assert prov["command"].startswith("openalign card ") and [s["stage"] for s in prov["stages"]] == ["filter",
                                                                                                       "balance"]
    text = (out / "card.md").read_text()
    assert f"{len(final):,}" in text and "## Per host" in text and "| a.example |" in text and "unicorn" not in text
    assert (out / "card.png").stat().st_size > 1_000


def test_without_a_balance_the_card_matches_the_concepts_itself_on_either_engine(corpus, tmp_path):
    pairs, meta, table = corpus
    options = CardOptions(metadata=str(meta))
    local = card(pairs, [tmp_path / "filter"], tmp_path / "local", options, progress=False)
    spark = card(pairs, [tmp_path / "filter"], tmp_path / "spark", options, progress=False,
                 engine=Engine("spark", "local[2]", retries=2))
    entries = meta.read_text().split()
    before = Counter(e for u in table for e in metaclip_matches(table[u]["text"], entries))
    assert {h["entry"]: h["pairs"] for h in local.card["concepts"]["head"]} == {entries[e]: n
                                                                                for e, n in before.items()}
    for result in (local, spark):
        result.card.pop("seconds")
        result.card.pop("provenance")
        result.card["concepts"].pop("source")
    assert local.card == spark.card
    assert (tmp_path / "local" / "concepts" / "matches.parquet").is_dir()


def test_bad_keep_lists_are_one_sentence(corpus, tmp_path, capsys):
    pairs, meta, _ = corpus
    other = tmp_path / "other.parquet"
    pq.write_table(pq.read_table(pairs).slice(0, 10), other)
    other.with_suffix(".manifest.json").write_text(json.dumps({"stage": "ingest", "pairs": 10}))
    assert main(["card", str(other), "--keep", str(tmp_path / "filter"), "--out", str(tmp_path / "c1"),
                 "--quiet"]) == 2
    assert "was made from" in capsys.readouterr().err
    (tmp_path / "balance" / "balance_report.json").unlink()  # as a killed balance leaves it
    assert main(["card", str(pairs), "--keep", str(tmp_path / "balance"), "--out", str(tmp_path / "c2"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "did not finish" in err and "Traceback" not in err
    assert not (tmp_path / "c2" / "card.json").exists()
    (tmp_path / "empty").mkdir()  # before: "... run that stage again into <its parent>", a garbled path
    assert main(["card", str(pairs), "--keep", str(tmp_path / "empty"), "--out", str(tmp_path / "c3"),
                 "--quiet"]) == 2
    assert f"{tmp_path / 'empty'} holds no keep-list (keep.parquet)" in capsys.readouterr().err
