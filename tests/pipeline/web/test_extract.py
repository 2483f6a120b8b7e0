"""`openalign extract` over Common Crawl WAT files, against cc2dataset's own output on the same file.

The fixtures (tests/fixtures/web/) are a generated crawl (openalign.corpora.webpages) and what cc2dataset 1.5.0's
`process_wat` made of it, run once in its own venv (make_fixtures.py holds the commands).
"""

import functools
import http.server
import io
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pyarrow.parquet as pq
import pytest

from openalign import cli
from openalign.corpora import webpages
from openalign.data.engine import Engine
from openalign.data.pairs import blake, normalize_text, pair_uid
from openalign.pipeline.web.extract import ExtractOptions, extract

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "web"
WAT = FIXTURES / "crawl-00000.warc.wat.gz"
WARC = FIXTURES / "crawl-00000.warc.gz"
TRUNCATED = FIXTURES / "truncated.warc.wat.gz"


def rows(out: Path) -> list[dict]:
    return pq.read_table(out / "candidates.parquet").to_pylist()


def cc2dataset_as_extract(name: str) -> list[tuple[str, str]]:
    """cc2dataset's rows with the differences docs and pipeline/web/extract.py name applied: alts' whitespace collapsed
    and an alt left empty dropped; the pair an empty src made (the page's own URL) dropped; unique (url, alt)."""
    expected = []
    for row in json.loads((FIXTURES / name).read_text(encoding="utf-8")):
        text = normalize_text(row["alt"])
        if text and row["url"] != row["page_url"]:
            expected.append((row["url"], text))
    return list(dict.fromkeys(expected))


