"""What the service's APIs share: a thumbnail's source must be a small regular file. A real server in a subprocess,
since what broke was the server itself: before, a FIFO behind an indexed path blocked a request thread forever,
42 such GETs left /health and /search timing out and SIGTERM no longer stopped it; /dev/zero read until
MemoryError, and a 2 GB file took 2.7 GB of memory."""

import json
import os
import signal
import threading
import time
import urllib.request

from conftest import http_get, serve_process, shape_index
from openalign.index import opened


def test_a_fifo_or_a_huge_file_behind_a_thumbnail_is_a_404_at_once_and_the_server_answers_and_stops(tmp_path):
    index = shape_index(tmp_path)
    rows = opened.load(index).meta.to_pylist()
    fifo, huge = rows[0], rows[1]
    os.unlink(fifo["path"])
    os.mkfifo(fifo["path"])  # an indexed file swapped for a FIFO
    with open(huge["path"], "r+b") as f:
        f.truncate(2 * 2**30)  # 2 GB (sparse), over the 64 MiB the service reads for a thumbnail
    process, url = serve_process([index, "--model", tmp_path / "model"])
    try:
        for row, says in ((fifo, "no longer a regular file"), (huge, "the most this service reads")):
            start = time.monotonic()
            status, body = http_get(f"{url}/image/{row['id']}", timeout=5)
            assert status == 404 and says in json.loads(body)["detail"], (status, body[:200])
            assert time.monotonic() - start < 1
        statuses = []

        def get():
            statuses.append(http_get(f"{url}/image/{fifo['id']}?size=32", timeout=10)[0])

        threads = [threading.Thread(target=get) for _ in range(60)]  # more than the server's 40 worker threads
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert statuses == [404] * 60
        assert http_get(url + "/health", timeout=5)[0] == 200
        body = json.dumps({"ids": [fifo["id"], huge["id"], rows[2]["id"]], "with_image": True}).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "/metadata", body), timeout=5) as response:
            answer = json.loads(response.read())
        assert ["image" in r["metadata"] for r in answer] == [False, False, True]  # left out, as clip-retrieval does
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
    assert process.returncode is not None, output[-2000:]
