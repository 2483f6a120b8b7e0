"""openalign fetch: polite (robots.txt, X-Robots-Tag, per-host limits, Retry-After), safe (private addresses,
redirects, size limits; the address table itself is test_fetch_addresses.py's), every URL a status, img2dataset's
layout read back by ingest, resumable, and never touching a file it did not write."""

import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pyarrow.parquet as pq
import pytest
from PIL import Image

from openalign import cli
from openalign.config import ConfigError
from openalign.corpora.hosts import Hosts, Page, Site
from openalign.data.engine import Engine
from openalign.pipeline.web.fetch import FetchOptions, fetch
from openalign.pipeline.web.fetch_http import opted_out, retry_after

FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures"
ONE = Engine("local", workers=1)
# a robots.txt that fails is asked again after 0.2 s and 0.4 s (2 s and 4 s by default: each fetch of the test web
# waited 6 s on its host "down")
QUICK = dict(allow_private_addresses=True, timeout=1.5, read_timeout=1.5, connect_timeout=1.5, max_retry_after=5,
             robots_retry_delay=0.2)


def image(color, size=(32, 24), fmt="JPEG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, fmt)
    return out.getvalue()


def write_urls(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def statuses(out) -> dict:
    """{url: status} over every shard's parquet."""
    found = {}
    for part in sorted(out.glob("*.parquet")):
        for row in pq.read_table(part).to_pylist():
            found[row["url"]] = row["status"]
    return found


def samples(out) -> dict:
    """{key: {field: bytes}} over every shard's tar."""
    found = {}
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as t:
            for member in t.getmembers():
                key, _, field = member.name.partition(".")
                found.setdefault(key, {})[field] = t.extractfile(member).read()
    return found


def rows(out) -> list[dict]:
    found = [r for part in sorted(out.glob("*.parquet")) for r in pq.read_table(part).to_pylist()]
    return sorted(found, key=lambda r: r["key"])


# ---------------------------------------------------------------------------------------------- pure parts

def test_x_robots_tag_is_read_as_img2dataset_reads_it():
    default = ("noai", "noimageai", "noindex", "noimageindex")
    assert opted_out(["noai"], default) and opted_out(["noindex, nofollow"], default)
    assert opted_out(["openalign: noimageai"], default)
    assert not opted_out(["otherbot: noai"], default)  # another agent's directive
    assert not opted_out(["nofollow", "noarchive"], default)
    assert opted_out(["none"], default)  # none = noindex, nofollow
    assert not opted_out(["noai"], ()) and not opted_out([], default)
    # an agent named after other directives (Google's reading); before, the whole header was skipped as the agent
    # "noarchive, openalign"'s
    assert opted_out(["noarchive, openalign: noai"], default)
    assert opted_out(["otherbot: noindex, openalign: noai"], default)
    assert not opted_out(["noarchive, otherbot: noai, noimageai"], default)
    assert not opted_out(["unavailable_after: 25 Jun 2010 15:00:00 PST", "max-image-preview:none"], default)


def test_retry_after_takes_seconds_or_an_http_date():
    assert retry_after("7") == 7.0
    assert retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412500.0) == pytest.approx(10.0)
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412500.0) == 0.0
    assert retry_after("soon") is None and retry_after(None) is None and retry_after("") is None


def test_bad_options_are_one_sentence():
    with pytest.raises(ConfigError, match="--per-host"):
        FetchOptions(per_host=0)
    with pytest.raises(ConfigError, match="10.0.0.0/8"):
        FetchOptions(allow_network=("intranet",))


# ---------------------------------------------------------------------------------------------- the web

def web_sites() -> dict:
    gzip_bomb = gzip.compress(b"\0" * (8 << 20))
    return {
        "a": Site(files={**{f"/red{i}.jpg": image((40 * i, 0, 0)) for i in range(5)},
                         "/green.png": image((0, 200, 0), fmt="PNG"), "/private/secret.jpg": image((1, 2, 3)),
                         "/big.jpg": image((9, 9, 200), size=(400, 100))},
                  robots="User-agent: *\nDisallow: /private/\n",
                  pages={"/page.jpg": Page(body=b"<html>not an image</html>",
                                           headers=(("Content-Type", "application/octet-stream"),)),
                         "/html.jpg": Page(body=b"<html></html>", headers=(("Content-Type", "text/html"),)),
                         "/hang.jpg": Page(delay=4.0, body=image((5, 5, 5))),
                         "/moved.jpg": Page(status=301, redirect="a:/red1.jpg"),
                         "/loop.jpg": Page(status=302, redirect="a:/loop.jpg"),
                         "/gone.jpg": Page(status=410),
                         "/bomb.jpg": Page(body=gzip_bomb, headers=(("Content-Encoding", "gzip"),
                                                                     ("Content-Type", "image/jpeg")))},
                  latency=(0.0, 0.02)),
        "busy": Site(files={f"/b{i}.jpg": image((0, 20 * i, 0)) for i in range(10)}, throttle=3, retry_after=1),
        "optout": Site(files={"/o.jpg": image((0, 0, 250))}, opt_out="noai, noimageai"),
        "down": Site(files={"/d.jpg": image((3, 3, 3))}, robots=503),
        "slowrobots": Site(files={f"/s{i}.jpg": image((7, 7, 7 * i)) for i in range(6)}, latency=(0.05, 0.1)),
    }


@pytest.fixture(scope="module")
def web():
    with Hosts(web_sites()) as hosts:
        yield hosts


