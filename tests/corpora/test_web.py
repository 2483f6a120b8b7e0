"""The built-in web (corpora/web.py): built from training shards, served at its ports, and the front of the pipeline
run on it (extract -> filter --rules text -> fetch -> ingest -> filter) agrees with what was planted."""

import io
import json
import random
import socket

import pyarrow.parquet as pq
import pytest
from PIL import Image

from openalign import cli
from openalign.config import ConfigError
from openalign.corpora import web
from openalign.data.tars import TarWriter

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "grey", "pink")
SHAPES = ("circle", "square", "triangle", "star", "heart", "moon")


def training_shards(root, n=80):
    root.mkdir(parents=True)
    rng = random.Random(0)
    with TarWriter(root / "shard-000000.tar") as tar:
        for i in range(n):
            out = io.BytesIO()
            Image.new("RGB", (260 + i, 240), tuple(rng.randrange(256) for _ in range(3))).save(out, "JPEG")
            caption = f"a {COLOURS[i % 10]} {SHAPES[i % 6]} drawn on paper number {i}"
            tar.write({"__key__": f"{i:06d}", "jpg": out.getvalue(), "txt": caption})
    return root


def free_ports(count: int) -> int:
    """A first port whose `count` successors are free on 127.0.0.1."""
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(20_000, 60_000)
        try:
            sockets = []
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.skip("no run of free ports")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web")
    options = web.WebOptions(hosts=3, per_page=6, port=free_ports(3 + len(web.SPECIAL_HOSTS)))
    planted = web.build([str(training_shards(tmp / "train"))], tmp / "web", options)
    return tmp, planted


def test_the_web_plants_what_its_manifest_says(built):
    tmp, planted = built
    counts = planted["counts"]
    assert planted["images"] == 80 and sum(counts[k] for k in ("ordinary", "private", "opted_out", "slow", "busy",
                                                               "broken", "missing_alt")) == 80
    assert counts["boilerplate"] == 12 * len(web.BOILERPLATE) and counts["icons"] == counts["banners"] >= 2
    for kind in ("opted_out", "slow", "busy", "broken", "missing_alt"):
        assert counts[kind] > 0, kind
    assert (tmp / "web" / "crawl" / "web-00000.warc.wat.gz").is_file()
    spec = json.loads((tmp / "web" / "web.json").read_text())
    again = web.build([str(tmp / "train")], tmp / "again", web.WebOptions(**spec["options"]))
    assert again == planted  # the same shards and options: the same web
    assert (tmp / "again" / "crawl" / "web-00000.warc.wat.gz").read_bytes() == \
        (tmp / "web" / "crawl" / "web-00000.warc.wat.gz").read_bytes()


def test_extract_filter_fetch_ingest_filter_agree_with_the_planted_web(built):
    tmp, planted = built
    out = tmp / "chain"
    assert cli.main(["extract", str(tmp / "web" / "crawl"), "--out", str(out / "cand"), "--quiet"]) == 0
    candidates = pq.read_table(out / "cand" / "candidates.parquet").to_pylist()
    urls = {r["url"] for r in candidates}
    assert not urls & set(planted["missing_alt"])  # no alt: no pair
    assert {p["url"] for p in planted["broken"]} <= urls
    assert cli.main(["filter", str(out / "cand" / "candidates.parquet"), "--out", str(out / "text"), "--rules",
                     "text", "--quiet"]) == 0
    kept = {r["uid"] for r in pq.read_table(out / "text" / "keep.parquet").to_pylist()}
    by_url = {r["url"]: r["uid"] for r in candidates}
    assert not {by_url[p["url"]] for p in planted["boilerplate"]} & kept  # text_shared: > 10 images an alt
    with web.serve(tmp / "web") as hosts:
        assert cli.main(["fetch", str(out / "cand"), "--keep", str(out / "text"), "--out", str(out / "fetched"),
                         "--allow-private-addresses", "--contact", "test@example.org", "--quiet"]) == 0
        log = list(hosts.log)
    statuses = {r["url"]: r["status"] for part in sorted((out / "fetched").glob("*.parquet"))
                for r in pq.read_table(part).to_pylist()}
    expect = {"private": "robots_disallowed", "opted_out": "opted_out", "broken": "http_404", "slow": "success",
              "busy": "success", "ordinary": "success"}
    for kind, status in expect.items():
        found = {statuses[p["url"]] for p in planted[kind] if p["url"] in statuses}
        assert found <= {status}, (kind, found)
    assert not [r for r in log if r["path"].startswith("/private/")]
    assert cli.main(["ingest", str(out / "fetched"), "--out", str(out / "pairs.parquet"), "--quiet"]) == 0
    assert cli.main(["filter", str(out / "pairs.parquet"), "--out", str(out / "image"), "--quiet"]) == 0
    report = json.loads((out / "image" / "filter_report.json").read_text())
    assert report["config"]["rules"] == "image"  # the text rules ran before the download
    removed = {r["rule"]: r["removed_alone"] for r in report["rules"]}
    assert removed["image_small"] >= len(planted["icons"]) and removed["image_aspect"] >= len(planted["banners"])
    manifest = json.loads((out / "pairs.manifest.json").read_text())
    mirrored = [pair for pair in planted["mirrored"] if all(statuses.get(u) == "success" for u in pair)]
    assert mirrored and manifest["pairs"] - manifest["images"] == len(mirrored)  # one image under two URLs


