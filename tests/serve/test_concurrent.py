"""`openalign serve` under concurrent clients: a real server in a subprocess (a crash in a C library must fail
this test, not kill pytest), an index whose metadata has more row groups than `Meta`'s cache holds, and
threads sending mixed queries at it. Before the fix, pyarrow's one `ParquetFile` read by request threads
answered 500s ("ReadRangeCache did not find matching cache entry") and then segfaulted."""

import base64
import io
import json
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import COLORS, SHAPES, http_get, save_tiny_model, serve_process, shape_image, shape_images
from openalign import cli


@pytest.fixture(scope="module")
def many_groups_index(tmp_path_factory) -> tuple[Path, Path]:
    """12 images in 12 embed parts (one image each): meta.parquet has 12 row groups, over the cache's 8."""
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("concurrent")
    model = save_tiny_model(root / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    images = shape_images(root / "images")
    assert cli.main(["embed", str(model), "--images", str(images), "--out", str(root / "emb"), "--part-size", "1",
                     "--quiet"]) == 0
    assert cli.main(["index", str(root / "emb"), "--out", str(root / "idx"), "--kind", "ivf", "--codes", "flat",
                     "--nlist", "1"]) == 0
    assert pq.ParquetFile(root / "idx" / "meta.parquet").num_row_groups == 12
    return root / "idx", model


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/search", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {"detail": err.read().decode(errors="replace")[:300]}


def _upload() -> str:
    buf = io.BytesIO()
    shape_image("blue", "square").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _queries(worker: int, n: int) -> list:
    """Mixed requests: text, image id, image id + text, an upload + terms, thumbnails; ids across every group."""
    upload = _upload()
    words = [f"a {c} {s}" for c in COLORS for s in SHAPES]
    kinds = [lambda i: ("search", {"text": words[i % 12], "k": 12}),
             lambda i: ("search", {"image_id": (i * 5) % 12, "k": 12}),
             lambda i: ("search", {"image_id": (i * 7) % 12, "plus": ["red"], "minus": ["blue"], "k": 6}),
             lambda i: ("search", {"image": upload, "plus": ["green"], "k": 12}),
             lambda i: ("image", (i * 11) % 12)]
    return [kinds[(worker + i) % len(kinds)](worker * n + i) for i in range(n)]


def _hammer(url: str, threads: int, per_thread: int) -> list[str]:
    failures: list[str] = []
    barrier = threading.Barrier(threads)  # every thread's first request at once: the cold caches race

    def client(worker: int) -> None:
        barrier.wait()
        for what, body in _queries(worker, per_thread):
            try:
                if what == "image":
                    status, data = http_get(f"{url}/image/{body}?size=32")
                    ok = status == 200 and data[:2] == b"\xff\xd8"
                else:
                    status, data = _post(url, body)
                    ok = status == 200 and len(data["results"]) == body["k"]
            except OSError as err:  # the connection dropped: the server died
                status, data, ok = None, repr(err), False
            if not ok:
                failures.append(f"{what} {str(body)[:60]}: {status} {str(data)[:200]}")

    workers = [threading.Thread(target=client, args=(w,)) for w in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return failures


def test_concurrent_mixed_queries_on_a_many_part_index_all_succeed(many_groups_index):
    index, model = many_groups_index
    for start in range(2):  # bounded repeats: two cold starts, each raced by every thread's first request
        process, url = serve_process([index, "--model", model])
        try:
            failures = _hammer(url, threads=8, per_thread=15)
            died = process.poll()
        finally:
            process.terminate()
            try:
                output = process.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:  # hung (a deadlock, or a thread stuck in a C library)
                process.kill()
                output = process.communicate()[0]
        assert died is None, f"the server died under concurrent requests (exit {died}):\n{output[-3000:]}"
        assert not failures, f"start {start}: {len(failures)} of 120 requests failed, e.g. {failures[:3]}\n{output[-2000:]}"