def candidate_rows(web) -> list[dict]:
    a = [("/red0.jpg", "a red square"), ("/red1.jpg", "red one"), ("/red2.jpg", "red two"), ("/red3.jpg", "red 3"),
         ("/red4.jpg", "red 4"), ("/green.png", "a green square"), ("/private/secret.jpg", "kept out by robots.txt"),
         ("/big.jpg", "a wide blue band"), ("/page.jpg", "a page"), ("/html.jpg", "html"), ("/hang.jpg", "hangs"),
         ("/moved.jpg", "moved"), ("/loop.jpg", "loops"), ("/gone.jpg", "gone"), ("/missing.jpg", "missing"),
         ("/bomb.jpg", "a bomb"), ("/red0.jpg", "the same image, another alt")]
    found = [{"url": web.url("a", p), "caption": c} for p, c in a]
    found += [{"url": web.url("busy", f"/b{i}.jpg"), "caption": f"busy {i}"} for i in range(10)]
    found += [{"url": web.url("optout", "/o.jpg"), "caption": "opted out"},
              {"url": web.url("down", "/d.jpg"), "caption": "robots.txt fails"},
              {"url": "ftp://example.org/x.jpg", "caption": "not http"}, {"url": None, "caption": "no url"}]
    found += [{"url": web.url("slowrobots", f"/s{i}.jpg"), "caption": f"slow {i}"} for i in range(6)]
    return found


EXPECTED = {"/red0.jpg": "success", "/red1.jpg": "success", "/green.png": "success", "/big.jpg": "success",
            "/private/secret.jpg": "robots_disallowed", "/page.jpg": "not_an_image", "/html.jpg": "not_an_image",
            "/hang.jpg": "timeout", "/moved.jpg": "success", "/loop.jpg": "too_many_redirects",
            "/gone.jpg": "http_410", "/missing.jpg": "http_404", "/bomb.jpg": "too_large", "/o.jpg": "opted_out",
            "/d.jpg": "robots_unreachable", "/b3.jpg": "success", "/s2.jpg": "success"}


@pytest.fixture(scope="module")
def fetched(web, tmp_path_factory):
    """One fetch of the whole web through the command line, the servers' log kept from its start."""
    tmp = tmp_path_factory.mktemp("fetch")
    table = write_urls(tmp / "urls.jsonl", candidate_rows(web))
    start = len(web.log)
    web.peaks = dict.fromkeys(web.peaks, 0)  # this run's own
    argv = ["fetch", str(table), "--out", str(tmp / "out"), "--workers", "2", "--shard-size", "8", "--per-host", "2",
            "--allow-private-addresses", "--timeout", "1.5", "--read-timeout", "1.5", "--max-bytes", "1M",
            "--http-retries", "1", "--max-redirects", "3", "--contact", "crawl@example.org", "--quiet"]
    assert cli.main(argv) == 0
    return tmp / "out", web.log[start:], dict(web.peaks)


def test_every_url_gets_one_status_of_its_kind(fetched, web):
    out, _, _ = fetched
    found = statuses(out)
    for path, status in EXPECTED.items():
        url = next(u for u in found if u and u.endswith(path))
        assert found[url] == status, (path, found[url])
    assert found["ftp://example.org/x.jpg"] == "bad_url"
    report = json.loads((out / "fetch_report.json").read_text())
    assert report["urls"] == sum(1 for r in candidate_rows(web) if r["url"]) == len(rows(out))
    assert report["left_out"]["no_url"] == 1
    assert report["statuses"]["success"] == report["successes"] == sum(1 for r in rows(out) if r["status"] == "success")
    assert (out / "fetch_report.png").stat().st_size > 0
    stats = [json.loads(p.read_text()) for p in out.glob("*_stats.json")]
    assert sum(s["count"] for s in stats) == report["urls"]
    assert sum(s["successes"] for s in stats) == report["successes"]


def test_the_servers_saw_only_polite_requests(fetched, web):
    out, log, peaks = fetched
    a = [r for r in log if r["host"] == "a"]
    assert not [r for r in a if r["path"].startswith("/private/")]  # disallowed: never asked
    assert sum(r["path"] == "/robots.txt" for r in a) == 1  # once per origin per run
    assert not [r for r in log if r["host"] == "down" and r["path"] != "/robots.txt"]
    assert 2 <= sum(r["host"] == "down" for r in log) <= 3  # robots.txt asked again later, then given up
    assert not [r for r in log if r.get("early")]  # no request during a Retry-After it had read
    busy = [r for r in log if r["host"] == "busy"]
    assert any(r.get("status") == 429 for r in busy) and statuses(out)[web.url("busy", "/b9.jpg")] == "success"
    assert max(peaks.values()) == 2  # --per-host 2, reached
    assert all("openalign/" in r["agent"] and "crawl@example.org" in r["agent"] for r in log)
    assert sum(r["path"] == "/red0.jpg" for r in a) == 1  # one URL under two alts: fetched once


def test_ingest_reads_the_output_as_img2dataset_output(fetched, tmp_path):
    out, _, _ = fetched
    assert cli.main(["ingest", str(out), "--out", str(tmp_path / "pairs.parquet"), "--quiet"]) == 0
    pairs = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    successes = [r for r in rows(out) if r["status"] == "success"]
    assert sorted(p["text"] for p in pairs) == sorted(r["caption"] for r in successes)
    rejects = pq.read_table(tmp_path / "pairs.rejects.parquet").to_pylist()
    assert {r["reason"] for r in rejects} == {"not_downloaded"}  # not the report's plot
    assert len(rejects) == len(rows(out)) - len(successes)
    big = next(p for p in pairs if p["text"] == "a wide blue band")
    assert (big["width"], big["height"]) == (400, 100) and (big["original_width"], big["original_height"]) == (400, 100)
    # a task per shard (its tar and its index), told without reading a schema on the driver (two tasks and a schema
    # read a shard before)
    from openalign.data import tables
    from openalign.pipeline.ingest import units

    def no_schema(*_):
        raise AssertionError("a schema read on the driver")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables, "img2dataset_kind", no_schema)
        found = list(units([str(out)]))
    assert [kind for kind, _ in found] == ["fetched"] * len(list(out.glob("*.tar")))
    assert all(tar.endswith(".tar") and index == tar[:-4] + ".parquet" for _, (tar, index) in found)


