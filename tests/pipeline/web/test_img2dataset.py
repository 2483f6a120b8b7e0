"""img2dataset's own output, as its release writes it (tests/fixtures/img2dataset, made by make_fixture.py with the
real img2dataset 1.47.0): its output folder in each of its three formats is ingested, the size before its resizing
is what the paper's image filters judge, and its failed downloads are counted."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from openalign.cli import main
from openalign.pipeline.curation.filter_rules import FilterConfig
from openalign.data.pairs import read_keep

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "img2dataset"
ORIGINALS = json.loads((FIXTURE / "originals.json").read_text())
FORMATS = ("webdataset", "files", "parquet")


def ingested(tmp_path, fmt: str) -> Path:
    out = tmp_path / fmt / "pairs.parquet"
    assert main(["ingest", str(FIXTURE / fmt), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    return out


def expected_removals(cfg: FilterConfig) -> tuple[int, int]:
    """Oracle: what image_small and image_aspect remove judged on the originals' sizes."""
    sizes = [(o["width"], o["height"]) for o in ORIGINALS.values()]
    small = sum(min(s) <= cfg.min_short_side for s in sizes)
    wide = sum(max(s) / min(s) >= cfg.max_aspect for s in sizes)
    return small, wide


@pytest.mark.parametrize("fmt", FORMATS)
def test_img2dataset_output_folder_is_ingested_with_original_sizes(tmp_path, fmt):
    # Before: `ingest OUT/` answered "0 pairs (0 images)" for the webdataset format, the parquet format gave a
    # 63 KB traceback, and with img2dataset's default 256 x 256 resizing image_small and image_aspect removed nothing.
    out = ingested(tmp_path, fmt)
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["pairs"] == len(ORIGINALS) and manifest["rejected"] == {"not_downloaded": 1}
    rows = pq.read_table(out).to_pylist()
    for row in rows:
        original = ORIGINALS[row["url"].rsplit("/", 1)[1]]
        assert (row["original_width"], row["original_height"]) == (original["width"], original["height"])
        assert (row["width"], row["height"]) == (256, 256) and row["text"] == original["caption"]
    rejects = pq.read_table(out.with_suffix(".rejects.parquet")).to_pylist()
    assert [r["detail"] for r in rejects] == ["failed_to_download: HTTP Error 404: File not found"]
    cfg = FilterConfig(vocab_size=1000)
    assert main(["filter", str(out), "--out", str(tmp_path / fmt / "f"), "--quiet", "vocab_size=1000"]) == 0
    report = json.loads((tmp_path / fmt / "f" / "filter_report.json").read_text())
    removed = {r["rule"]: r["removed_alone"] for r in report["rules"]}
    assert (removed["image_small"], removed["image_aspect"]) == expected_removals(cfg) == (3, 3)
    assert report["sizes"] == {"original": len(ORIGINALS), "as_stored": 0, "unknown": 0}


def test_the_three_formats_give_the_same_pairs_and_the_parquet_one_shards(tmp_path):
    keeps = []
    for fmt in FORMATS:
        out = ingested(tmp_path, fmt)
        assert main(["filter", str(out), "--out", str(tmp_path / fmt / "f"), "--quiet", "vocab_size=1000"]) == 0
        keeps.append(read_keep(tmp_path / fmt / "f"))
    assert keeps[0] == keeps[1] == keeps[2] and len(keeps[0]) == 5  # the same image bytes in each format
    # the parquet format's images are read from its image column when sharding
    assert main(["shard", str(tmp_path / "parquet" / "pairs.parquet"), "--keep", str(tmp_path / "parquet" / "f"),
                 "--out", str(tmp_path / "shards"), "--quiet", "--workers", "1"]) == 0
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["n_samples"] == 5 and not any(manifest["skipped"].values())


def test_a_folder_with_nothing_to_ingest_is_one_sentence_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no images here")
    assert main(["ingest", str(tmp_path / "empty"), "--out", str(tmp_path / "out" / "pairs.parquet"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "found no images in" in err and "img2dataset's output folder" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_eval_and_embed_read_img2datasets_parquet_output_as_ingest_does(tmp_path):
    # data/sources.py reads img2dataset's `parquet` output by content (tables.kind): each downloaded image, its
    # bytes from the table's image column, with its caption; before, a .parquet there had to be a pair table.
    from openalign.data.sources import decoded, listing

    for table in sorted((FIXTURE / "parquet").glob("*.parquet")):
        rows = pq.read_table(table, columns=["key", "status", "caption"]).to_pylist()
        listed = listing(str(table))
        assert [(i.key, i.texts) for i in listed] == [(r["key"], [r["caption"]]) for r in rows if r["status"] == "success"]
        counter: dict = {}
        assert [i.key for i, _ in decoded(listed, counter)] == [i.key for i in listed] and not counter
    ingested_texts = sorted(p["text"] for p in pq.read_table(ingested(tmp_path, "parquet")).to_pylist())
    assert ingested_texts == sorted(t for table in sorted((FIXTURE / "parquet").glob("*.parquet"))
                                    for i in listing(str(table)) for t in i.texts)
