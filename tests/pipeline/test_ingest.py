import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from openalign.config import ConfigError
from openalign.data import images
from openalign.pipeline.ingest import IngestOptions, ingest


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def rgb(w=320, h=240, seed=0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when displayed
    return encode(rgb(300, 200, seed=5), "JPEG", exif=exif)


def malformed_folder(root):
    """One file of every kind ingest must handle; returns {file name: expected outcome}."""
    transparent = Image.new("RGBA", (260, 260), (255, 0, 0, 0))
    sixteen = Image.fromarray(np.full((240, 250), 40000, dtype=np.uint16))
    files = {
        "good.jpg": (encode(rgb(seed=1), "JPEG"), "pair"),
        "fine.webp": (encode(rgb(seed=2), "WEBP"), "pair"),
        "empty.jpg": (b"", "empty"),
        "garbage.png": (b"this is not an image at all", "unreadable"),
        "truncated.jpg": (encode(rgb(seed=3), "JPEG")[:3000], "truncated"),
        "truncated.png": (encode(rgb(seed=4), "PNG")[:-40], "truncated"),
        "bomb.png": (encode(Image.new("L", (800, 800)), "PNG"), "too_many_pixels"),
        "cmyk.jpg": (encode(rgb(seed=6).convert("CMYK"), "JPEG"), "cmyk"),
        "palette.png": (encode(rgb(seed=7).convert("P"), "PNG"), "palette"),
        "sixteen.png": (encode(sixteen, "PNG"), "high_bit_depth"),
        "alpha.png": (encode(transparent, "PNG"), "alpha"),
        "rotated.jpg": (rotated_jpeg(), "exif_rotated"),
        "no_caption.jpg": (encode(rgb(seed=8), "JPEG"), "no_text"),
    }
    for name, (data, _) in files.items():
        (root / name).write_bytes(data)
        if name != "no_caption.jpg":
            (root / name).with_suffix(".txt").write_text(f"caption of {name}\t  second part ")  # one line: one pair
    return {name: outcome for name, (_, outcome) in files.items()}


def test_every_malformed_kind_is_counted_and_no_good_pair_is_lost(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    expected = malformed_folder(folder)
    manifest = ingest([str(folder)], tmp_path / "pairs.parquet", IngestOptions(max_pixels=500_000, workers=2),
                      progress=False)
    pairs = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    rejects = pq.read_table(tmp_path / "pairs.rejects.parquet").to_pylist()
    by_name = {p["path"].rsplit("/", 1)[1]: p for p in pairs}
    rejected = {r["path"].rsplit("/", 1)[1]: r["reason"] for r in rejects}
    for name, outcome in expected.items():
        if outcome in images.REJECT_REASONS or outcome == "no_text":
            assert rejected[name] == outcome, name
        else:
            assert name in by_name, f"good pair {name} lost"
            if outcome != "pair":
                assert outcome in by_name[name]["conversions"].split(","), name
    assert len(pairs) + len(rejects) == len(expected)
    assert manifest.rejected == {"empty": 1, "unreadable": 1, "truncated": 2, "too_many_pixels": 1, "no_text": 1}
    assert manifest.conversions["exif_rotated"] == 1 and manifest.conversions["alpha"] == 1
    # sizes are as displayed; whitespace runs become one space; keys are content hashes
    assert (by_name["rotated.jpg"]["width"], by_name["rotated.jpg"]["height"]) == (200, 300)
    assert by_name["good.jpg"]["text"] == "caption of good.jpg second part"
    assert len({p["image_key"] for p in pairs}) == len(pairs) and len(by_name["good.jpg"]["uid"]) == 32
    assert json.loads((tmp_path / "pairs.manifest.json").read_text())["pairs"] == len(pairs)


def test_to_rgb_conversions():
    transparent = images.load_rgb(encode(Image.new("RGBA", (4, 4), (255, 0, 0, 0)), "PNG"))
    assert transparent.getpixel((0, 0)) == (255, 255, 255)  # white, not black
    sixteen = images.load_rgb(encode(Image.fromarray(np.full((4, 4), 65535, dtype=np.uint16)), "PNG"))
    assert sixteen.getpixel((0, 0)) == (255, 255, 255)
    upright = images.load_rgb(rotated_jpeg())
    assert upright.size == (200, 300) and upright.mode == "RGB"
    assert images.load_rgb(encode(rgb().convert("CMYK"), "JPEG")).mode == "RGB"


def test_tables_and_webdataset_sources(tmp_path):
    (tmp_path / "a.jpg").write_bytes(encode(rgb(seed=1), "JPEG"))
    (tmp_path / "t.csv").write_text("file,caption\na.jpg,a red thing\nmissing.jpg,gone\n"
                                    "https://example.com/x.jpg,remote one\n")
    (tmp_path / "t.jsonl").write_text(json.dumps({"file": "a.jpg", "caption": "same image, other text"}) + "\n")
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for key, parts in {"000": {"jpg": encode(rgb(seed=2), "JPEG"), "txt": b"from a shard",
                                   "json": b'{"url": "http://x/0.jpg"}'},
                           "001": {"jpg": b"broken", "txt": b"bad one"}}.items():
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    options = IngestOptions(image_column="file", text_column="caption", workers=1)
    manifest = ingest([str(tmp_path / "t.csv"), str(tmp_path / "t.jsonl"), str(tmp_path / "s.tar")],
                      tmp_path / "out" / "pairs.parquet", options, progress=False)
    pairs = pq.read_table(tmp_path / "out" / "pairs.parquet").to_pylist()
    assert [p["text"] for p in pairs] == ["a red thing", "same image, other text", "from a shard"]
    assert pairs[0]["image_key"] == pairs[1]["image_key"] and pairs[0]["uid"] != pairs[1]["uid"]
    assert pairs[2]["member"] == "000.jpg" and pairs[2]["url"] == "http://x/0.jpg"
    assert manifest.rejected == {"unreadable": 1, "remote_not_fetched": 1, "missing_file": 1}
    assert manifest.images == 2


def test_a_table_given_as_a_folder_of_parts_or_a_glob_is_read_as_the_table(tmp_path):
    """A table of image paths written in parts (Spark's part files, _SUCCESS and hidden checksums beside them) or named
    by a glob gives the pairs the same rows in one table give, in the parts' natural order; the parts layout writes
    the pair table as a folder of the tasks' parts, which every stage reads as the file."""
    from openalign.cli import main

    picture_folder(tmp_path / "img", 12)
    rows = [f"{tmp_path / 'img' / f'{i}.png'},picture {i}" for i in range(12)]
    (tmp_path / "whole.csv").write_text("image,text\n" + "\n".join(rows) + "\n")
    parts = tmp_path / "parts"
    parts.mkdir()
    for number, chunk in ((2, rows[:4]), (10, rows[4:8]), (11, rows[8:])):  # part-2 before part-10
        (parts / f"part-{number}.csv").write_text("image,text\n" + "\n".join(chunk) + "\n")
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-2.csv.crc").write_bytes(b"x")
    options = IngestOptions(workers=1)
    whole = ingest([str(tmp_path / "whole.csv")], tmp_path / "whole.parquet", options, progress=False)
    texts = pq.read_table(tmp_path / "whole.parquet").column("text").to_pylist()
    assert whole.pairs == 12 and texts == [f"picture {i}" for i in range(12)]
    for source in (parts, str(parts / "part-*.csv")):
        ingest([str(source)], tmp_path / "p.parquet", options, progress=False)
        assert pq.read_table(tmp_path / "p.parquet").column("text").to_pylist() == texts
    assert main(["ingest", str(parts), "--out", str(tmp_path / "folder.parquet"), "--layout", "parts", "--workers",
                 "2", "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "folder.parquet").iterdir()) == [f"part-{i:06d}.parquet" for i in range(3)]
    assert pq.read_table(tmp_path / "folder.parquet").column("text").to_pylist() == texts
    assert main(["filter", str(tmp_path / "folder.parquet"), "--out", str(tmp_path / "f"), "--quiet",
                 "min_short_side=1"]) == 0
    with pytest.raises(ConfigError, match="matches no file"):
        ingest([str(tmp_path / "nothing-*.csv")], tmp_path / "n.parquet", options, progress=False)


def test_bad_sources_fail_in_one_sentence(tmp_path):
    (tmp_path / "t.csv").write_text("picture,text\na.jpg,x\n")  # `path` would be found: the columns of every reader
    with pytest.raises(ConfigError, match="no image column: none of image, .*--image-column"):
        ingest([str(tmp_path / "t.csv")], tmp_path / "p.parquet", progress=False)
    with pytest.raises(ConfigError, match="no column 'img'.*--image-column"):
        ingest([str(tmp_path / "t.csv")], tmp_path / "p.parquet", IngestOptions(image_column="img"), progress=False)
    with pytest.raises(ConfigError, match="does not exist"):
        ingest([str(tmp_path / "nope")], tmp_path / "p.parquet", progress=False)
    with pytest.raises(ConfigError, match=".parquet"):
        ingest([str(tmp_path)], tmp_path / "p.csv", progress=False)


def test_tables_are_read_row_by_row_never_all_or_nothing(tmp_path):
    # Before: one invalid UTF-8 byte failed the whole CSV ("CSV Error on Line: 3") and every good row was lost.
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(encode(rgb(seed=i), "JPEG"))
    (tmp_path / "pairs.csv").write_bytes(b"image,text\n0.jpg,a good caption\n1.jpg,caf\xe9 latin-1 caption\n"
                                         b"2.jpg,too,many,fields\n2.jpg,the last good row\n")
    (tmp_path / "pairs.jsonl").write_bytes(b'{"image": "0.jpg", "text": "json one"}\n{"image": broken\n'
                                           b'{"image": "1.jpg", "text": "caf\xe9"}\n')
    manifest = ingest([str(tmp_path / "pairs.csv"), str(tmp_path / "pairs.jsonl")], tmp_path / "p.parquet",
                      IngestOptions(workers=1), progress=False)
    texts = sorted(pq.read_table(tmp_path / "p.parquet").column("text").to_pylist())
    assert texts == ["a good caption", "caf\ufffd", "caf\ufffd latin-1 caption", "json one", "the last good row"]
    assert manifest.rejected == {"bad_row": 2} and manifest.repaired == {"rows_with_invalid_utf8": 2}
    details = pq.read_table(tmp_path / "p.rejects.parquet").column("detail").to_pylist()
    assert any(d.startswith("line 4:") for d in details) and any(d.startswith("line 2: not JSON") for d in details)


def test_only_regular_files_are_inputs_and_paths_are_absolute(tmp_path, monkeypatch):
    import os

    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "good.jpg").write_bytes(encode(rgb(seed=1), "JPEG"))
    (folder / "good.txt").write_text("a good caption")
    os.mkfifo(folder / "x.jpg")  # before: ingest blocked forever reading it
    (folder / "x.txt").write_text("a fifo")
    monkeypatch.chdir(tmp_path)
    manifest = ingest(["imgs"], tmp_path / "p.parquet", IngestOptions(workers=1), progress=False)
    assert manifest.pairs == 1 and manifest.rejected == {"not_a_file": 1}
    path = pq.read_table(tmp_path / "p.parquet").column("path")[0].as_py()
    assert path == str(folder / "good.jpg")  # absolute: `shard` run from anywhere finds it
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        ingest(["imgs"], tmp_path / "p.parquet" / "q.parquet", IngestOptions(workers=1), progress=False)


def test_reject_details_are_the_same_on_every_run(tmp_path):
    """Pillow's messages name the object they failed on by address; the rejects table does not."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "broken.jpg").write_bytes(b"not an image")
    (tmp_path / "imgs" / "broken.txt").write_text("a caption")
    ingest([str(tmp_path / "imgs")], tmp_path / "pairs.parquet", IngestOptions(workers=1), progress=False)
    detail = pq.read_table(tmp_path / "pairs.rejects.parquet").column("detail")[0].as_py()
    assert detail == "unreadable: UnidentifiedImageError: cannot identify image file <_io.BytesIO>"


def picture_folder(root, n: int, seed: int = 0):
    root.mkdir(parents=True)
    for i in range(n):
        Image.fromarray(np.full((240, 260, 3), (seed * 40 + i * 9) % 255, np.uint8)).save(root / f"{i}.png")
        (root / f"{i}.txt").write_text(f"picture number {i} of set {seed}")
    return root


def test_an_interrupted_ingest_leaves_nothing_that_looks_finished(tmp_path, monkeypatch, capsys):
    # Before: the local ingest renamed its partial table into place in a `finally` (Ctrl-C left 107,260 of
    # 300,000 rows and no manifest, and `filter` took it); a rerun left the old manifest beside a new partial table.
    from conftest import interrupt_after, leftovers
    from openalign import cli
    from openalign.pipeline import ingest as ingest_lib

    out = tmp_path / "out" / "pairs.parquet"
    first, second = picture_folder(tmp_path / "a", 6), picture_folder(tmp_path / "b", 6, seed=1)
    args = ["ingest", "--out", str(out), "--quiet", "--workers", "1"]
    with monkeypatch.context() as patch:
        interrupt_after(patch, ingest_lib, "examine", 3)
        with pytest.raises(KeyboardInterrupt):
            cli.main(args[:1] + [str(first)] + args[1:])
    assert not out.parent.exists() and leftovers(tmp_path) == []  # not even the folder made for it
    assert cli.main(args[:1] + [str(first)] + args[1:]) == 0
    table = out.read_bytes()
    with monkeypatch.context() as patch:  # a rerun from another source, killed: the old manifest goes first
        interrupt_after(patch, ingest_lib, "examine", 3)
        with pytest.raises(KeyboardInterrupt):
            cli.main(args[:1] + [str(second)] + args[1:])
    assert out.read_bytes() == table and not out.with_suffix(".manifest.json").exists() and leftovers(tmp_path) == []
    capsys.readouterr()
    assert cli.main(["filter", str(out), "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert "pairs.manifest.json beside it, so the ingest that wrote it did not finish" in err and "Traceback" not in err
    assert not (tmp_path / "f").exists()


def test_a_pair_table_that_is_not_the_one_its_manifest_describes_is_refused(tmp_path, capsys):
    from openalign import cli

    out = tmp_path / "pairs.parquet"
    assert cli.main(["ingest", str(picture_folder(tmp_path / "a", 6)), "--out", str(out), "--quiet"]) == 0
    table = pq.read_table(out)
    pq.write_table(table.slice(0, 4), out)  # replaced behind the manifest's back
    assert cli.main(["filter", str(out), "--out", str(tmp_path / "f")]) == 2
    assert "holds 4 pairs but pairs.manifest.json says 6" in capsys.readouterr().err
    out.with_suffix(".manifest.json").write_text("{not json")
    assert cli.main(["filter", str(out), "--out", str(tmp_path / "f")]) == 2
    assert "is damaged (not JSON)" in capsys.readouterr().err


def test_a_missing_source_among_good_ones_writes_nothing(tmp_path, capsys):
    # Before: "source does not exist", yet the rows of the good source before it were written.
    from openalign import cli

    out = tmp_path / "out" / "pairs.parquet"
    good = picture_folder(tmp_path / "a", 3)
    assert cli.main(["ingest", str(good), str(tmp_path / "nonexistent"), "--out", str(out), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_symlink_loops_and_repeated_links_list_each_directory_once(tmp_path):
    # Before: os.walk(followlinks=True) turned 3 images into 123 pairs through one `loop -> .` link, and two links
    # made the walk exponential.
    import os

    from openalign.data.sources import folder_files

    root = picture_folder(tmp_path / "raw", 2)
    sub = picture_folder(root / "sub", 1, seed=3)
    os.symlink(".", root / "loop")
    assert len(list(folder_files(root))) == 3  # (before: 123)
    os.symlink("sub", root / "a")
    os.symlink("sub", root / "b")
    os.symlink("..", sub / "up")
    files = list(folder_files(root))
    assert len(files) == 3 and len({os.path.realpath(f) for f in files}) == 3
    manifest = ingest([str(root)], tmp_path / "pairs.parquet", IngestOptions(workers=1), progress=False)
    assert manifest.pairs == 3


@pytest.mark.parametrize("layout", ["files", "table"])
def test_an_interrupted_task_ingest_redoes_the_tasks_whose_captions_or_images_changed(tmp_path, monkeypatch, layout):
    # Before: a `files` task was keyed by its images alone (an edited caption was ignored), a table task by the
    # table file (a replaced image was ignored).
    from conftest import interrupt_after
    from openalign.pipeline import ingest as ingest_lib
    from openalign.data.engine import Engine

    folder = picture_folder(tmp_path / "raw", 4)
    if layout == "table":
        (tmp_path / "t.csv").write_text("image,text\n" + "".join(f"raw/{i}.png,caption {i} of the table\n"
                                                                  for i in range(4)))
    sources = [str(tmp_path / "t.csv")] if layout == "table" else [str(folder)]
    out = tmp_path / "pairs.parquet"
    options = IngestOptions(workers=2, files_per_task=2)
    monkeypatch.setattr(ingest_lib, "_enough_units", lambda *args: True)  # jobs, as on Spark, on two processes

    def run():
        ingest(sources, out, options, progress=False, engine=Engine("local", workers=2))

    with monkeypatch.context() as patch:  # every task done, then killed before the table is put together
        interrupt_after(patch, ingest_lib, "staged", 0)
        with pytest.raises(KeyboardInterrupt):
            run()
    (folder / "1.txt").write_text("an edited caption")
    Image.fromarray(np.zeros((250, 300, 3), np.uint8)).save(folder / "2.png")
    run()
    rows = {Path(r["path"]).name: r for r in pq.read_table(out).to_pylist()}
    if layout == "files":
        assert rows["1.png"]["text"] == "an edited caption"
    assert (rows["2.png"]["width"], rows["2.png"]["height"]) == (300, 250)


def test_a_caption_file_of_several_lines_is_a_pair_per_line_everywhere_but_beside_img2datasets_json(tmp_path):
    # Before: ingest made one pair of "a red square a square in red" from a two-line .txt, while eval, embed and
    # the training stream read the same file as two captions. Now each reader applies one rule (shards.captions):
    # a pair per line, except beside img2dataset's .json, where the .txt is one web alt-text.
    from openalign.data import tars
    from openalign.data.sources import listing

    folder = tmp_path / "folder"
    folder.mkdir()
    Image.new("RGB", (64, 48), "red").save(folder / "a.png")
    (folder / "a.txt").write_text("a red square\n\na square in red\n")
    Image.new("RGB", (64, 48), "blue").save(folder / "b.png")
    (folder / "b.txt").write_text("a blue\nsquare on a page\n")  # img2dataset: one alt-text with a newline in it
    (folder / "b.json").write_text(json.dumps({"caption": "a blue\nsquare on a page", "url": "http://x/b.png"}))
    samples = {"a": {"png": (folder / "a.png").read_bytes(), "txt": (folder / "a.txt").read_bytes()},
               "b": {"png": (folder / "b.png").read_bytes(), "txt": (folder / "b.txt").read_bytes(),
                     "json": (folder / "b.json").read_bytes()}}
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for key, parts in samples.items():
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    expected = {"a": ["a red square", "a square in red"], "b": ["a blue square on a page"]}

    for source in (folder, tmp_path / "s.tar"):
        out = tmp_path / f"{source.stem}.parquet"
        ingest([str(source)], out, IngestOptions(workers=1), progress=False)
        pairs = pq.read_table(out).to_pylist()
        got = {}
        for pair in pairs:
            got.setdefault(Path(pair["member"] or pair["path"]).stem, []).append(pair["text"])
        assert {k: sorted(v) for k, v in got.items()} == expected
    assert {Path(i.path).stem: i.texts for i in listing(str(folder))} == expected
    read = {s["__key__"]: tars.sample_texts(s) for s in tars.read_samples([str(tmp_path / "s.tar")])}
    assert read == expected


def test_the_distinct_counts_of_a_large_table_spill(tmp_path):
    # ingest's and score's counts of distinct uids and images were count(DISTINCT ...), which DuckDB cannot spill:
    # 1M uids ran out of memory under 64 MB (50M under 512 MB in P19); now each is a grouping, which spills
    import duckdb

    from openalign.data.pairs import distinct_counts

    table = tmp_path / "t.parquet"
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT md5('u' || i) AS uid, md5('k' || (i // 3)) AS image_key FROM range(1000000) t(i)) "
                    f"TO '{table}' (FORMAT parquet)")
    config = {"memory_limit": "64MB", "threads": 2, "temp_directory": str(tmp_path / "spill")}
    with duckdb.connect(config=config) as con:
        assert distinct_counts(con, str(table)) == (1_000_000, 333_334)
