"""data/tables.py: one reader of tables for every command; the same file gives the same rows to ingest and eval."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from openalign.config import ConfigError
from openalign.data import tables
from openalign.data.sources import listing
from openalign.pipeline.ingest import IngestOptions, ingest


@pytest.fixture
def pictures(tmp_path):
    folder = tmp_path / "pictures"
    folder.mkdir()
    for name, colour in (("red.png", "red"), ("blue.png", "blue"), ("green.png", "green")):
        Image.new("RGB", (240, 220), colour).save(folder / name)
    return folder


def rows_of_every_format(tmp_path, pictures) -> dict[str, object]:
    """One table of (image, caption) rows written in each format: CSV, TSV, JSONL, a JSON array and Parquet."""
    rows = [("pictures/red.png", "a red square"), ("pictures/blue.png", "a blue square"),
            ("pictures/red.png", "red, a square")]
    (tmp_path / "t.csv").write_text("image,caption\n" + "".join(f'{i},"{t}"\n' for i, t in rows))
    (tmp_path / "t.tsv").write_text("image\tcaption\n" + "".join(f"{i}\t{t}\n" for i, t in rows))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"image": i, "caption": t}) + "\n" for i, t in rows))
    (tmp_path / "t.json").write_text(json.dumps([{"image": i, "caption": t} for i, t in rows]))
    pq.write_table(pa.table({"image": [i for i, _ in rows], "caption": [t for _, t in rows]}), tmp_path / "t.parquet")
    return rows


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json", ".parquet"])
def test_the_same_table_gives_the_same_rows_to_ingest_and_to_eval(tmp_path, pictures, suffix):
    # Before: ingest read `text` by default and eval `caption`; a .parquet was a raw table to ingest and a pair
    # table to eval; ingest's .json was an array of rows and eval's possibly a Karpathy split.
    rows = rows_of_every_format(tmp_path, pictures)
    table = tmp_path / f"t{suffix}"
    listed = listing(str(table))
    assert [(item.path, item.texts) for item in listed] == [
        (str(pictures / "red.png"), ["a red square", "red, a square"]), (str(pictures / "blue.png"), ["a blue square"])]
    out = tmp_path / f"pairs{suffix.replace('.', '-')}.parquet"
    ingest([str(table)], out, IngestOptions(workers=1), progress=False)
    pairs = pq.read_table(out).to_pylist()
    assert sorted((p["path"], p["text"]) for p in pairs) == sorted((str(tmp_path / i), t) for i, t in rows)


@pytest.mark.parametrize("separator", ["\t", ","])
def test_an_openclip_filepath_title_csv_ingests_and_evaluates(tmp_path, pictures, separator):
    # OpenCLIP's CSV convention (--csv-img-key filepath --csv-caption-key title, tab-separated by default): before,
    # ingest answered "has no column 'image'" and eval "rows need an 'image' column".
    (tmp_path / "train.csv").write_text(f"filepath{separator}title\n" + "".join(
        f"{pictures / name}{separator}a photo of {name[:-4]}\n" for name in ("red.png", "green.png")))
    ingest([str(tmp_path / "train.csv")], tmp_path / "pairs.parquet", IngestOptions(workers=1), progress=False)
    pairs = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    assert [(p["path"], p["text"]) for p in pairs] == [(str(pictures / "red.png"), "a photo of red"),
                                                       (str(pictures / "green.png"), "a photo of green")]
    assert [item.texts for item in listing(str(tmp_path / "train.csv"))] == [["a photo of red"], ["a photo of green"]]


def test_what_a_json_or_parquet_is_comes_from_its_content(tmp_path, pictures):
    (tmp_path / "split.json").write_text(json.dumps({"images": [{"filename": "red.png", "filepath": "pictures",
                                                                 "split": "test", "sentences": [{"raw": "red"}]}]}))
    (tmp_path / "rows.json").write_text(json.dumps([{"image": "pictures/red.png", "text": "red"}]))
    pq.write_table(pa.table({"uid": ["u"], "image_key": ["k"], "text": ["red"], "path": [str(pictures / "red.png")],
                             "member": pa.array([None], pa.string())}), tmp_path / "pairs.parquet")
    pq.write_table(pa.table({"key": ["0"], "status": ["success"], "error_message": pa.array([None], pa.string()),
                             "caption": ["red"], "url": ["http://x/0.png"], "jpg": [b"\xff"]}), tmp_path / "i2d.parquet")
    pq.write_table(pa.table({"image": ["pictures/red.png"], "text": ["red"]}), tmp_path / "rows.parquet")
    assert [tables.kind(tmp_path / n) for n in ("split.json", "rows.json", "pairs.parquet", "i2d.parquet",
                                                "rows.parquet")] == ["karpathy", "rows", "pairs", "img2dataset", "rows"]
    # ingest takes a Karpathy split (a pair per sentence) and refuses a pair table in one sentence
    ingest([str(tmp_path / "split.json")], tmp_path / "k.parquet", IngestOptions(workers=1), progress=False)
    assert [p["text"] for p in pq.read_table(tmp_path / "k.parquet").to_pylist()] == ["red"]
    with pytest.raises(ConfigError, match="is already a pair table"):
        ingest([str(tmp_path / "pairs.parquet")], tmp_path / "again.parquet", IngestOptions(workers=1), progress=False)


def test_columns_are_found_the_same_way_or_named(tmp_path):
    assert tables.columns(tmp_path, ["filepath", "title"]) == ("filepath", "title")
    assert tables.columns(tmp_path, ["url", "caption", "key"]) == ("url", "caption")  # img2dataset's input
    assert tables.columns(tmp_path, ["image", "text", "caption"]) == ("image", "text")
    assert tables.columns(tmp_path, ["pic", "words"], "pic", "words") == ("pic", "words")
    assert tables.columns(tmp_path, ["image", "label"], need_text=False) == ("image", None)
    with pytest.raises(ConfigError, match=r"has no column 'img' \(columns: image, text\); name the image column "
                                          "with --image-column"):
        tables.columns(tmp_path, ["image", "text"], image_column="img")
    with pytest.raises(ConfigError, match="has no text column: none of text, caption, captions, alt, alt_text, title"):
        tables.columns(tmp_path, ["image", "label"])


def test_one_column_vocabulary_for_caption_tables_and_url_tables(tmp_path):
    # ingest's tables and extract's and fetch's URL tables had two text vocabularies (ingest: no `alt`; extract and
    # fetch: no `captions`) and two ways of matching (exact here, without regard to case there)
    for names in (["url", "caption"], ["URL", "TEXT"], ["image_url", "alt", "title"], ["url", "captions", "title"],
                  ["url", "Alt_Text", "id"], ["url", "text", "caption"]):
        image, text = tables.columns(tmp_path, names)
        assert text == tables.url_columns(str(tmp_path), names)["text"] and text is not None, names
    assert tables.columns(tmp_path, ["Image", "Caption"]) == ("Image", "Caption")
    assert tables.url_columns("t", ["Image_URL", "alt", "Width", "original_height", "page_url"]) == dict(
        url="Image_URL", text="alt", width="Width", height="original_height", page_url="page_url")
    with pytest.raises(ConfigError, match="has no url column: none of url, image_url, img_url"):
        tables.url_columns("t", ["image", "caption"])
    assert tables.url_columns("t", ["url"], need_text=False)["text"] is None


def test_a_list_of_captions_in_a_cell_is_several_captions(tmp_path, pictures):
    (tmp_path / "t.jsonl").write_text(json.dumps({"image": "pictures/red.png", "captions": ["red", "a red one"]}) + "\n")
    ingest([str(tmp_path / "t.jsonl")], tmp_path / "p.parquet", IngestOptions(workers=1), progress=False)
    assert sorted(p["text"] for p in pq.read_table(tmp_path / "p.parquet").to_pylist()) == ["a red one", "red"]
    assert listing(str(tmp_path / "t.jsonl"))[0].texts == ["red", "a red one"]


def test_a_deeply_nested_jsonl_line_is_one_bad_row_and_a_bom_or_utf16_table_is_handled(tmp_path, pictures):
    # Before: one line nested 100k deep aborted the whole ingest (RecursionError); a BOM made the first row bad; a
    # UTF-16 table gave 0 pairs and exit 0.
    deep = '{"image": ' + "[" * 100_000 + "]" * 100_000 + ', "caption": "x"}'
    lines = [json.dumps({"image": str(pictures / "red.png"), "caption": "a red square"}), deep,
             json.dumps({"image": str(pictures / "blue.png"), "caption": "a blue square"})]
    (tmp_path / "t.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    got = list(tables.rows(tmp_path / "t.jsonl"))
    assert [r.texts for r in got if not r.bad] == [["a red square"], ["a blue square"]]
    assert [r.bad for r in got if r.bad] == ["line 2: not JSON (nested too deeply)"]
    (tmp_path / "d.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        list(tables.rows(tmp_path / "d.json"))
    (tmp_path / "u.csv").write_text(f"image,caption\n{pictures / 'red.png'},a red square\n", encoding="utf-16")
    for read in (lambda: list(tables.rows(tmp_path / "u.csv")), lambda: listing(str(tmp_path / "u.csv"))):
        with pytest.raises(ConfigError, match="is UTF-16 text; openalign reads tables in UTF-8"):
            read()


def test_one_duckdb_reader_reads_every_table_format_alike(tmp_path):
    # issue 85: fetch built its own DuckDB reader (jsonl by line, csv quoted) beside this module's
    import duckdb

    from openalign.data.tables import duckdb_reader

    rows = [{"url": "http://a.example/1.jpg", "caption": 'a "quoted", multi\nline caption'},
            {"url": "http://a.example/2.jpg", "caption": "plain"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, delimiter in (("t.csv", ","), ("tabs.csv", "\t"), ("t.tsv", "\t")):
        quoted = ['"' + v.replace('"', '""') + '"' for r in rows for v in r.values()]
        body = "\n".join(delimiter.join(quoted[i:i + 2]) for i in range(0, len(quoted), 2))
        (tmp_path / name).write_text(f"url{delimiter}caption\n{body}\n")
    for name in ("t.parquet", "t.jsonl", "t.csv", "tabs.csv", "t.tsv"):
        with duckdb.connect() as con:
            found = con.execute(f"SELECT url, caption FROM {duckdb_reader(tmp_path / name)}",
                                [str(tmp_path / name)]).fetchall()
        assert [dict(zip(("url", "caption"), f)) for f in found] == rows, name


def test_a_dataset_is_a_file_a_folder_of_parts_or_a_glob(tmp_path):
    from pathlib import Path

    from openalign.data.tables import dataset

    root = tmp_path / "t"
    for name in ["part-10.parquet", "part-2.parquet", "bucket=9/a.parquet", "bucket=10/a.parquet", "_SUCCESS",
                 ".part-2.parquet.crc", "_temporary/0/part-1.parquet", "notes.txt"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    found = [str(Path(f).relative_to(root)) for f in dataset(root).files]
    assert found == ["bucket=9/a.parquet", "bucket=10/a.parquet", "part-2.parquet", "part-10.parquet"]
    assert dataset(str(root / "part-*.parquet")).files == (str(root / "part-2.parquet"), str(root / "part-10.parquet"))
    assert dataset(root / "part-2.parquet").files == (str(root / "part-2.parquet"),)
    with pytest.raises(ConfigError, match="is not a table"):
        dataset(root / "notes.txt")
    with pytest.raises(ConfigError, match="does not exist"):
        dataset(tmp_path / "missing.parquet")
    with pytest.raises(ConfigError, match="holds no parquet"):
        dataset(tmp_path / "x-*")