def test_samples_are_stored_as_fetched_with_their_metadata(fetched, web):
    out, _, _ = fetched
    found = samples(out)
    by_caption = {s["txt"].decode(): s for s in found.values()}
    assert by_caption["a red square"]["jpg"] == web.sites["a"].files["/red0.jpg"]  # the bytes the server sent
    assert by_caption["a green square"]["png"] == web.sites["a"].files["/green.png"]
    meta = json.loads(by_caption["red one"]["json"])
    assert meta["status"] == "success" and meta["host"] == "127.0.0.1" and len(meta["uid"]) == 32
    assert meta["sha256"] == __import__("hashlib").sha256(web.sites["a"].files["/red1.jpg"]).hexdigest()
    keys = [r["key"] for r in rows(out)]
    assert len(set(keys)) == len(keys) and all(len(k) == len(keys[0]) for k in keys)


def test_max_side_resizes_and_records_the_original_size(web, tmp_path):
    table = write_urls(tmp_path / "urls.jsonl", [{"url": web.url("a", "/big.jpg"), "caption": "wide"},
                                                 {"url": web.url("a", "/red2.jpg"), "caption": "small"}])
    fetch(table, tmp_path / "out", FetchOptions(**QUICK, max_side=100), engine=ONE, progress=False)
    by_caption = {r["caption"]: r for r in rows(tmp_path / "out")}
    assert (by_caption["wide"]["width"], by_caption["wide"]["height"]) == (100, 25)
    assert (by_caption["wide"]["original_width"], by_caption["wide"]["original_height"]) == (400, 100)
    small = next(s for s in samples(tmp_path / "out").values() if s["txt"] == b"small")
    assert small["jpg"] == web.sites["a"].files["/red2.jpg"]  # not resized: not re-encoded


# ---------------------------------------------------------------------------------------------- safety

def test_a_url_resolving_to_loopback_is_refused_without_the_flag(web, tmp_path):
    port = web.ports["a"]
    table = write_urls(tmp_path / "urls.jsonl", [{"url": f"http://127.0.0.1:{port}/red3.jpg", "caption": "literal"},
                                                 {"url": f"http://localhost:{port}/red4.jpg", "caption": "by name"}])
    start = len(web.log)
    strict = dict(QUICK, allow_private_addresses=False)
    fetch(table, tmp_path / "strict", FetchOptions(**strict), engine=ONE, progress=False)
    assert set(statuses(tmp_path / "strict").values()) == {"private_address"}
    assert len(web.log) == start  # not even robots.txt
    fetch(table, tmp_path / "allowed", FetchOptions(**QUICK), engine=ONE, progress=False)
    assert set(statuses(tmp_path / "allowed").values()) == {"success"}


def test_a_redirect_from_an_allowed_host_to_loopback_is_refused(web, tmp_path):
    """The first host is allowed (its network given with --allow-network), its redirect goes to 127.0.0.1: the hop
    is checked as a first request is, and refused."""
    target = web.url("a", "/red3.jpg")
    sites = {"door": Site(pages={"/in.jpg": Page(status=302, redirect=target)},
                          files={"/ok.jpg": image((1, 100, 1))})}
    try:
        hosts = Hosts(sites, address="127.0.0.2").start()
    except OSError:
        pytest.skip("127.0.0.2 cannot be bound here")
    try:
        table = write_urls(tmp_path / "urls.jsonl", [{"url": hosts.url("door", "/in.jpg"), "caption": "redirected"},
                                                     {"url": hosts.url("door", "/ok.jpg"), "caption": "direct"}])
        start = len(web.log)
        options = FetchOptions(**dict(QUICK, allow_private_addresses=False), allow_network=("127.0.0.2/32",))
        fetch(table, tmp_path / "out", options, engine=ONE, progress=False)
    finally:
        hosts.stop()
    found = {r["caption"]: r for r in rows(tmp_path / "out")}
    assert found["direct"]["status"] == "success"
    assert found["redirected"]["status"] == "private_address"
    assert len(web.log) == start  # 127.0.0.1 was never asked


def test_robots_txt_with_a_byte_order_mark_and_a_redirect_to_an_odd_host(tmp_path):
    """A robots.txt that starts with a UTF-8 BOM is read (before: `\\ufeffUser-agent: *` opened no group and its
    `Disallow: /` was ignored); a robots.txt redirected to a host fetch does not follow (`2130706434`, 127.0.0.2
    written as one number) leaves its origin's images unfetched as `robots_unreachable` (before: each was `bad_url`,
    although their own URLs were fine), without asking again."""
    sites = {"bom": Site(files={"/y.jpg": image((1, 2, 3))}, robots="\ufeffUser-agent: *\nDisallow: /\n"),
             "odd": Site(files={"/x.jpg": image((3, 2, 1))},
                         robots=Page(status=301, redirect="http://2130706434/robots.txt")),
             "plain": Site(files={"/z.jpg": image((9, 9, 9))}, robots="User-agent: *\nDisallow: /private/\n")}
    with Hosts(sites) as hosts:
        table = write_urls(tmp_path / "urls.jsonl", [{"url": hosts.url(h, f"/{f}.jpg"), "caption": h}
                                                     for h, f in (("bom", "y"), ("odd", "x"), ("plain", "z"))])
        fetch(table, tmp_path / "out", FetchOptions(**QUICK), engine=ONE, progress=False)
        log = list(hosts.log)
    found = {r["caption"]: r for r in rows(tmp_path / "out")}
    assert found["bom"]["status"] == "robots_disallowed"
    assert found["odd"]["status"] == "robots_unreachable"
    assert "redirected to http://2130706434/robots.txt" in found["odd"]["error_message"]
    assert found["plain"]["status"] == "success"
    assert {r["path"] for r in log if r["host"] in ("bom", "odd")} == {"/robots.txt"}  # no image asked
    # the redirect to a refused host is final: asked once (before: twice more, after 2 s and 4 s, redirected alike)
    assert [r["path"] for r in log if r["host"] == "odd"] == ["/robots.txt"]


