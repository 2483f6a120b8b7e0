"""extract over the worst files a crawl holds: damaged gzip members, Content-Lengths that run past their record,
records and pages larger than any page, HTML nested a million deep, a page of a million images, files without a
single candidate. Each input is made here, byte by byte, as a crawl or an attacker would write it."""

import gzip
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from openalign import cli
from openalign.pipeline.web.extract import ExtractOptions, extract, html_depth

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def warc_record(kind: str, uri: str, payload: bytes, length: int | None = None) -> bytes:
    """One WARC/1.0 record; `length` a Content-Length other than the payload's own (a damaged header)."""
    content_type = "application/json" if kind == "metadata" else "application/http; msgtype=response"
    head = (f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {uri}\r\nWARC-Record-ID: <urn:uuid:{abs(hash(uri))}>"
            f"\r\nWARC-Date: 2024-01-01T00:00:00Z\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload) if length is None else length}\r\n\r\n").encode()
    return head + payload + b"\r\n\r\n"


def wat_payload(n: int, images: int = 1) -> bytes:
    links = [{"path": "IMG@/src", "url": f"/img{n}-{i}.jpg", "alt": f"a photo number {n} {i} of a cat"}
             for i in range(images)]
    return json.dumps({"Envelope": {"WARC-Header-Metadata": {"WARC-Target-URI": f"http://ex.com/p{n}"},
                                    "Payload-Metadata": {"HTTP-Response-Metadata": {"HTML-Metadata": {
                                        "Head": {}, "Links": links}}}}}).encode()


def html_response(html: bytes) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(html)}\r\n\r\n".encode() \
        + html


def wat_members(count: int) -> list[bytes]:
    """Common Crawl's layout: one gzip member per record."""
    return [gzip.compress(warc_record("metadata", f"http://ex.com/p{n}", wat_payload(n))) for n in range(count)]


def run(path: Path, out: Path, **options) -> tuple[list[dict], dict]:
    result = extract([str(path)], out, ExtractOptions(language=False, **options), progress=False)
    return pq.read_table(result.table).to_pylist(), result.counts


# ---------------------------------------------------------------------------------------------- damage