@pytest.mark.parametrize("argv, message", [
    # before: accepted, then `serve` failed with an OverflowError or IndexError traceback; --limit -1 built 1 image;
    # --out FILE a NotADirectoryError traceback
    (["--port", "70000"], "--port=70000 must be a TCP port, 1 to 65535"),
    (["--hosts", "100000"], "needs ports up to 118,483"),
    (["--port", "65530", "--hosts", "4"], "needs ports up to 65,537"),
    (["--limit", "-1"], "--limit=-1 must be 0 (all) or more"),
])
def test_bad_web_options_are_one_sentence_before_anything_is_written(tmp_path, capsys, argv, message):
    from openalign import cli

    assert cli.main(["web", "build", "--out", str(tmp_path / "web"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "web").exists()


def test_a_web_built_into_a_file_is_one_sentence(tmp_path, capsys):
    from openalign import cli

    (tmp_path / "file").write_text("mine")  # before: a NotADirectoryError traceback
    assert cli.main(["web", "build", "--out", str(tmp_path / "file")]) == 2
    assert f"cannot build the web in {tmp_path / 'file'}: {tmp_path / 'file'} is a file" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "mine"
    with pytest.raises(ConfigError, match="is a file; choose another --out"):
        web.build([], tmp_path / "file" / "web")


def test_serving_a_folder_that_is_no_web_is_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match="web build"):
        with web.serve(tmp_path):
            pass


def test_the_command_line_builds_serves_and_stops_on_sigterm(tmp_path, capsys):
    import signal
    import subprocess
    import sys
    import urllib.request

    assert cli.main(["web", "build", "--from", str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
    assert "openalign corpus emoji" in capsys.readouterr().err
    shards = training_shards(tmp_path / "train", n=20)
    port = free_ports(3 + len(web.SPECIAL_HOSTS))
    argv = ["web", "build", "--from", str(shards), "--out", str(tmp_path / "w"), "--hosts", "3", "--port", str(port)]
    assert cli.main(argv) == 0
    code = f"from openalign import cli; raise SystemExit(cli.main(['web', 'serve', {str(tmp_path / 'w')!r}]))"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving 7 hosts" in child.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/robots.txt", timeout=10) as answer:
            assert b"Disallow: /private/" in answer.read()
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 0 and "stopped after 1 requests" in out, err


def test_the_web_demo_runs_the_whole_chain_at_a_small_size(tmp_path, capsys):
    """`make web-demo` at a small size: 300 emoji on the web, the tiny preset's few training steps; every stage runs
    and the run ends with its held-out evaluation."""
    pytest.importorskip("PIL.ImageFont")
    from openalign.corpora.emoji import DEFAULT_CLDR, DEFAULT_FONT

    if not (__import__("os").path.exists(DEFAULT_FONT) and __import__("os").path.exists(DEFAULT_CLDR)):
        pytest.skip("the emoji corpus's system packages are not installed")
    port = free_ports(3 + len(web.SPECIAL_HOSTS))
    argv = ["web", "demo", "--out", str(tmp_path / "demo"), "--hosts", "3", "--limit", "300", "--port", str(port),
            "--preset", "tiny", f"data.data_dir={tmp_path / 'data'}", "train.steps=2", "--quiet"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for command in ("extract", "filter", "fetch", "ingest", "dedup", "shard", "train"):
        assert f"$ openalign {command}" in out, command
    assert "the web demo:" in out and "held-out i2t_r10" in out
    planted = json.loads((tmp_path / "demo" / "web" / "planted.json").read_text())
    fetched = json.loads((tmp_path / "demo" / "fetched" / "fetch_report.json").read_text())
    assert fetched["statuses"]["robots_disallowed"] <= planted["counts"]["private"]
    assert json.loads((tmp_path / "demo" / "image-rules" / "filter_report.json").read_text())["config"]["rules"] \
        == "image"