def test_a_host_that_keeps_failing_is_given_up(tmp_path):
    """After --max-host-failures of its URLs fail in a row, a host's other URLs are not asked (before: each cost
    its timeout times 1 + --http-retries, about 127 h for 10k URLs with the defaults). A host whose failures are
    broken by successes is never given up."""
    sites = {"hangs": Site(pages={f"/{i}.jpg": Page(delay=3.0, body=image((i, 0, 0))) for i in range(12)}),
             "flaky": Site(files={f"/ok{i}.jpg": image((0, i, 0)) for i in range(6)},
                           pages={f"/bad{i}.jpg": Page(status=500) for i in range(6)})}
    with Hosts(sites) as hosts:
        urls = [{"url": hosts.url("hangs", f"/{i}.jpg"), "caption": f"hang {i}"} for i in range(12)]
        urls += [{"url": hosts.url("flaky", f"/{k}{i}.jpg"), "caption": f"{k} {i}"} for i in range(6)
                 for k in ("bad", "ok")]  # bad0 ok0 bad1 ok1 ...: never 3 failures in a row
        table = write_urls(tmp_path / "urls.jsonl", urls)
        options = FetchOptions(**dict(QUICK, timeout=0.3, read_timeout=0.3), http_retries=0, per_host=1,
                               max_host_failures=3)
        start = time.monotonic()
        result = fetch(table, tmp_path / "out", options, engine=ONE, progress=False)
        seconds = time.monotonic() - start
        asked = [r["path"] for r in hosts.log if r["host"] == "hangs" and r["path"] != "/robots.txt"]
    found = {r["caption"]: r for r in rows(tmp_path / "out")}
    hangs = [found[f"hang {i}"] for i in range(12)]
    assert [r["status"] for r in hangs] == ["timeout"] * 3 + ["host_unresponsive"] * 9
    assert "failed 3 URLs in a row (the last: timeout)" in hangs[-1]["error_message"]
    assert len(asked) == 3 and seconds < 8
    assert {found[f"ok {i}"]["status"] for i in range(6)} == {"success"}
    assert {found[f"bad {i}"]["status"] for i in range(6)} == {"http_500"}
    assert result.kinds["host_unresponsive"] == 9
    with pytest.raises(ConfigError, match="--max-host-failures"):
        FetchOptions(max_host_failures=-1)


def test_max_pixels_above_pillows_own_limit_takes_effect(tmp_path):
    """Pillow refuses more than twice its MAX_IMAGE_PIXELS inside Image.open, before --max-pixels is looked at
    (before: a 200-megapixel image was too_many_pixels whatever --max-pixels said)."""
    big = io.BytesIO()
    Image.new("1", (20_000, 10_000)).save(big, "PNG")  # 200M pixels in 24 KB
    with Hosts({"h": Site(files={"/big.png": big.getvalue()})}) as hosts:
        table = write_urls(tmp_path / "urls.jsonl", [{"url": hosts.url("h", "/big.png"), "caption": "big"}])
        fetch(table, tmp_path / "default", FetchOptions(**QUICK), engine=ONE, progress=False)
        fetch(table, tmp_path / "more", FetchOptions(**QUICK, max_pixels=250_000_000), engine=ONE, progress=False)
        fetch(table, tmp_path / "less", FetchOptions(**QUICK, max_pixels=199_999_999), engine=ONE, progress=False)
    assert [r["status"] for r in rows(tmp_path / "default")] == ["too_many_pixels"]
    [more] = rows(tmp_path / "more")
    assert more["status"] == "success" and (more["width"], more["height"]) == (20_000, 10_000)
    assert [r["status"] for r in rows(tmp_path / "less")] == ["too_many_pixels"]


# ---------------------------------------------------------------------------------------------- its output folder