@pytest.mark.parametrize("damage", ["corrupted", "cut_in_half"])
def test_a_damaged_member_mid_file_loses_only_its_own_record(tmp_path, damage):
    # Before: 4 pairs, `truncated_record 1`, and records 6-10 counted nowhere.
    members = wat_members(10)
    bad = bytearray(members[4])
    if damage == "corrupted":
        bad[20:60] = bytes(range(40))
    else:
        bad = bad[:len(bad) // 2]
    path = tmp_path / "crawl.warc.wat.gz"
    path.write_bytes(b"".join(members[:4]) + bytes(bad) + b"".join(members[5:]))
    rows, counts = run(path, tmp_path / "out")
    assert sorted(r["page_url"] for r in rows) == sorted(f"http://ex.com/p{n}" for n in range(10) if n != 4)
    assert counts["damaged_member"] == 1 and counts.get("truncated_record", 0) == 0
    assert counts["damaged_bytes"] == len(bad)  # the member's own bytes, passed over
    assert counts["records"] == 9


def test_a_file_cut_inside_its_last_record_keeps_the_rest(tmp_path):
    members = wat_members(5)
    path = tmp_path / "cut.warc.wat.gz"
    path.write_bytes(b"".join(members[:4]) + members[4][: len(members[4]) // 2])
    rows, counts = run(path, tmp_path / "out")
    assert len(rows) == 4 and counts["truncated_record"] == 1 and "damaged_member" not in counts


@pytest.mark.parametrize("compressed", [True, False], ids=["members", "plain"])
def test_a_content_length_that_runs_past_its_record_swallows_nothing(tmp_path, compressed):
    # Before: record 1's Content-Length ran 900 bytes into records 2 and 3, whose images became record 1's page's,
    # uncounted, and FastWARC then stopped ("Invalid WARC header"): record 4 was lost.
    records = []
    for n in range(5):
        payload = html_response(b'<img src="/i%d.png" alt="the image number %d">' % (n, n))
        records.append(warc_record("response", f"http://ex.com/p{n}", payload,
                                   length=len(payload) + 900 if n == 1 else None))
    path = tmp_path / ("crawl.warc.gz" if compressed else "crawl.warc")
    path.write_bytes(b"".join(gzip.compress(r) for r in records) if compressed else b"".join(records))
    rows, counts = run(path, tmp_path / "out")
    assert sorted((r["url"], r["page_url"]) for r in rows) == [
        (f"http://ex.com/i{n}.png", f"http://ex.com/p{n}") for n in range(5)]
    assert counts["overlong_record"] == 1


def test_a_wat_record_that_runs_past_its_end_is_read_with_the_records_it_swallowed(tmp_path):
    members = [gzip.compress(warc_record("metadata", f"http://ex.com/p{n}", wat_payload(n),
                                         length=len(wat_payload(n)) + 300 if n == 2 else None)) for n in range(6)]
    path = tmp_path / "crawl.warc.wat.gz"
    path.write_bytes(b"".join(members))
    rows, counts = run(path, tmp_path / "out")
    assert sorted(r["page_url"] for r in rows) == [f"http://ex.com/p{n}" for n in range(6)]
    assert counts["overlong_record"] == 1 and "bad_record" not in counts


# ---------------------------------------------------------------------------------------------- size

def test_a_file_without_candidates_or_a_last_batch_filled_exactly_is_no_failure(tmp_path):
    # Before: part_table([]) took pc.sum of nothing (None) from a count: a TypeError, retried 3 times, a traceback.
    empty = tmp_path / "empty.warc.wat.gz"
    empty.write_bytes(gzip.compress(warc_record("metadata", "http://ex.com/", b'{"Envelope": {}}')))
    rows, counts = run(empty, tmp_path / "none")
    assert rows == [] and counts["records"] == 1
    full = tmp_path / "full.warc.wat.gz"
    full.write_bytes(gzip.compress(warc_record("metadata", "http://ex.com/p0", wat_payload(0, images=4))))
    rows, _ = run(full, tmp_path / "four", batch_rows=4)
    assert len(rows) == 4
    table = tmp_path / "urls.csv"
    table.write_text("url,caption\n")
    assert cli.main(["extract", str(table), "--out", str(tmp_path / "table"), "--quiet"]) == 0


def test_a_record_larger_than_max_record_bytes_is_skipped_unread(tmp_path):
    """A WAT record padded with 64 MiB of JSON whitespace (a 64 KiB gzip; 1 GiB took 2.2 GB of memory before): skipped
    and counted, the records after it read."""
    padded = wat_payload(1)[:-1] + b" " * (64 << 20) + b"}"
    path = tmp_path / "bomb.warc.wat.gz"
    path.write_bytes(wat_members(1)[0] + gzip.compress(warc_record("metadata", "http://ex.com/p1", padded))
                     + gzip.compress(warc_record("metadata", "http://ex.com/p2", wat_payload(2))))
    rows, counts = run(path, tmp_path / "out")
    assert sorted(r["page_url"] for r in rows) == ["http://ex.com/p0", "http://ex.com/p2"]
    assert counts["too_large_record"] == 1
    rows, counts = run(path, tmp_path / "more", max_record_bytes="128M")
    assert len(rows) == 3 and "too_large_record" not in counts


def test_a_page_longer_than_max_page_bytes_is_read_to_there(tmp_path):
    """A page is parsed up to Common Crawl's own cut (1 MiB; 400 MB of HTML reached 8.8 GB before), the images
    before the cut kept."""
    html = b'<img src="/first.png" alt="before the cut">' + b"<p>hello world</p>" * 100_000 \
        + b'<img src="/last.png" alt="after the cut">'
    path = tmp_path / "big.warc.gz"
    path.write_bytes(gzip.compress(warc_record("response", "http://ex.com/big", html_response(html)))
                     + gzip.compress(warc_record("response", "http://ex.com/next",
                                                 html_response(b'<img src="/n.png" alt="the next page">'))))
    rows, counts = run(path, tmp_path / "out", max_page_bytes="1M")
    assert sorted(r["url"] for r in rows) == ["http://ex.com/first.png", "http://ex.com/n.png"]
    assert counts["truncated_page"] == 1
    rows, counts = run(path, tmp_path / "whole", max_page_bytes="4M")
    assert len(rows) == 3 and "truncated_page" not in counts


def test_a_page_of_many_images_gives_its_first_max_page_images(tmp_path):
    many = b"".join(b'<img src="/i%d.png" alt="image number %d here">' % (i, i) for i in range(50))
    path = tmp_path / "many.warc.gz"
    path.write_bytes(gzip.compress(warc_record("response", "http://ex.com/m", html_response(many))))
    rows, counts = run(path, tmp_path / "out", max_page_images=20, batch_rows=8)
    assert [r["url"] for r in rows] == [f"http://ex.com/i{i}.png" for i in range(20)]
    assert counts["page_images_over_cap"] == 30
    wat = tmp_path / "many.warc.wat.gz"
    wat.write_bytes(gzip.compress(warc_record("metadata", "http://ex.com/p0", wat_payload(0, images=50))))
    rows, counts = run(wat, tmp_path / "wat", max_page_images=20)
    assert len(rows) == 20 and counts["page_images_over_cap"] == 30


# ---------------------------------------------------------------------------------------------- depth

def test_html_nested_past_max_depth_is_skipped_in_seconds(tmp_path):
    """lexbor's time grows with the square of the depth (10^5 nested <div>s: 25 s; 10^6: about 40 min before)."""
    deep = b"<div>" * 100_000 + b'<img src="/deep.png" alt="a deep image">' + b"</div>" * 100_000
    shallow = b"<div>" * 50 + b'<img src="/ok.png" alt="a shallow image">' + b"</div>" * 50
    path = tmp_path / "nested.warc.gz"
    path.write_bytes(b"".join(gzip.compress(warc_record("response", f"http://ex.com/{n}", html_response(html)))
                              for n, html in enumerate([deep, shallow])))
    start = time.monotonic()
    rows, counts = run(path, tmp_path / "out")
    assert time.monotonic() - start < 20  # before: 25 s in the parser alone
    assert [r["url"] for r in rows] == ["http://ex.com/ok.png"] and counts["too_deep"] == 1


def test_the_depth_estimate_is_at_least_the_real_depth():
    assert html_depth(b"<div>" * 50, cap=10) == 50
    assert html_depth(b"<div><span></span></div>" * 100, cap=10) == 2  # siblings
    assert html_depth(b"<div></span>" * 100, cap=10) == 100  # a stray end tag closes nothing (the parser's rule)
    assert html_depth(b"<p>one<p>two<li>three<img src=x><br>" * 100, cap=10) == 0  # void, implicitly closed
    assert html_depth(b"<DIV><Span><b></div>" * 100, cap=10) == 3  # an end tag closes what it names, and within
    assert html_depth(b"<div>" * 50, cap=100) == 0  # fewer `<` than the cap: not examined


# ---------------------------------------------------------------------------------------------- options

def test_the_caps_are_options_with_one_sentence_for_bad_values(tmp_path, capsys):
    from openalign.config import ConfigError

    with pytest.raises(ConfigError, match="max_depth"):
        ExtractOptions(max_depth=0)
    path = tmp_path / "ok.warc.wat.gz"
    path.write_bytes(b"".join(wat_members(2)))
    assert cli.main(["extract", str(path), "--out", str(tmp_path / "out"), "--max-page-bytes", "lots"]) == 2
    err = capsys.readouterr().err
    assert "max_page_bytes=lots must be a size" in err and "Traceback" not in err
