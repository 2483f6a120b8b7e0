"""ingest -> filter -> shard through `main(argv)`, and the loader reading the result unchanged."""

import json

import numpy as np
import pytest
from PIL import Image

from openalign.cli import main
from openalign.config import ConfigError
from openalign.data import sources
from openalign.data.tars import list_shards, read_samples, sample_texts
from conftest import mark_ingested


def make_folder(root, n=30):
    """n images with captions: every 5th too small (dropped), every 7th with a one-word caption (dropped)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for i in range(n):
        size = (150, 150) if i % 5 == 0 else (260 + i, 240)
        array = rng.integers(0, 255, (size[1], size[0], 4), dtype=np.uint8)
        Image.fromarray(array, "RGBA").save(root / f"img{i:02d}.png")
        text = "word" if i % 7 == 0 else f"a picture of thing number {i}"
        (root / f"img{i:02d}.txt").write_text(text)


def test_ingest_filter_shard_then_load(tmp_path, capsys):
    make_folder(tmp_path / "raw")
    assert main(["ingest", str(tmp_path / "raw"), "--out", str(tmp_path / "pairs.parquet"), "--quiet",
                 "--workers", "1"]) == 0
    assert main(["filter", str(tmp_path / "pairs.parquet"), "--out", str(tmp_path / "filter"), "--quiet",
                 "vocab_size=1000"]) == 0
    out = capsys.readouterr().out
    assert "30 pairs -> 20 kept" in out  # 6 small + 5 one-word captions, one (i=0) both
    shards = tmp_path / "shards"
    argv = ["shard", str(tmp_path / "pairs.parquet"), "--keep", str(tmp_path / "filter"), "--out", str(shards),
            "--image-size", "128", "--samples-per-shard", "8", "--quiet", "--workers", "2"]
    assert main(argv) == 0
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["n_samples"] == 20 and len(manifest["shards"]) == 3 and manifest["resumed_shards"] == 0
    samples = list(read_samples(list_shards(str(shards))))
    assert sorted(t for s in samples for t in sample_texts(s)) == sorted(
        f"a picture of thing number {i}" for i in range(30) if i % 5 and i % 7)
    loaded = list(sources.decoded(sources.items(str(shards))))
    assert len(loaded) == 20 and all(len(item.texts) >= 1 for item, _ in loaded)
    first = Image.open(__import__("io").BytesIO(samples[0]["jpg"]))
    assert min(first.size) == 128 and first.mode == "RGB"

    # a rerun redoes only what is missing, byte for byte
    names = sorted(manifest["shards"])
    before = {n: (shards / n).read_bytes() for n in names}
    (shards / names[1]).unlink()
    assert main(argv) == 0
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["resumed_shards"] == 2 and manifest["n_samples"] == 20
    assert {n: (shards / n).read_bytes() for n in names} == before

    # a second keep-list intersects: dedup against copies of two kept images removes exactly their pairs
    (tmp_path / "held").mkdir()
    for i in (1, 2):
        (tmp_path / "held" / f"copy{i}.png").write_bytes((tmp_path / "raw" / f"img{i:02d}.png").read_bytes())
    assert main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(tmp_path / "held"), "--out",
                 str(tmp_path / "dedup"), "--quiet", "--workers", "1"]) == 0
    both = tmp_path / "both"
    assert main(["shard", str(tmp_path / "pairs.parquet"), "--keep", str(tmp_path / "filter"), "--keep",
                 str(tmp_path / "dedup"), "--out", str(both), "--quiet", "--workers", "1"]) == 0
    kept = sorted(t for s in read_samples(list_shards(str(both))) for t in sample_texts(s))
    assert kept == sorted(f"a picture of thing number {i}" for i in range(3, 30) if i % 5 and i % 7)
    # the tokenizer trains on the kept texts only: the dropped one-word captions ("word") are not in its vocabulary
    assert main(["tokenizer", "--data", str(both), "--vocab-size", "120", "--out", str(tmp_path / "tok")]) == 0
    vocab = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["model"]["vocab"]
    assert {"picture", "thing", "number"} <= set(vocab) and "word" not in vocab


def test_openclipart_corpus_on_a_small_tree(tmp_path, capsys):
    root = tmp_path / "png" / "animals" / "birds"
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (300, 320, 3), dtype=np.uint8)).save(root / f"bird_{i}_some_author_01.png")
    (root.parent / "tiny_icon.png").write_bytes((root / "bird_0_some_author_01.png").read_bytes()[:0] or b"")
    (root.parent / "same_bird.png").symlink_to(root / "bird_1_some_author_01.png")
    assert main(["corpus", "openclipart", "--out", str(tmp_path / "oc"), "--root", str(tmp_path / "png"),
                 "--image-size", "64", "--heldout", "0.25", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files"] == 14 and summary["rejected"] == {"empty": 1} and summary["images"] == 12
    assert summary["train_images"] + summary["eval_images"] == 12 and summary["eval_images"] > 0
    texts = [t for s in read_samples(list_shards(str(tmp_path / "oc" / "train"))) for t in sample_texts(s)]
    texts += [t for s in read_samples(list_shards(str(tmp_path / "oc" / "eval"))) for t in sample_texts(s)]
    assert "same bird animals" in texts and "bird 1 some author 01 animals birds" in texts


def test_pipeline_errors_are_one_sentence(tmp_path, capsys):
    assert main(["filter", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "f")]) == 2
    assert "openalign ingest" in capsys.readouterr().err
    make_folder(tmp_path / "raw", n=3)
    main(["ingest", str(tmp_path / "raw"), "--out", str(tmp_path / "p.parquet"), "--quiet", "--workers", "1"])
    assert main(["filter", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "f"), "min_short_sde=3"]) == 2
    assert "did you mean min_short_side" in capsys.readouterr().err
    assert main(["shard", str(tmp_path / "p.parquet"), "--keep", str(tmp_path / "nokeep"), "--out",
                 str(tmp_path / "s")]) == 2
    assert "no keep-list" in capsys.readouterr().err


def test_shard_without_keep_lists_and_from_another_directory(tmp_path, capsys, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    make_folder(tmp_path / "raw", n=6)
    assert main(["ingest", str(tmp_path / "raw"), "--out", str(tmp_path / "pairs.parquet"), "--quiet",
                 "--workers", "1"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # before: 0 samples, "missing_file 12", rc 0 (paths were relative to the cwd)
    assert main(["shard", str(tmp_path / "pairs.parquet"), "--out", "shards", "--quiet", "--workers", "1"]) == 0
    assert json.loads((elsewhere / "shards" / "manifest.json").read_text())["n_samples"] == 6  # no --keep: every pair
    # a pair table whose (relative) paths resolve nowhere from here: one sentence, not empty shards
    table = pq.read_table(tmp_path / "pairs.parquet")
    relative = [str(p).replace(str(tmp_path) + "/", "") for p in table.column("path").to_pylist()]
    pq.write_table(table.set_column(table.schema.get_field_index("path"), "path", pa.array(relative)),
                   tmp_path / "old.parquet")
    mark_ingested(tmp_path / "old.parquet")
    capsys.readouterr()
    assert main(["shard", str(tmp_path / "old.parquet"), "--out", "s2", "--quiet", "--workers", "1"]) == 2
    assert "none of the 6 source files checked" in capsys.readouterr().err


def test_a_damaged_keep_list_report_is_one_sentence(tmp_path):
    # Before: a data.keep directory whose report was not JSON (or lacked its input) gave a traceback.
    import pytest

    from openalign.config import ConfigError
    from openalign.data.pairs import pair_table_of

    (tmp_path / "filter_report.json").write_text('{"stage": "filter", "inp')
    with pytest.raises(ConfigError, match="filter_report.json is damaged"):
        pair_table_of(tmp_path)
    (tmp_path / "filter_report.json").write_text('{"stage": "filter"}')
    with pytest.raises(ConfigError, match="is damaged"):
        pair_table_of(tmp_path)


def test_stages_that_find_nothing_to_work_on_say_so(tmp_path, capsys):
    # Before: filter and shard ran on nothing and reported success (0 pairs, 0 shards).
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "broken.jpg").write_bytes(b"not an image")
    (tmp_path / "raw" / "broken.txt").write_text("a broken picture of a thing")
    assert main(["ingest", str(tmp_path / "raw"), "--out", str(tmp_path / "none.parquet"), "--quiet"]) == 0
    assert main(["filter", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "f0"), "--quiet"]) == 2
    assert "holds no pairs: nothing to filter" in capsys.readouterr().err
    make_folder(tmp_path / "good", n=4)
    assert main(["ingest", str(tmp_path / "good"), "--out", str(tmp_path / "p.parquet"), "--quiet"]) == 0
    assert main(["filter", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "f"), "--quiet",
                 "min_short_side=100000"]) == 0  # removes everything
    capsys.readouterr()
    assert main(["shard", str(tmp_path / "p.parquet"), "--keep", str(tmp_path / "f"), "--out", str(tmp_path / "s"),
                 "--quiet"]) == 2
    assert "nothing to shard: the keep-lists keep no pair of" in capsys.readouterr().err


def test_every_keep_list_report_names_its_pair_table_under_one_key(tmp_path):
    # Before: the filter report named its pair table `input`, dedup's and screen's `pairs` (where the filter report's
    # `pairs` is a count), and the keep index had to know each spelling.
    import json

    from openalign.data.pairs import KEEP_REPORTS, PAIR_TABLE, pair_table_of, write_keep_report

    for name in KEEP_REPORTS:
        out = tmp_path / name.split("_")[0]
        out.mkdir()
        written = write_keep_report(out, name, {"stage": name.split("_")[0], "pairs": 12}, "/data/pairs.parquet")
        assert json.loads((out / name).read_text())[PAIR_TABLE] == written[PAIR_TABLE] == "/data/pairs.parquet"
        assert pair_table_of(out) == "/data/pairs.parquet"
    (tmp_path / "other").mkdir()  # a report without the key is no keep-list report of this release
    (tmp_path / "other" / "filter_report.json").write_text(json.dumps({"input": "/old/pairs.parquet", "pairs": 12}))
    with pytest.raises(ConfigError, match="is damaged"):
        pair_table_of(tmp_path / "other")


def test_an_image_found_in_two_tars_under_two_names_is_read_from_one_of_them(tmp_path, capsys):
    """One image, two places: t1.tar holds it as `b.jpg`, t2.tar as `a.jpg` (web corpora repeat images under other
    keys). The stages took the image's path and member as two separate minima (t1.tar, a.jpg): a member that is
    not in that tar, so shard skipped the image as a missing file and dedup could not hash it."""
    import io

    from openalign.data.tars import TarWriter

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (300, 300, 3), dtype=np.uint8)).save(buf, "JPEG")
    for name, key, text in (("t1", "b", "a photo of the thing"), ("t2", "a", "the same thing seen again")):
        with TarWriter(tmp_path / f"{name}.tar") as writer:
            writer.write({"__key__": key, "jpg": buf.getvalue(), "txt": text})
    pairs = str(tmp_path / "pairs.parquet")
    assert main(["ingest", str(tmp_path / "t1.tar"), str(tmp_path / "t2.tar"), "--out", pairs, "--quiet",
                 "--workers", "1"]) == 0
    [item] = sources.pair_table_items(pairs)  # as eval and embed read a pair table
    assert (item.path, item.member) == (str(tmp_path / "t1.tar"), "b.jpg") and len(item.texts) == 2
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "copy.jpg").write_bytes(buf.getvalue())
    assert main(["dedup", pairs, "--against", str(tmp_path / "held"), "--out", str(tmp_path / "dedup"), "--quiet",
                 "--workers", "1"]) == 0
    report = json.loads((tmp_path / "dedup" / "dedup_report.json").read_text())
    assert report["removed_pairs"] == 2, report  # the copy is found, so both its pairs go
    assert main(["shard", pairs, "--out", str(tmp_path / "shards"), "--quiet", "--workers", "1"]) == 0
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["n_samples"] == 1 and not manifest["skipped"], manifest
    sample = next(read_samples(list_shards(str(tmp_path / "shards"))))
    assert sorted(sample_texts(sample)) == ["a photo of the thing", "the same thing seen again"]