def test_wat_pairs_are_cc2dataset_s_apart_from_the_named_differences(tmp_path, capsys):
    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    got = rows(tmp_path / "out")
    assert [(r["url"], r["text"]) for r in got] == cc2dataset_as_extract("cc2dataset-image.json")  # order too
    raw = json.loads((FIXTURES / "cc2dataset-image.json").read_text(encoding="utf-8"))
    assert {r["page_url"] for r in got} == {r["page_url"] for r in raw}
    # what was dropped, and why, is counted; the provenance and keys are there
    manifest = json.loads((tmp_path / "out" / "candidates.manifest.json").read_text())
    counts = manifest["counts"]
    assert manifest["stage"] == "extract" and manifest["candidates"] == len(got) == 30
    dropped = (counts["scheme_data"], counts["scheme_javascript"], counts["scheme_ftp"], counts["empty_src"])
    assert dropped == (1, 1, 1, 1)
    assert counts["bad_record"] == 1 and counts["no_alt"] >= 1 and counts["empty_alt"] >= 1
    assert all(r["source"] == str(WAT) and r["offset"] > 0 and r["host"] for r in got)
    assert len({r["uid"] for r in got}) == len(got)
    # keys as a pair table's: image_key a hash of the url, uid the pair uid of (image_key, text)
    assert all(r["image_key"] == blake(r["url"].encode()) for r in got)
    assert all(r["uid"] == pair_uid(r["image_key"], r["text"]) for r in got)
    out = capsys.readouterr().out
    assert "30 candidate pairs from 11 pages in 1 file(s)" in out and "bad_record 1" in out
    assert manifest["hosts"] == len({r["host"] for r in got}) and manifest["top_hosts"][0][1] >= 2
    assert (tmp_path / "out" / "extract_report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_wat_cut_short_keeps_the_pairs_of_its_complete_records(tmp_path):
    assert cli.main(["extract", str(TRUNCATED), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert [(r["url"], r["text"]) for r in rows(tmp_path / "out")] == \
        cc2dataset_as_extract("cc2dataset-truncated.json")
    manifest = json.loads((tmp_path / "out" / "candidates.manifest.json").read_text())
    assert manifest["counts"]["truncated_record"] == 1 and manifest["candidates"] == 26


def test_the_fixtures_are_what_the_generator_writes(tmp_path):
    # the committed crawl is reproducible byte for byte from its generator (make_fixtures.py crawl)
    _, wat = webpages.write_crawl(webpages.site(seed=0, pages=12), tmp_path)
    assert wat.read_bytes() == WAT.read_bytes()
    assert (tmp_path / "crawl-00000.warc.gz").read_bytes() == (FIXTURES / "crawl-00000.warc.gz").read_bytes()
    cut = webpages.truncate_last_member(wat, tmp_path / "cut.gz")
    assert cut.read_bytes() == TRUNCATED.read_bytes()


def test_duplicates_across_files_go_and_a_rerun_redoes_only_changed_files(tmp_path):
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    shutil.copy(WAT, crawl / "a.warc.wat.gz")
    shutil.copy(WAT, crawl / "b.warc.wat.gz")  # the same pages again: every pair a duplicate
    first = extract([str(crawl)], tmp_path / "out", progress=False)
    assert first.candidates == 30 and first.duplicates_across_files == 30 and first.resumed_tasks == 0
    assert {r["source"] for r in rows(tmp_path / "out")} == {str(crawl / "a.warc.wat.gz")}  # the first kept
    table = rows(tmp_path / "out")
    again = extract([str(crawl)], tmp_path / "out", progress=False)
    assert again.resumed_tasks == 2 and rows(tmp_path / "out") == table
    shutil.copy(TRUNCATED, crawl / "a.warc.wat.gz")  # a changed input is read again, the other is not
    os.utime(crawl / "a.warc.wat.gz", ns=(1, 1))
    changed = extract([str(crawl)], tmp_path / "out", progress=False)
    assert changed.resumed_tasks == 1 and changed.per_file[str(crawl / "a.warc.wat.gz")]["candidates"] == 26
    assert changed.candidates == 30  # b still holds them all


def test_the_merge_is_one_grouping_of_keys_and_a_task_per_part_on_either_engine(tmp_path, capsys):
    """The merge's one global step groups (uid, place) pairs (a Spark job with --engine spark); each part's first rows
    are then written by a task of its own: candidates.parquet is a folder of a part per input file, in input order,
    the same on both engines, which filter and fetch read as a table; no row passes through the driver."""
    pytest.importorskip("pyspark")
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    shutil.copy(WAT, crawl / "a.warc.wat.gz")
    shutil.copy(TRUNCATED, crawl / "b.warc.wat.gz")  # its pairs are a's: duplicates across files
    (crawl / "c.jsonl").write_text("".join(json.dumps({"url": f"http://x.example/{i}.jpg", "caption": f"c {i}"}) + "\n"
                                           for i in range(5)))
    local = extract([str(crawl)], tmp_path / "local", progress=False)
    spark = extract([str(crawl)], tmp_path / "spark", engine=Engine("spark", master="local[2]"), progress=False)
    for out in ("local", "spark"):
        parts = sorted(p.name for p in (tmp_path / out / "candidates.parquet").iterdir())
        assert parts == ["part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
        assert not (tmp_path / out / "_merge").exists()
    assert pq.read_table(tmp_path / "local" / "candidates.parquet" / "part-000001.parquet").num_rows == 0  # all a's
    assert rows(tmp_path / "spark") == rows(tmp_path / "local")
    assert {r["source"] for r in rows(tmp_path / "spark")} == {str(crawl / "a.warc.wat.gz"), str(crawl / "c.jsonl")}
    same = ("candidates", "duplicates_across_files", "counts", "per_file", "hosts", "top_hosts", "languages")
    assert {k: spark.manifest[k] for k in same} == {k: local.manifest[k] for k in same}
    assert local.candidates == 35 and local.duplicates_across_files == 26

    assert cli.main(["filter", str(tmp_path / "spark" / "candidates.parquet"), "--out", str(tmp_path / "keep"),
                     "--rules", "text", "--quiet"]) == 0
    assert json.loads((tmp_path / "keep" / "filter_report.json").read_text())["pairs"] == 35
    from openalign.pipeline.web.fetch_plan import candidate_table

    assert len(candidate_table(tmp_path / "spark").files) == 3
    again = extract([str(crawl)], tmp_path / "spark", progress=False)
    assert again.resumed_tasks == 3 and rows(tmp_path / "spark") == rows(tmp_path / "local")


def test_a_url_table_written_as_a_folder_of_parts_or_named_by_a_glob(tmp_path):
    # a URL table as Spark writes it (part files, _SUCCESS, a hidden checksum): _SUCCESS was read as an input and
    # refused as neither an archive nor a table; a folder of parts or a glob of them gives the one table's candidates
    rows_of = [{"url": f"http://x.example/{i}.jpg", "caption": f"a caption {i}"} for i in range(9)]
    (tmp_path / "whole.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of))
    parts = tmp_path / "urls"
    parts.mkdir()
    for i in range(3):
        (parts / f"part-{i:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of[3 * i:3 * i + 3]))
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-00000.jsonl.crc").write_bytes(b"x")
    whole = extract([str(tmp_path / "whole.jsonl")], tmp_path / "a", progress=False)
    texts = [r["text"] for r in rows(tmp_path / "a")]
    for name, source in (("b", parts), ("c", str(parts / "part-*.jsonl"))):
        result = extract([str(source)], tmp_path / name, progress=False)
        assert result.files == 3 and [r["text"] for r in rows(tmp_path / name)] == texts == [
            f"a caption {i}" for i in range(9)] and result.candidates == whole.candidates


def test_a_rerun_with_fewer_files_removes_only_the_parts_it_wrote(tmp_path):
    """Before: every `*.parquet` in OUT/parts whose name was not a job's was unlinked, a user's file included."""
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    for name in ("a", "b", "c"):
        shutil.copy(WAT, crawl / f"{name}.warc.wat.gz")
    out = tmp_path / "out"
    extract([str(crawl)], out, progress=False)
    written = sorted(p.name for p in (out / "parts").glob("*.parquet"))
    assert len(written) == 3
    (out / "parts" / "mine.parquet").write_text("a user's file")
    (crawl / "c.warc.wat.gz").unlink()
    again = extract([str(crawl)], out, progress=False)
    assert again.candidates == 30
    assert sorted(p.name for p in (out / "parts").glob("*.parquet")) == sorted(written[:2] + ["mine.parquet"])
    assert (out / "parts" / "mine.parquet").read_text() == "a user's file"

    # a part a killed task was writing is removed by the next run (before: never, even by a successful rerun)
    (out / "parts" / ".000001.parquet.4242.tmp").write_bytes(b"half a part")
    (out / "parts" / ".notes.tmp").write_text("mine")
    extract([str(crawl)], out, progress=False)
    assert not (out / "parts" / ".000001.parquet.4242.tmp").exists() and (out / "parts" / ".notes.tmp").exists()


def test_tables_with_bytes_that_are_not_utf8_or_a_first_line_nested_too_deep(tmp_path):
    """Before: a Latin-1 CSV or TSV failed the whole run with Arrow's `ArrowInvalid: CSV conversion error to string:
    invalid UTF8 data` (after 3 retries, a traceback); a JSONL whose first line is nested 100,000 deep raised
    RecursionError while its columns were looked for."""
    for name, sep in (("latin.csv", b","), ("latin.tsv", b"\t")):
        table = tmp_path / name
        table.write_bytes(b"url" + sep + b"caption\nhttp://a.example/1.jpg" + sep + b"caf\xe9 au lait on a table\n"
                          b"http://a.example/2.jpg" + sep + b"a good caption here\n")
        result = extract([str(table)], tmp_path / f"out-{name}", ExtractOptions(language=False), progress=False)
        texts = sorted(r["text"] for r in pq.read_table(result.table).to_pylist())
        assert texts == ["a good caption here", "caf\ufffd au lait on a table"]
        assert result.counts["rows_with_invalid_utf8"] == 1 and "bad_record" not in result.counts
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n" + json.dumps({"url": "http://a.example/x.jpg",
                                                                       "caption": "a cat on a mat"}) + "\n")
    result = extract([str(deep)], tmp_path / "out-deep", ExtractOptions(language=False), progress=False)
    assert result.candidates == 1 and result.counts["bad_record"] == 1


def test_a_csv_row_of_the_wrong_shape_is_that_row_alone(tmp_path):
    """Before: one row with an extra field, or a quote never closed (which takes in every line after it), refused the
    whole table ("CSV parse error: Expected 2 columns, got 3"); ingest rejects the row alone, and so does extract."""
    table = tmp_path / "urls.csv"
    table.write_text('url,caption\n"http://a.example/1.jpg,a quote never closed\nhttp://a.example/2.jpg,a good one\n'
                     "http://a.example/3.jpg,a caption,with an extra field\nhttp://a.example/4.jpg,another good one\n")
    result = extract([str(table)], tmp_path / "out", ExtractOptions(language=False), progress=False)
    assert sorted(r["url"] for r in pq.read_table(result.table).to_pylist()) == [
        "http://a.example/2.jpg", "http://a.example/4.jpg"]
    assert result.counts["bad_record"] == 2 and result.counts["rows"] == 4


def test_a_csv_row_of_the_wrong_shape_with_bytes_that_are_not_utf8_is_that_row_alone(tmp_path, capsys):
    """Before: Arrow decodes a row it cannot split as UTF-8 before its handler sees it, so such a row printed a
    traceback ("Exception ignored in ... UnicodeDecodeError") and refused the whole table ("CSV parse error")."""
    table = tmp_path / "urls.csv"
    table.write_bytes(b"url,caption\nhttp://a.example/1.jpg,a good one\nhttp://a.example/2.jpg,caf\xe9,extra field\n"
                      b"http://a.example/3.jpg,caf\xe9 au lait\nhttp://a.example/4.jpg,another good one\n")
    result = extract([str(table)], tmp_path / "out", ExtractOptions(language=False), progress=False)
    assert sorted(r["text"] for r in pq.read_table(result.table).to_pylist()) == [
        "a good one", "another good one", "caf\ufffd au lait"]
    assert (result.counts["bad_record"], result.counts["rows"], result.counts["rows_with_invalid_utf8"]) == (1, 4, 2)
    assert "Traceback" not in capsys.readouterr().err


def test_an_input_that_is_not_a_regular_file_or_an_out_inside_a_source_is_one_sentence(tmp_path, capsys):
    # Before: a FIFO, /dev/stdin or /dev/null "does not exist"; an --out inside a source folder was read back as
    # input on the rerun, which refused with "holds no WARC records".
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for source in (str(fifo), "/dev/null"):
        assert cli.main(["extract", source, "--out", str(tmp_path / "o"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"{source} is not a regular file" in err and "does not exist" not in err
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    shutil.copy(WAT, crawl / "a.warc.wat.gz")
    assert cli.main(["extract", str(crawl), "--out", str(crawl / "out"), "--quiet"]) == 2
    assert "is inside the source folder" in capsys.readouterr().err and not (crawl / "out").exists()


def test_bad_sources_are_one_sentence(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not an archive")
    assert cli.main(["extract", str(text), "--out", str(tmp_path / "o")]) == 2
    assert "holds no WARC records" in capsys.readouterr().err
    warcinfo_only = tmp_path / "info.warc.gz"
    warcinfo_only.write_bytes(WAT.read_bytes()[:_first_member_length(WAT)])
    assert cli.main(["extract", str(warcinfo_only), "--out", str(tmp_path / "o")]) == 2
    assert "holds no WARC records" in capsys.readouterr().err
    assert cli.main(["extract", str(tmp_path / "missing.wat.gz"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o" / "candidates.parquet").exists()


def _first_member_length(path: Path) -> int:
    import zlib

    inflate = zlib.decompressobj(31)
    inflate.decompress(path.read_bytes())
    return len(path.read_bytes()) - len(inflate.unused_data)


def pages_parsed_independently(pages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(url, alt) of every `<img>` of (page url, HTML) pairs by Python's html.parser and urljoin, under the rules
    pipeline/web/extract.py documents for WARC pages: an alt is required and its whitespace collapsed; the source is
    data-src, else src, else srcset's first; resolved against the page's <base>; http(s) only; unique, in order."""
    found = []
    for page_url, html in pages:
        href, images = webpages.parse_page(html)
        base = urljoin(page_url, href.strip())
        for attrs in images:
            text = " ".join((attrs.get("alt") or "").split()) if "alt" in attrs else ""
            src = ((attrs.get("data-src") or "").strip() or (attrs.get("src") or "").strip()
                   or (attrs.get("srcset") or "").strip().split(",")[0].strip().split(" ")[0])
            if not text or not src:
                continue
            url = src if src.lower().startswith(("http://", "https://")) else urljoin(base, src)
            if urlsplit(url).scheme.lower() in ("http", "https") and urlsplit(url).hostname:
                found.append((url, text))
    return list(dict.fromkeys(found))


def test_warc_pages_give_their_img_tags(tmp_path):
    assert cli.main(["extract", str(WARC), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    got = rows(tmp_path / "out")
    pages = webpages.site(seed=0, pages=12)
    assert [(r["url"], r["text"]) for r in got] == pages_parsed_independently([(p.url, p.html()) for p in pages])
    lazy = {r["text"]: r["url"] for r in got}
    assert lazy["lazy loaded photo"].endswith("/lazy/real.jpg") and lazy["only a srcset"].endswith("/set/a-1x.jpg")
    assert lazy["picture fallback"].endswith("/pic/fallback.jpg")
    declared = [r for r in got if r["width"] is not None]
    assert declared and all(r["width"] in (320, 640, 1024) and r["height"] in (240, 480, 768) for r in declared)
    # the WAT of the same crawl gives the same pairs, but for its one broken record (page 1) and the rules that
    # differ between the two (data-src, srcset: a WAT's links hold IMG@/src only)
    wat = {(r["url"], r["text"]) for r in rows(_extract(WAT, tmp_path / "wat"))}
    assert wat < {(r["url"], r["text"]) for r in got}
    assert {r["page_url"] for r in got} - {p.url for p in pages} == set()


def _extract(path: Path, out: Path) -> Path:
    extract([str(path)], out, progress=False)
    return out


@pytest.mark.skipif(shutil.which("wget") is None, reason="GNU wget writes the crawler's WARC (make sysdeps)")
def test_a_warc_written_by_wget_gives_the_served_pages_img_tags(tmp_path):
    root = tmp_path / "site"
    pages = webpages.site(seed=1, pages=8)
    links = []
    for page in pages:
        path = root / page.url.split("://", 1)[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page.html(), encoding="utf-8")
        links.append(f'<a href="/{page.url.split("://", 1)[1]}">{page.title}</a>')
    (root / "index.html").write_text(f"<html><body>{''.join(links)}</body></html>", encoding="utf-8")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    try:  # generous retries and timeouts: a loaded machine (Spark's JVMs of earlier tests) once made it miss a page
        wget = subprocess.run(["wget", "--recursive", "--level=1", "--no-host-directories", "-e", "robots=off",
                               "--tries=3", "--waitretry=1", "--timeout=60", "--directory-prefix",
                               str(tmp_path / "mirror"), "--warc-file", str(tmp_path / "crawl"),
                               f"{origin}/index.html"],
                              timeout=300, check=False, capture_output=True, text=True)
    finally:
        server.shutdown()
        server.server_close()
    from warcio.archiveiterator import ArchiveIterator  # the archive read independently of extract's FastWARC

    with open(tmp_path / "crawl.warc.gz", "rb") as stream:
        archived = [r.rec_headers.get_header("WARC-Target-URI") for r in ArchiveIterator(stream)
                    if r.rec_type == "response" and r.http_headers.get_statuscode() == "200"]
    assert len(archived) == len(pages) + 1, f"wget archived {len(archived)} pages: {wget.stderr[-2000:]}"
    assert cli.main(["extract", str(tmp_path / "crawl.warc.gz"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    served = [(f"{origin}/{p.url.split('://', 1)[1]}", p.html()) for p in pages]
    got = [(r["url"], r["text"]) for r in rows(tmp_path / "out")]
    assert sorted(got) == sorted(pages_parsed_independently(served)) and len(got) > 20


def test_url_tables_made_elsewhere_become_candidate_tables_with_their_sizes(tmp_path, capsys):
    import pyarrow as pa

    coyo = tmp_path / "coyo.parquet"  # COYO-700M's columns (its dataset card), a few of them
    pq.write_table(pa.table({
        "id": pa.array([7, 8, 9, 10, 11, 12], pa.int64()),
        "url": ["https://a.example/1.jpg", "http://b.example/2.png", "data:image/png;base64,AA",
                "https://a.example/1.jpg", "//c.example/3.jpg", "https://d.example/4.jpg"],
        "text": ["a red bicycle", "  two   cats ", "inline", "a red bicycle", "scheme-relative", None],
        "width": pa.array([640, 800, 1, 640, 10, 5], pa.int32()),
        "height": pa.array([480, 600, 1, 480, 10, 5], pa.int32()),
        "image_phash": ["f0"] * 6, "clip_similarity_vitb32": [0.31] * 6}), coyo)
    laion = tmp_path / "laion.parquet"  # LAION's upper-case columns, floats for sizes
    pq.write_table(pa.table({"URL": ["https://e.example/5.jpg"], "TEXT": ["a lighthouse"], "WIDTH": [1024.0],
                             "HEIGHT": [768.0], "similarity": [0.33]}), laion)
    csv = tmp_path / "urls.csv"
    csv.write_text('url,caption\nhttps://x.example/a.jpg,"a caption, with a comma"\nhttps://x.example/b.jpg,\n'
                   'ftp://x.example/c.jpg,ftp\n', encoding="utf-8")
    assert cli.main(["extract", str(coyo), str(laion), str(csv), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    got = [(r["url"], r["text"], r["width"], r["height"], r["offset"]) for r in rows(tmp_path / "out")]
    assert got == [("https://a.example/1.jpg", "a red bicycle", 640, 480, 1),
                   ("http://b.example/2.png", "two cats", 800, 600, 2),
                   ("https://e.example/5.jpg", "a lighthouse", 1024, 768, 1),
                   ("https://x.example/a.jpg", "a caption, with a comma", None, None, 1)]
    counts = json.loads((tmp_path / "out" / "candidates.manifest.json").read_text())["counts"]
    assert (counts["rows"], counts["scheme_data"], counts["relative_url"], counts["empty_alt"], counts["scheme_ftp"],
            counts["duplicate"]) == (10, 1, 1, 2, 1, 1)
    no_text = tmp_path / "no_text.csv"
    no_text.write_text("url,id\nhttps://x.example/a.jpg,1\n")
    assert cli.main(["extract", str(no_text), "--out", str(tmp_path / "o2")]) == 2
    assert "has no text column: none of text, caption" in capsys.readouterr().err


def test_a_list_of_captions_is_one_candidate_per_caption_in_the_one_vocabulary(tmp_path):
    # data/tables.py's one column vocabulary: a `captions` list (JSONL, a Parquet list column) is several captions
    # of one image, an `alt` column is the text, names matched without regard to case. Extract's own vocabulary had
    # no `captions` ("has no text column") and would have written str(['a', 'b']) for a list
    import pyarrow as pa

    jsonl = tmp_path / "captions.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in (
        {"url": "https://a.example/1.jpg", "captions": ["a red bicycle", "a bike"]},
        {"url": "https://a.example/2.jpg", "captions": "one caption"},
        {"url": "https://a.example/3.jpg", "captions": []},
        {"url": "https://a.example/4.jpg", "captions": 1999})) + "\n")
    listed = tmp_path / "listed.parquet"
    pq.write_table(pa.table({"image_url": ["https://b.example/5.jpg"],
                             "captions": pa.array([["a lighthouse", None, "a tower"]], pa.list_(pa.string()))}), listed)
    alt = tmp_path / "alt.csv"
    alt.write_text("Image_URL,Alt\nhttps://c.example/6.jpg,a harbour\n")
    assert cli.main(["extract", str(jsonl), str(listed), str(alt), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    got = [(r["url"], r["text"], r["offset"]) for r in rows(tmp_path / "out")]
    assert got == [("https://a.example/1.jpg", "a red bicycle", 1), ("https://a.example/1.jpg", "a bike", 1),
                   ("https://a.example/2.jpg", "one caption", 2), ("https://a.example/4.jpg", "1999", 4),
                   ("https://b.example/5.jpg", "a lighthouse", 1), ("https://b.example/5.jpg", "a tower", 1),
                   ("https://c.example/6.jpg", "a harbour", 1)]
    counts = json.loads((tmp_path / "out" / "candidates.manifest.json").read_text())["counts"]
    assert (counts["rows"], counts["empty_alt"]) == (6, 2)  # the empty list and the None in a list: no text


def test_stages_that_read_images_refuse_a_candidate_table_in_one_sentence(tmp_path, capsys):
    extract([str(WAT)], tmp_path / "web", progress=False)
    table = tmp_path / "web" / "candidates.parquet"
    for argv in (["shard", str(table), "--out", str(tmp_path / "s")],
                 ["dedup", str(table), "--against", str(tmp_path), "--out", str(tmp_path / "d")]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "is a candidate table from `openalign extract`: image URLs, not yet images" in err
        assert "--url_col url --caption_col text" in err and err.count("\n") == 1


def test_img2dataset_s_own_reader_reads_the_candidate_table(tmp_path):
    # img2dataset-reader.json: what img2dataset 1.47.0's Reader read of candidates-wat.parquet (make_fixtures.py);
    # the table extract writes today is that one, so img2dataset downloads these (url, text) pairs
    extract([str(WAT)], tmp_path / "web", progress=False)
    today = pq.read_table(tmp_path / "web" / "candidates.parquet", columns=["url", "text", "uid"])
    assert today.equals(pq.read_table(FIXTURES / "candidates-wat.parquet", columns=["url", "text", "uid"]))
    read = json.loads((FIXTURES / "img2dataset-reader.json").read_text(encoding="utf-8"))
    assert [(s["url"], s["caption"]) for s in read] == [(r["url"], r["text"]) for r in today.to_pylist()]


def _wat_of(records: list[bytes], path: Path) -> Path:
    """A WAT file of metadata records with these JSON payloads (warcio)."""
    from io import BytesIO

    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as stream:
        writer = WARCWriter(stream, gzip=True)
        for n, payload in enumerate(records):
            writer.write_record(writer.create_warc_record(f"http://p.example/{n}", "metadata", payload=BytesIO(
                payload), warc_content_type="application/json"))
    return path


def _page_json(alt_json: str, n: int = 0) -> bytes:
    # %-formatting: the template is JSON, all braces
    return ('{"Envelope": {"WARC-Header-Metadata": {"WARC-Target-URI": "http://p.example/%d"}, "Payload-Metadata": '  # noqa: UP031
            '{"HTTP-Response-Metadata": {"HTML-Metadata": {"Links": [{"path": "IMG@/src", "url": "/a%d.jpg", '
            '"alt": %s}]}}}}}' % (n, n, alt_json)).encode()


def test_a_record_with_a_lone_surrogate_is_skipped_and_counted(tmp_path):
    """JSON may escape half a UTF-16 pair ("\\ud800"): such a text cannot be hashed or written as UTF-8, so its
    record is a bad record (cc2dataset's simdjson refuses it too), and the file's other records still count."""
    wat = _wat_of([_page_json('"caf\\u00e9 \\ud800 x"', 0), _page_json('"a dog"', 1)], tmp_path / "s.warc.wat.gz")
    result = extract([str(wat)], tmp_path / "out", progress=False)
    assert [(r["url"], r["text"]) for r in rows(tmp_path / "out")] == [("http://p.example/a1.jpg", "a dog")]
    assert result.counts["bad_record"] == 1


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Python's file server, quiet, answering `Range: bytes=a-b` with 206 as object stores and CDNs do (Parquet over
    HTTP reads its footer first); it notes each request's path and range."""

    requests: list = []

    def log_message(self, *args):
        pass

    def send_head(self):
        self.requests.append((self.path, self.headers.get("Range")))
        wanted = self.headers.get("Range", "")
        path = Path(self.translate_path(self.path))
        if not wanted.startswith("bytes=") or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        first, _, last = wanted[len("bytes="):].partition("-")
        start, end = (size - int(last), size - 1) if not first else (int(first), min(int(last or size - 1), size - 1))
        stream = open(path, "rb")
        stream.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        self.end_headers()
        return io.BytesIO(stream.read(end - start + 1))


def test_inputs_given_as_urls_are_read_as_local_files_are(tmp_path, capsys):
    """fsspec URLs, here HTTP from a server on 127.0.0.1: a directory (its index page), an archive streamed with one
    GET, Parquet with range requests, a CSV; the same candidates as the same files read locally, with the URLs as
    their sources, and a rerun redoes only what the server now serves changed."""
    import pyarrow as pa

    root = tmp_path / "served"
    (root / "crawl").mkdir(parents=True)
    shutil.copy(WAT, root / "crawl" / "a.warc.wat.gz")
    shutil.copy(WARC, root / "crawl" / "b.warc.gz")
    pq.write_table(pa.table({"url": ["https://a.example/1.jpg", "https://b.example/2.jpg"],
                             "caption": ["a red bicycle", "two cats"]}), root / "coyo.parquet")
    (root / "urls.csv").write_text("url,text\nhttps://x.example/a.jpg,a lighthouse\n", encoding="utf-8")
    RangeHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        remote = extract([f"{origin}/crawl/", f"{origin}/coyo.parquet", f"{origin}/urls.csv"], tmp_path / "remote",
                         progress=False)
        local = extract([str(root / "crawl"), str(root / "coyo.parquet"), str(root / "urls.csv")],
                        tmp_path / "local", progress=False)
        assert remote.files == local.files == 4 and remote.candidates == local.candidates > 30
        mine = [{**r, "source": None} for r in rows(tmp_path / "remote")]
        assert mine == [{**r, "source": None} for r in rows(tmp_path / "local")]
        assert {r["source"] for r in rows(tmp_path / "remote")} == {
            f"{origin}/crawl/a.warc.wat.gz", f"{origin}/crawl/b.warc.gz", f"{origin}/coyo.parquet",
            f"{origin}/urls.csv"}
        archive_reads = [rng for path, rng in RangeHandler.requests if path.endswith(".warc.wat.gz")]
        assert archive_reads and all(rng is None for rng in archive_reads)  # streamed: whole GETs, no ranges
        assert any(rng for path, rng in RangeHandler.requests if path.endswith(".parquet"))
        first = rows(tmp_path / "remote")
        again = extract([f"{origin}/crawl/", f"{origin}/coyo.parquet", f"{origin}/urls.csv"], tmp_path / "remote",
                        progress=False)
        assert again.resumed_tasks == 4 and rows(tmp_path / "remote") == first
        (root / "urls.csv").write_text("url,text\nhttps://x.example/a.jpg,a lighthouse\nhttps://x.example/b.jpg,a "
                                       "harbour\n", encoding="utf-8")
        changed = extract([f"{origin}/crawl/", f"{origin}/coyo.parquet", f"{origin}/urls.csv"], tmp_path / "remote",
                          progress=False)
        assert changed.resumed_tasks == 3 and changed.candidates == remote.candidates + 1
        assert cli.main(["extract", f"{origin}/missing.warc.wat.gz", "--out", str(tmp_path / "o")]) == 2
        assert "cannot read" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


def test_inputs_on_s3_are_read_as_local_files_are(tmp_path, monkeypatch):
    """s3:// URLs (s3fs), against an S3 served by moto on 127.0.0.1: a prefix (its objects), a glob, an archive and
    a Parquet table; the same candidates as the same files read locally, an object's ETag in its task's key (a
    rerun redoes only the object that changed)."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer
    import pyarrow as pa

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in (("AWS_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="crawl")
        s3.upload_file(str(WAT), "crawl", "segments/a.warc.wat.gz")
        s3.upload_file(str(WARC), "crawl", "segments/b.warc.gz")
        table = tmp_path / "coyo.parquet"
        pq.write_table(pa.table({"url": ["https://a.example/1.jpg", "https://b.example/2.jpg"],
                                 "caption": ["a red bicycle", "two cats"]}), table)
        s3.upload_file(str(table), "crawl", "tables/coyo.parquet")
        one_core = Engine("local", workers=1)  # the tasks in this process, which holds the endpoint's variables
        remote = extract(["s3://crawl/segments", "s3://crawl/tables/*.parquet"], tmp_path / "remote",
                         engine=one_core, progress=False)
        local = extract([str(WAT), str(WARC), str(table)], tmp_path / "local", engine=one_core, progress=False)
        assert remote.files == local.files == 3 and remote.candidates == local.candidates > 30
        assert [{**r, "source": None} for r in rows(tmp_path / "remote")] == [
            {**r, "source": None} for r in rows(tmp_path / "local")]
        assert {r["source"] for r in rows(tmp_path / "remote")} == {
            "s3://crawl/segments/a.warc.wat.gz", "s3://crawl/segments/b.warc.gz", "s3://crawl/tables/coyo.parquet"}
        grown = {"url": ["https://a.example/1.jpg", "https://b.example/2.jpg", "https://c.example/3.jpg"],
                 "caption": ["a red bicycle", "two cats", "a lighthouse"]}
        pq.write_table(pa.table(grown), table)
        s3.upload_file(str(table), "crawl", "tables/coyo.parquet")
        changed = extract(["s3://crawl/segments", "s3://crawl/tables/*.parquet"], tmp_path / "remote",
                          engine=one_core, progress=False)
        assert changed.resumed_tasks == 2 and changed.candidates == remote.candidates + 1
    finally:
        server.stop()


def test_killed_mid_extract_a_rerun_gives_the_same_output(tmp_path):
    """kill -9 while the third of four files streams in (the server holds it back): no table or manifest is left,
    the finished files' parts and statuses are; the rerun reads only the files that did not finish and writes what
    an uninterrupted run writes."""
    import signal
    import sys
    import time

    root = tmp_path / "served"
    root.mkdir()
    for name, seed in (("a", 0), ("b", 1), ("c", 2), ("d", 3)):
        webpages.write_crawl(webpages.site(seed=seed, pages=6), tmp_path / "made", name=name)
        shutil.copy(tmp_path / "made" / f"{name}.warc.wat.gz", root / f"{name}.warc.wat.gz")
    release, gets = threading.Event(), []

    class HoldingC(RangeHandler):
        def do_GET(self):
            if self.path.endswith("/c.warc.wat.gz"):
                gets.append(self.path)
                if len(gets) >= 3:
                    release.wait(120)  # the task's read waits (`kind_of` looked at its first bytes and records)
            super().do_GET()

    HoldingC.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(HoldingC, directory=str(root)))
    server.handle_error = lambda *args: None  # the killed client's broken pipes
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    sources = [f"{origin}/{name}.warc.wat.gz" for name in "abcd"]
    out = tmp_path / "out"
    argv = ["extract", *sources, "--out", str(out), "--workers", "1", "--quiet"]
    code = f"from openalign import cli; raise SystemExit(cli.main({argv!r}))"
    try:
        child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while len(gets) < 3:
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "extract never asked for c's records"
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)  # the stage and its workers
        child.wait(30)
        assert not (out / "candidates.parquet").exists() and not (out / "candidates.manifest.json").exists()
        release.set()
        rerun = extract(sources, out, engine=Engine("local", workers=1), progress=False)
        whole = extract(sources, tmp_path / "whole", engine=Engine("local", workers=1), progress=False)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert rerun.resumed_tasks == 2 and whole.resumed_tasks == 0  # a and b were finished before the kill
    assert rows(out) == rows(tmp_path / "whole") and rerun.candidates == whole.candidates > 0
    assert rerun.counts == whole.counts


def test_sources_can_come_from_a_list_file(tmp_path, capsys):
    """`--sources-from` reads one source a line (a .gz too, as Common Crawl ships wat.paths.gz), beside SRC...; an
    empty command line is one sentence."""
    import gzip

    listed = tmp_path / "wat.paths.gz"
    with gzip.open(listed, "wt", encoding="utf-8") as f:
        f.write(f"# the crawl\n{WAT}\n\n{TRUNCATED}\n")
    assert cli.main(["extract", "--sources-from", str(listed), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "candidates.manifest.json").read_text())
    assert manifest["files"] == 2 and list(manifest["per_file"]) == [str(WAT), str(TRUNCATED)]
    assert cli.main(["extract", "--out", str(tmp_path / "o2")]) == 2
    assert "give the files to read" in capsys.readouterr().err
    assert cli.main(["extract", "--sources-from", str(tmp_path / "none.txt"), "--out", str(tmp_path / "o3")]) == 2
    assert "cannot read the list of sources" in capsys.readouterr().err


def test_texts_carry_their_language_and_languages_keeps_the_ones_asked_for(tmp_path, capsys):
    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "all"), "--quiet"]) == 0
    everything = rows(tmp_path / "all")
    manifest = json.loads((tmp_path / "all" / "candidates.manifest.json").read_text())
    assert manifest["languages"] == {"en": 21, "ja": 5, "de": 2, "fr": 2}  # the generator's alts
    by_text = {r["text"]: r["language"] for r in everything}
    assert by_text["東京タワーの夜景"] == "ja" and by_text["Straßenbahn in Zürich"] == "de"
    assert by_text["Café crème et croissant"] == "fr" and by_text["a sailing boat in a harbour"] == "en"
    assert all(0 < r["language_score"] <= 1 for r in everything)
    # words where the language has no spaces (null elsewhere: the text's own)
    assert {r["words"] for r in everything if r["language"] == "ja"} == {"東京 タワー の 夜景", "東京 タワー の 夜景 photo"}
    assert all(r["words"] is None for r in everything if r["language"] != "ja")
    assert "languages: en 21, ja 5, de 2, fr 2" in capsys.readouterr().out

    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "en"), "--languages", "en"]) == 0
    english = rows(tmp_path / "en")
    assert [r["uid"] for r in english] == [r["uid"] for r in everything if r["language"] == "en"]
    counts = json.loads((tmp_path / "en" / "candidates.manifest.json").read_text())["counts"]
    assert counts["other_language"] >= 9  # the nine others, and their repeats within the file
    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "en-ja"), "--languages", "en, JA"]) == 0
    assert len(rows(tmp_path / "en-ja")) == 26

    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "none"), "--no-language", "--quiet"]) == 0
    assert all(r["language"] is None and r["words"] is None for r in rows(tmp_path / "none"))
    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "unsplit"), "--no-words", "--quiet"]) == 0
    assert all(r["words"] is None for r in rows(tmp_path / "unsplit"))
    assert len(rows(tmp_path / "none")) == 30
    capsys.readouterr()
    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "x"), "--languages", "en,klingon"]) == 2
    assert "--languages klingon: not a language the identifier knows" in capsys.readouterr().err
    assert cli.main(["extract", str(WAT), "--out", str(tmp_path / "x"), "--languages", "en", "--no-language"]) == 2
    assert "--no-language leaves unknown" in capsys.readouterr().err
