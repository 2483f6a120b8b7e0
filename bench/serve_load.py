"""A bounded concurrent load test of `openalign serve` on loopback: C clients x Q queries each.

The service runs in a child process (uvicorn, as `openalign serve` runs it) over the demo model's emoji
index (built here from `runs/demo/model` and the emoji corpus if missing: run `make demo` first).
Each client thread sends its queries one after another: text queries, and one in four an image
query by id with a "+ text" term. Reports p50/p99 latency, throughput and the error count.

    .venv/bin/python bench/serve_load.py [--clients 8] [--queries 200]

Writes its table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from _common import ROOT, free_port, write_section

WORDS = ("cat", "dog", "face", "heart", "red", "blue", "flag", "hand", "smiling", "food", "car", "tree", "moon",
         "star", "house", "person", "book", "music", "sports", "weather")


def ensure_index(model: Path, index: Path) -> None:
    if (index / "index.json").is_file():
        return
    if not (model / "config.json").is_file():
        raise SystemExit(f"no demo model at {model}: run `make demo` first")
    emb = index.parent / "emoji-emb"
    openalign = [sys.executable, "-m", "openalign.cli"]
    subprocess.run(openalign + ["embed", str(model), "--images", str(ROOT / "data/emoji/train"), "--images",
                                str(ROOT / "data/emoji/eval"), "--out", str(emb), "--quiet"], check=True, cwd=ROOT)
    subprocess.run(openalign + ["index", str(emb), "--out", str(index)], check=True, cwd=ROOT)


def client(url: str, queries: int, seed: int, latencies: list, errors: list) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(queries):
            if rng.random() < 0.25:
                body = {"image_id": rng.randrange(3000), "plus": [rng.choice(WORDS)], "k": 24}
            else:
                body = {"text": " ".join(rng.sample(WORDS, rng.randint(1, 3))), "k": 24}
            start = time.perf_counter()
            try:
                response = http.post("/search", json=body)
                ok = response.status_code == 200 and len(response.json()["results"]) == 24
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            if not ok:
                errors.append(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--model", default=str(ROOT / "runs/demo/model"))
    parser.add_argument("--index", default=str(ROOT / "runs/demo/emoji-index"))
    args = parser.parse_args()
    ensure_index(Path(args.model), Path(args.index))
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    server = subprocess.Popen([sys.executable, "-m", "openalign.cli", "serve", args.index, "--model", args.model,
                               "--port", str(port)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the service did not start")
            time.sleep(0.2)
        latencies: list[float] = []
        errors: list = []
        threads = [threading.Thread(target=client, args=(url, args.queries, i, latencies, errors))
                   for i in range(args.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=30)
    ordered = sorted(latencies)
    p50, p99 = statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    total = args.clients * args.queries
    rows = [
        f"### Service load test ({args.clients} clients x {args.queries} queries on loopback, demo model, "
        f"emoji index, {os.cpu_count()} cores)", "",
        "| queries | errors | p50 latency | p99 latency | queries/s |", "|---|---|---|---|---|",
        f"| {total:,} | {len(errors)} | {p50 * 1e3:.0f} ms | {p99 * 1e3:.0f} ms | {total / wall:.1f} |", "",
        "- three in four are text queries of 1-3 words, one in four an indexed image with a \"+ text\" term; k=24",
        f"- command: `.venv/bin/python bench/serve_load.py --clients {args.clients} --queries {args.queries}`", "",
    ]
    write_section("LOAD", "\n".join(rows))
    print("\n".join(rows))
    print(f"LOAD errors={len(errors)} target=0 {'PASS' if not errors else 'FAIL'}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