def test_fetch_never_removes_files_it_did_not_write(web, tmp_path, capsys):
    """Before: any `<digits>.tar`, `.parquet` or `_stats.json` in --out was taken for a stale shard and unlinked.
    Now a folder fetch did not write is refused in one sentence, untouched, and a rerun removes only the shard files
    its own record names."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "2023.parquet").write_text("x")
    (out / "00099.tar").write_text("y")
    table = write_urls(tmp_path / "urls.jsonl", [{"url": web.url("a", f"/red{i}.jpg"), "caption": f"red {i}"}
                                                 for i in range(5)])
    argv = ["fetch", str(table), "--out", str(out), "--allow-private-addresses", "--workers", "1", "--quiet"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds files fetch did not write (00099.tar, 2023.parquet)" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["00099.tar", "2023.parquet"]
    assert (out / "2023.parquet").read_text() == "x" and (out / "00099.tar").read_text() == "y"

    # a fetch's own folder: a rerun with fewer shards removes its stale shards and nothing a user put beside them
    out = tmp_path / "fetched"
    with Hosts({f"h{i}": Site(files={"/x.jpg": image((i, i, 0))}) for i in range(8)}) as hosts:
        table = write_urls(tmp_path / "hosts.jsonl", [{"url": hosts.url(h, "/x.jpg"), "caption": h}
                                                      for h in hosts.sites])
        first = fetch(table, out, FetchOptions(**QUICK, shard_size=1), engine=ONE, progress=False)  # a host a shard
        assert first.shards > 2 and len(list(out.glob("*.tar"))) == first.shards
        (out / "00042.tar").write_text("a user's file")
        (out / "notes.txt").write_text("mine")
        (out / ".draft.tmp").write_text("mine too")
        again = fetch(table, out, FetchOptions(**QUICK, shard_size=10), engine=ONE, progress=False)
    assert again.shards == 1 and again.successes == 8
    assert sorted(p.name for p in out.glob("0*")) == ["00000.parquet", "00000.tar", "00000_stats.json", "00042.tar"]
    assert (out / "00042.tar").read_text() == "a user's file" and (out / "notes.txt").read_text() == "mine"
    assert (out / ".draft.tmp").read_text() == "mine too"


def test_two_fetches_into_one_folder_through_the_api_are_refused(web, tmp_path):
    """The CLI refused a second run into one --out; the Python API took no lock, and two fetch() calls asked every
    host twice. The lock is the same one, taken again by the thread that holds it (the CLI's driver)."""
    from conftest import held_elsewhere

    table = write_urls(tmp_path / "urls.jsonl", [{"url": web.url("a", "/red0.jpg"), "caption": "red"}])
    out = tmp_path / "out"
    with held_elsewhere(out), pytest.raises(ConfigError, match="is being written by another openalign run"):
        fetch(table, out, FetchOptions(**QUICK), engine=ONE, progress=False)
    assert fetch(table, out, FetchOptions(**QUICK), engine=ONE, progress=False).successes == 1


def test_a_full_disk_names_the_outputs_disk(web, tmp_path, monkeypatch, capsys):
    """A write to an open file fails without a file name: the sentence named the current directory's disk and its
    free space (before), not the output's."""
    import errno

    from openalign.pipeline.web import fetch as fetch_module

    class FullTar:
        def __init__(self, path):
            pass

        def __enter__(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __exit__(self, *exc):
            return False

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(fetch_module, "TarWriter", FullTar)
    table = write_urls(tmp_path / "urls.jsonl", [{"url": web.url("a", "/red0.jpg"), "caption": "red"}])
    out = tmp_path / "out"
    assert cli.main(["fetch", str(table), "--out", str(out), "--allow-private-addresses", "--workers", "1",
                     "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"the disk is full: writing into {out} failed with" in err and f"MiB free on {out};" in err


# ---------------------------------------------------------------------------------------------- inputs

def test_bad_inputs_are_one_sentence(tmp_path, capsys):
    assert cli.main(["fetch", str(tmp_path / "nothing.parquet"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    no_url = write_urls(tmp_path / "t.jsonl", [{"link": "http://x/y.jpg", "caption": "c"}])
    assert cli.main(["fetch", str(no_url), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "has no url column" in err and "Traceback" not in err
    assert cli.main(["fetch", str(write_urls(tmp_path / "u.jsonl", [{"url": "http://x/y.jpg"}])), "--keep",
                     str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no uid column" in capsys.readouterr().err
    empty = write_urls(tmp_path / "e.jsonl", [{"url": "", "caption": "no url"}])
    assert cli.main(["fetch", str(empty), "--out", str(tmp_path / "e"), "--contact", "x"]) == 2
    assert "holds no URL to fetch (1 row without one)" in capsys.readouterr().err
    ftp = write_urls(tmp_path / "ftp.jsonl", [{"url": "ftp://example.org/a.jpg", "caption": "not http"}])
    assert cli.main(["fetch", str(ftp), "--out", str(tmp_path / "ftp"), "--quiet"]) == 0
    assert "no --contact" in capsys.readouterr().err and statuses(tmp_path / "ftp") == {
        "ftp://example.org/a.jpg": "bad_url"}


def test_a_url_tables_texts_are_read_as_their_users_wrote_them(tmp_path):
    # One vocabulary (data/tables.py): a `captions` list is one row per caption (an empty one: a row without a text;
    # fetch's own vocabulary had no `captions`, so every text was NULL). A JSONL column whose rows differ in type is
    # DuckDB's JSON type: CAST(... AS VARCHAR) wrote every caption with its JSON quotes ('"red"')
    import duckdb

    from openalign.data.engine import read_plan
    from openalign.pipeline.web.fetch_plan import duckdb_plan_urls as plan

    def planned(rows):
        table = write_urls(tmp_path / "urls.jsonl", rows)
        shutil.rmtree(tmp_path / "plan", ignore_errors=True)
        with duckdb.connect() as con:
            plan(con, table, [], 100, tmp_path / "plan")
        return [(r["url"], r["text"]) for r in read_plan(str(tmp_path / "plan"), 0, "shard")]

    assert planned([{"url": "http://a.example/1.jpg", "captions": ["red", "crimson"]},
                    {"url": "http://a.example/2.jpg", "captions": "blue"},
                    {"url": "http://a.example/3.jpg", "captions": []},
                    {"url": "http://a.example/4.jpg"}]) == [
        ("http://a.example/1.jpg", "red"), ("http://a.example/1.jpg", "crimson"), ("http://a.example/2.jpg", "blue"),
        ("http://a.example/3.jpg", None), ("http://a.example/4.jpg", None)]
    assert planned([{"URL": "http://a.example/1.jpg", "Caption": "red"},
                    {"URL": "http://a.example/2.jpg", "Caption": 1999}]) == [
        ("http://a.example/1.jpg", "red"), ("http://a.example/2.jpg", "1999")]


def write_candidates(path, n: int, hosts: int = 50) -> None:
    import duckdb

    with duckdb.connect() as con:
        con.execute(f"""COPY (SELECT 'https://h' || (i % {hosts}) || '.example/' || i || '.jpg' AS url,
                                     'an alt text ' || i AS caption FROM range({n}) t(i))
                        TO '{path}' (FORMAT parquet)""")


def test_the_plan_of_many_candidates_runs_in_bounded_memory(tmp_path):
    # each shard's digest was md5(string_agg(... ORDER BY idx)), a state DuckDB cannot spill: 300k candidates ran out
    # of memory under 200 MB (and 2M under 1 GB). Now a fixed-size XOR of the rows' hashes, and one plan part a shard
    from openalign.data.engine import driver_duckdb, read_plan
    from openalign.pipeline.web.fetch_plan import duckdb_plan_urls as plan

    write_candidates(tmp_path / "c.parquet", 300_000, hosts=3_000)
    with driver_duckdb(Engine("local", workers=2, memory="128M"), tmp_path) as con:
        planned, left_out, shards = plan(con, tmp_path / "c.parquet", [], 10_000,
                                         tmp_path / "plan")
    assert shards == 30 and sum(p["rows"] for p in planned) == 300_000 and not sum(left_out.values())
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == sorted(f"shard={p['shard']}" for p in planned)
    first = planned[0]
    found = read_plan(str(tmp_path / "plan"), first["shard"], "shard")
    assert [r["idx"] for r in found] == list(range(first["rows"]))
    numbers = [int(r["url"].rsplit("/", 1)[1].split(".")[0]) for r in found]
    assert numbers == sorted(numbers)  # a shard's rows in the table's order
    assert all(r["uid"] is None and r["host"] == r["url"].split("/")[2] for r in found)  # uids: in the task


def test_a_table_of_parts_or_a_glob_is_planned_as_one_file(tmp_path):
    """A URL table given as a directory of parts (as Spark and DuckDB write them: numbered part files, _SUCCESS,
    hidden checksums) or as a glob plans the same shards, rows and digests as the same rows in one file; CSV parts
    too; parts of two formats are one sentence."""
    import duckdb

    from openalign.data.engine import read_plan
    from openalign.pipeline.web.fetch_plan import candidate_table, duckdb_plan_urls as plan

    write_candidates(tmp_path / "whole.parquet", 2_500, hosts=40)
    parts = tmp_path / "parts"
    parts.mkdir()
    with duckdb.connect() as con:
        for i, (start, stop) in enumerate([(0, 1000), (1000, 2000), (2000, 2500)]):
            name = f"part-{i * 5:05d}" if i < 2 else "part-00010"  # 0, 5, 10: natural order, not text order
            con.execute(f"COPY (SELECT * FROM read_parquet('{tmp_path / 'whole.parquet'}') LIMIT {stop - start} "
                        f"OFFSET {start}) TO '{parts / name}.parquet' (FORMAT parquet)")
            con.execute(f"COPY (SELECT * FROM read_parquet('{tmp_path / 'whole.parquet'}') LIMIT {stop - start} "
                        f"OFFSET {start}) TO '{tmp_path / name}.csv' (HEADER)")
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-00000.parquet.crc").write_bytes(b"crc")

    def planned(spec, name):
        with duckdb.connect() as con:
            shards, _, _ = plan(con, candidate_table(spec), [], 500, tmp_path / name)
        return shards, {p["shard"]: read_plan(str(tmp_path / name), p["shard"], "shard") for p in shards}

    whole = planned(tmp_path / "whole.parquet", "a")
    assert len(whole[0]) == 5
    assert planned(parts, "b") == whole
    assert planned(str(tmp_path / "parts" / "part-*.parquet"), "c") == whole
    assert planned(str(tmp_path / "part-*.csv"), "d") == whole
    (parts / "extra.csv").write_text("url,caption\nhttp://x.example/a.jpg,a\n")
    with pytest.raises(ConfigError, match="mixes .csv and .parquet files"):
        candidate_table(parts)
    with pytest.raises(ConfigError, match="holds no parquet/csv/tsv/jsonl file"):
        candidate_table(str(tmp_path / "nothing-*.parquet"))


def test_spark_plans_what_duckdb_plans(tmp_path):
    """The Spark engine's plan (a task per file, then Spark jobs) gives the local plan's shards, rows, order and digests:
    Parquet parts, CSV parts, a JSONL list of captions, a keep-list."""
    pytest.importorskip("pyspark")
    import duckdb

    from openalign.data.engine import read_plan
    from openalign.pipeline.web.fetch_plan import candidate_table, duckdb_plan_urls, spark_plan_urls

    write_candidates(tmp_path / "whole.parquet", 3_000, hosts=60)
    parts = tmp_path / "parts"
    parts.mkdir()
    with duckdb.connect() as con:
        for i in range(3):
            select = (f"SELECT md5(url || caption) AS uid, * FROM read_parquet('{tmp_path / 'whole.parquet'}') "
                      f"LIMIT 1000 OFFSET {i * 1000}")
            con.execute(f"COPY ({select}) TO '{parts / f'part-{i}.parquet'}' (FORMAT parquet)")
            con.execute(f"COPY ({select}) TO '{tmp_path / f'part-{i}.csv'}' (HEADER)")
        keep = tmp_path / "keep"
        keep.mkdir()
        con.execute(f"COPY (SELECT uid FROM read_parquet('{parts}/*.parquet') WHERE hash(uid) % 3 <> 0) "
                    f"TO '{keep / 'keep.parquet'}' (FORMAT parquet)")
    (keep / "filter_report.json").write_text("{}")
    listed = write_urls(tmp_path / "lists.jsonl", [{"url": f"http://h{i % 3}.example/{i}.jpg",
                                                    "captions": [f"a {i}", f"b {i}"] if i % 4 else []}
                                                   for i in range(40)] + [{"url": None, "captions": "none"}])
    spark = Engine("spark", master="local[2]")

    def both(spec, keep=()):
        table = candidate_table(spec)
        with duckdb.connect() as con:
            local = duckdb_plan_urls(con, table, list(keep), 250, tmp_path / "local")
        remote = spark_plan_urls(spark, table, list(keep), 250, tmp_path / "spark", tmp_path / "work", progress=False)
        read = lambda found, where: {p["shard"]: read_plan(str(where), p["shard"], "shard") for p in found[0]}  # noqa
        assert remote == local and read(remote, tmp_path / "spark") == read(local, tmp_path / "local")
        shutil.rmtree(tmp_path / "local")
        shutil.rmtree(tmp_path / "spark")
        return local

    kept = both(parts, [keep])
    assert 0 < sum(p["rows"] for p in kept[0]) < 3_000 and sum(p["rows"] for p in kept[0]) + kept[1]["not_kept"] == 3_000
    assert sum(p["rows"] for p in both(str(tmp_path / "part-*.csv"))[0]) == 3_000
    assert both(listed)[1] == {"no_url": 1, "not_kept": 0}


def test_a_shards_digest_covers_its_rows_order(tmp_path):
    # a shard is reused by a rerun when its digest is unchanged: the digest is order-free (an XOR), so each row's index
    # in the shard is hashed with it; two rows of one host swapped change the keys they get, and so the digest
    import duckdb

    from openalign.pipeline.web.fetch_plan import duckdb_plan_urls as plan

    rows = [{"url": f"http://a.example/{i}.jpg", "caption": f"c {i}"} for i in range(3)]
    rows += [{"url": "http://b.example/x.jpg", "caption": "other host"}]

    def digests(found):
        with duckdb.connect() as con:
            shutil.rmtree(tmp_path / "plan", ignore_errors=True)
            planned, _, _ = plan(con, write_urls(tmp_path / "u.jsonl", found), [], 2,
                                 tmp_path / "plan")
        return {p["shard"]: p["digest"] for p in planned}

    before = digests(rows)
    swapped = digests([rows[1], rows[0], *rows[2:]])
    host_a = next(s for s, d in before.items() if swapped[s] != d)
    assert len(before) == 2 and [s for s in before if before[s] != swapped[s]] == [host_a]
    assert digests(rows) == before


def test_a_url_table_without_uids_gets_a_pair_tables_uids(fetched):
    from openalign.data.pairs import normalize_text, pair_uid, url_keys

    out, _, _ = fetched
    found = rows(out)
    assert found and all(r["uid"] == pair_uid(url_keys([r["url"]])[0], normalize_text(r["caption"] or ""))
                         for r in found)


def test_a_filtered_candidate_table_fetches_only_its_kept_pairs(web, tmp_path):
    """extract (a URL table) -> filter --rules text -> fetch --keep: only the kept uids are fetched, each sample's
    JSON carries its candidate's uid, language and host."""
    urls = [{"url": web.url("a", f"/red{i}.jpg"), "caption": f"a bright red square number {i} on a page"}
            for i in range(5)]
    urls += [{"url": web.url("a", "/green.png"), "caption": "image"}] * 1  # boilerplate, removed by a text rule
    table = write_urls(tmp_path / "urls.jsonl", urls)
    assert cli.main(["extract", str(table), "--out", str(tmp_path / "cand"), "--quiet"]) == 0
    candidates = tmp_path / "cand" / "candidates.parquet"
    assert cli.main(["filter", str(candidates), "--out", str(tmp_path / "keep"), "--rules", "text", "--quiet",
                     "min_words=3"]) == 0
    kept = {r["uid"] for r in pq.read_table(tmp_path / "keep" / "keep.parquet").to_pylist()}
    assert 0 < len(kept) < len(urls)
    other = write_urls(tmp_path / "other.jsonl", [{"url": web.url("a", "/red0.jpg"), "caption": "another table"}])
    assert cli.main(["extract", str(other), "--out", str(tmp_path / "other"), "--quiet"]) == 0
    with pytest.raises(ConfigError, match="none of the 1 candidates"):
        fetch(tmp_path / "other", tmp_path / "o", FetchOptions(**QUICK), keep=(tmp_path / "keep",), engine=ONE)
    result = fetch(tmp_path / "cand", tmp_path / "out", FetchOptions(**QUICK), keep=(tmp_path / "keep",), engine=ONE,
                   progress=False)
    assert {r["uid"] for r in rows(tmp_path / "out")} == kept and result.urls == len(kept)
    meta = [json.loads(s["json"]) for s in samples(tmp_path / "out").values()]
    assert {m["uid"] for m in meta} == kept and {m["language"] for m in meta} == {"en"}

    # the downloaded pairs are not filtered twice by the text rules: ingest carries the filter's report, and the
    # filter (--rules auto, its default) runs the image rules alone; --rules all runs every rule again
    assert cli.main(["ingest", str(tmp_path / "out"), "--out", str(tmp_path / "pairs.parquet"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "pairs.manifest.json").read_text())
    assert manifest["text_rules"] == [str((tmp_path / "keep" / "filter_report.json").resolve())]
    assert cli.main(["filter", str(tmp_path / "pairs.parquet"), "--out", str(tmp_path / "f"), "--quiet",
                     "min_words=12", "min_short_side=1"]) == 0
    report = json.loads((tmp_path / "f" / "filter_report.json").read_text())
    assert report["config"]["rules"] == "image" and report["rules_chosen"].startswith("image")
    assert {"text_shared", "text_length", "text_rare"} <= set(report["not_applied"])
    assert report["kept_pairs"] == len(kept)  # min_words=12 would have removed them all
    assert cli.main(["filter", str(tmp_path / "pairs.parquet"), "--out", str(tmp_path / "again"), "--rules", "all",
                     "--quiet", "min_words=12", "min_short_side=1"]) == 0
    assert json.loads((tmp_path / "again" / "filter_report.json").read_text())["kept_pairs"] == 0


def test_pairs_of_an_unfiltered_fetch_get_every_rule(fetched, tmp_path):
    out, _, _ = fetched
    assert json.loads((out / "fetch_report.json").read_text())["text_rules"] == []
    assert cli.main(["ingest", str(out), "--out", str(tmp_path / "pairs.parquet"), "--quiet"]) == 0
    assert json.loads((tmp_path / "pairs.manifest.json").read_text())["text_rules"] == []
    assert cli.main(["filter", str(tmp_path / "pairs.parquet"), "--out", str(tmp_path / "f"), "--quiet"]) == 0
    report = json.loads((tmp_path / "f" / "filter_report.json").read_text())
    assert report["config"]["rules"] == "all" and report["rules_chosen"] == "all"


# ---------------------------------------------------------------------------------------------- resuming

def slow_web() -> dict:
    return {f"h{i}": Site(files={f"/{j}.jpg": image((i * 30, j * 20, 0)) for j in range(6)}, latency=(0.15, 0.2))
            for i in range(6)}


def test_killed_mid_fetch_a_rerun_gives_the_same_output(tmp_path, capsys):
    with Hosts(slow_web()) as hosts:
        table = write_urls(tmp_path / "urls.jsonl", [{"url": hosts.url(h, f"/{j}.jpg"), "caption": f"{h} {j}"}
                                                     for h in hosts.sites for j in range(6)])
        out = tmp_path / "out"
        argv = ["fetch", str(table), "--out", str(out), "--workers", "1", "--shard-size", "6", "--per-host", "1",
                "--allow-private-addresses", "--quiet"]
        code = f"from openalign import cli; raise SystemExit(cli.main({argv!r}))"
        child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        status = out / "_fetch" / "status"
        deadline = time.monotonic() + 120
        while not (status.is_dir() and len(list(status.glob("*.json"))) >= 1):
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no shard finished"
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
        done = len(list(status.glob("*.json")))
        assert not (out / "fetch_report.json").exists()
        assert cli.main(["ingest", str(out), "--out", str(tmp_path / "p.parquet")]) == 2
        assert "did not finish" in capsys.readouterr().err
        rerun = fetch(table, out, FetchOptions(allow_private_addresses=True, shard_size=6, per_host=1), engine=ONE,
                      progress=False)
        whole = fetch(table, tmp_path / "whole", FetchOptions(allow_private_addresses=True, shard_size=6, per_host=1),
                      engine=ONE, progress=False)
        assert 1 <= rerun.skipped == done < rerun.shards and whole.skipped == 0
        assert not list(out.glob(".*.tmp"))
        strip = lambda found: [{k: v for k, v in r.items()} for r in found]  # noqa: E731
        assert strip(rows(out)) == strip(rows(tmp_path / "whole"))
        assert samples(out) == samples(tmp_path / "whole")

        # a changed candidate row redoes only its own shard
        changed = [json.loads(line) for line in table.read_text().splitlines()]
        changed[0]["caption"] = "a new alt-text"
        write_urls(table, changed)
        again = fetch(table, out, FetchOptions(allow_private_addresses=True, shard_size=6, per_host=1), engine=ONE,
                      progress=False)
        assert again.skipped == again.shards - 1
        assert any(r["caption"] == "a new alt-text" for r in rows(out))


def test_local_and_spark_engines_write_the_same_shards(web, tmp_path):
    pytest.importorskip("pyspark")
    table = write_urls(tmp_path / "urls.jsonl", [r for r in candidate_rows(web) if r["url"] and "hang" not in r["url"]
                                                 and "/b" not in r["url"]])
    options = FetchOptions(**QUICK, shard_size=8)
    fetch(table, tmp_path / "local", options, engine=ONE, progress=False)
    fetch(table, tmp_path / "spark", options, engine=Engine("spark", master="local[2]"), progress=False)
    assert rows(tmp_path / "local") == rows(tmp_path / "spark")
    assert samples(tmp_path / "local") == samples(tmp_path / "spark")


# ---------------------------------------------------------------------------------------------- img2dataset

I2D_KINDS = {"HTTP Error 404: Not Found": "http_404", "Image decoding error": "not_an_image", "timed out": "timeout",
             "Use of image disallowed by X-Robots-Tag directive": "opted_out",
             "HTTP Error 429: Too Many Requests": "http_429"}


def test_side_by_side_with_img2dataset_on_the_same_web(tmp_path):
    """The real img2dataset 1.47.0's record (tests/fixtures/img2dataset_fetch, made by its make_fixture.py) on the same
    sample web: the same pictures (decoded pixels equal) except those robots.txt disallows (img2dataset fetches
    them) and those a throttling host refused img2dataset with 429 (openalign waits its Retry-After and gets them);
    the same error kind wherever both fail."""
    import hashlib

    from openalign.corpora.hosts import sample_web

    record = json.loads((FIXTURES / "img2dataset_fetch" / "results.json").read_text())
    theirs = {(r["host"], r["path"]): r for r in record["urls"]}
    sites, urls = sample_web(seed=0, hang=6.0)
    with Hosts(sites) as hosts:
        table = write_urls(tmp_path / "urls.jsonl", [{"url": hosts.url(h, p), "caption": c} for h, p, c in urls])
        fetch(table, tmp_path / "out", FetchOptions(allow_private_addresses=True, timeout=2, http_retries=1),
              engine=ONE, progress=False)
        where = {hosts.url(h, p): (h, p) for h, p, _ in urls}
        log = list(hosts.log)
    ours = {where[r["url"]]: r for r in rows(tmp_path / "out")}
    assert set(ours) == set(theirs)
    both_ok = {k for k in ours if ours[k]["status"] == "success" and theirs[k]["status"] == "success"}
    only_theirs = {k for k in ours if theirs[k]["status"] == "success" and ours[k]["status"] != "success"}
    only_ours = {k for k in ours if ours[k]["status"] == "success" and theirs[k]["status"] != "success"}
    assert only_theirs == {k for k in ours if k[1].startswith("/private/")}
    assert {ours[k]["status"] for k in only_theirs} == {"robots_disallowed"}
    assert only_ours == {k for k in ours if theirs[k]["error_message"] == "HTTP Error 429: Too Many Requests"}
    assert only_ours and all(k[0] == "busy" for k in only_ours)
    for key in ours.keys() - both_ok - only_theirs - only_ours:  # both failed: the same kind
        assert ours[key]["status"] == I2D_KINDS[theirs[key]["error_message"]], key
    pictures = {s["txt"].decode(): s for s in samples(tmp_path / "out").values()}
    captions = {(h, p): c for h, p, c in urls}
    for key in both_ok:
        sample = pictures[captions[key]]
        data = next(v for f, v in sample.items() if f in ("jpg", "png"))
        image = Image.open(io.BytesIO(data)).convert("RGB")
        assert hashlib.sha256(f"{image.size}".encode() + image.tobytes()).hexdigest() == theirs[key]["pixels"], key
    assert not [r for r in log if r["path"].startswith("/private/")]
    assert any(r["path"].startswith("/private/") for r in record["requests"])  # img2dataset asked for them
