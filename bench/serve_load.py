"""A bounded concurrent load test of `openalign serve` on loopback: C clients x Q queries each, clean and under abuse.

The service runs in a child process (uvicorn, as `openalign serve` runs it) over the demo model's emoji
index (built here from `runs/demo/model` and the emoji corpus if missing: run `make demo` first).
Each client thread sends its queries one after another: text queries, and one in four an image
query by id with a "+ text" term.

Phase 1 (clean): the normal clients alone. Phase 2 (abuse): the same normal clients again, while A abusive
clients (threads of a second process: an attacker is another process) send, in a loop until the normal ones
finish: bodies over the limit (declared 50 MB, and a chunked 20 MB body), 50,000-character plus terms, NaN /
Infinity weights, bad base64, and a non-image upload. Every abusive request must get a 4xx (never a 5xx or a
dropped connection for the small ones),
the normal clients must see 0 errors and a p99 within 2x of the clean run, and the server's memory must
not grow by the size of what was thrown at it.

Phases 1b and 2b: the same, through clip-retrieval's API (`POST /knn-service` with the body its ClipClient sends:
`text`, or an uploaded image one time in four, `num_images` 24, `deduplicate`, the safety flags), beside abusers
sending it bodies over the limit, a 50,000-character text, NaN in `embedding_input`, an `image_url`, bad base64, a
non-image and a `num_result_ids` of a billion: every abusive request a 4xx, the normal clients 0 errors and a p99
within 2x of their clean run.

Phase 3 (concurrent, mixed): a second index of the same images built from many embed parts (`--part-size 256`:
more metadata row groups than the reader caches) with `--kind ivf --codes flat` (the cell-major batched scan),
and 16 clients x 100 mixed requests started together: text queries, queries by image id, image id + text,
uploaded images with a term, and thumbnails. 0 errors (before the fix: 348 of 400 failed and libparquet
segfaulted).

Phase 4 (large k): a synthetic index of `--large-n` (100,000) random unit vectors of the model's width, flat and
IVF, served together; one client sends text queries with k=10 and k=10,000 to `/search` (metadata for the first
200) and num_result_ids 10 and 10,000 to `/knn-service` (metadata for the first num_images: 10, or all 10,000):
p50/p99 latency and the fewest results any query got. clip-retrieval issue #213 reports 2,000 results in 38 s.

    .venv/bin/python bench/serve_load.py [--clients 8] [--queries 200] [--abusers 4] [--mixed-clients 16]

Writes its table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq

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


def clip_client_body(rng: random.Random, upload: str) -> str:
    """What clip-retrieval's ClipClient (2.45.0) posts: a JSON string, no content type, its default flags."""
    image = rng.random() < 0.25
    return json.dumps({"text": None if image else " ".join(rng.sample(WORDS, rng.randint(1, 3))),
                       "image": upload if image else None, "image_url": None, "embedding_input": None,
                       "deduplicate": True, "use_safety_model": True, "use_violence_detector": True,
                       "indice_name": "emoji", "use_mclip": False, "aesthetic_score": 9, "aesthetic_weight": 0.5,
                       "modality": "image", "num_images": 24, "num_result_ids": 24})


def client(url: str, queries: int, seed: int, latencies: list, errors: list, api: str = "search") -> None:
    rng = random.Random(seed)
    upload = base64.b64encode(_an_emoji_png()).decode() if api == "knn" else ""
    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(queries):
            if api == "knn":
                body = clip_client_body(rng, upload)
            elif rng.random() < 0.25:
                body = {"image_id": rng.randrange(3000), "plus": [rng.choice(WORDS)], "k": 24}
            else:
                body = {"text": " ".join(rng.sample(WORDS, rng.randint(1, 3))), "k": 24}
            start = time.perf_counter()
            try:
                if api == "knn":
                    response = http.post("/knn-service", content=body)
                    ok = response.status_code == 200 and 0 < len(response.json()) <= 24
                else:
                    response = http.post("/search", json=body)
                    ok = response.status_code == 200 and len(response.json()["results"]) == 24
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            if not ok:
                errors.append(body)


def ensure_parted_index(model: Path, index: Path) -> None:
    """The emoji images again, in embed parts of 256 images, behind an IVF index with float32 cells."""
    if (index / "index.json").is_file():
        return
    emb = index.parent / "emoji-emb-parts"
    openalign = [sys.executable, "-m", "openalign.cli"]
    subprocess.run(openalign + ["embed", str(model), "--images", str(ROOT / "data/emoji/train"), "--images",
                                str(ROOT / "data/emoji/eval"), "--out", str(emb), "--part-size", "256", "--quiet"],
                   check=True, cwd=ROOT)
    subprocess.run(openalign + ["index", str(emb), "--out", str(index), "--kind", "ivf", "--codes", "flat"], check=True,
                   cwd=ROOT)


def mixed_client(url: str, queries: int, seed: int, count: int, upload: str, barrier: threading.Barrier,
                 latencies: list, errors: list) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=60) as http:
        barrier.wait()  # every client's first request at once: cold caches are raced
        for i in range(queries):
            kind = (seed + i) % 5
            start = time.perf_counter()
            try:
                if kind == 4:
                    response = http.get(f"/image/{rng.randrange(count)}", params={"size": 64})
                    ok = response.status_code == 200 and response.content[:2] == b"\xff\xd8"
                else:
                    body = [{"text": " ".join(rng.sample(WORDS, rng.randint(1, 3))), "k": 24},
                            {"image_id": rng.randrange(count), "k": 24},
                            {"image_id": rng.randrange(count), "plus": [rng.choice(WORDS)],
                             "minus": [rng.choice(WORDS)], "k": 24},
                            {"image": upload, "plus": [rng.choice(WORDS)], "k": 24}][kind]
                    response = http.post("/search", json=body)
                    ok = response.status_code == 200 and len(response.json()["results"]) == 24
            except httpx.HTTPError as err:
                ok, response = False, err
            latencies.append(time.perf_counter() - start)
            if not ok:
                errors.append(f"{kind}: {getattr(response, 'status_code', response)}")


def run_mixed(index: Path, model: Path, clients: int, queries: int) -> dict:
    server, url = start_server(index, model)
    try:
        count = httpx.get(url + "/health", timeout=5).json()["count"]
        upload = base64.b64encode(_an_emoji_png()).decode()
        latencies, errors = [], []
        barrier = threading.Barrier(clients)
        threads = [threading.Thread(target=mixed_client, args=(url, queries, i, count, upload, barrier, latencies,
                                                                errors)) for i in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        alive = server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=30)
    ordered = sorted(latencies)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "qps": len(ordered) / wall, "errors": len(errors), "queries": len(ordered), "alive": alive,
            "examples": errors[:3], "count": count}


def _an_emoji_png() -> bytes:
    """One image of the emoji corpus, as an upload: the first sample's image bytes of the first eval shard."""
    import tarfile

    shard = sorted((ROOT / "data/emoji/eval").glob("*.tar"))[0]
    with tarfile.open(shard) as tar:
        member = next(m for m in tar if m.name.rsplit(".", 1)[-1] in ("jpg", "png", "webp"))
        return tar.extractfile(member).read()


def start_server(indexes: Path | list[str], model: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    specs = [str(indexes)] if isinstance(indexes, Path) else indexes
    server = subprocess.Popen([sys.executable, "-m", "openalign.cli", "serve", *specs, "--model", str(model),
                               "--port", str(port)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit("the service did not start")
        time.sleep(0.2)


def _chunks(total: int, size: int = 2**20):
    block = b'{"text": "' + b"a" * (size - 10)
    for _ in range(total // size):
        yield block
        block = b"a" * size


ABUSE = {  # name -> (request kwargs for httpx.Client.post, the statuses that are a correct answer)
    "declared 50 MB body": (lambda: {"content": b"{" + b" " * 50 * 2**20 + b"}",
                                     "headers": {"content-type": "application/json"}}, {413}),
    "chunked 20 MB body": (lambda: {"content": _chunks(20 * 2**20), "headers": {"content-type": "application/json"}},
                           {413}),
    "50,000-char plus term": (lambda: {"json": {"image_id": 1, "plus": ["x" * 50_000]}}, {422}),
    "NaN weight": (lambda: {"content": json.dumps({"image_id": 1, "plus": ["red"], "text_weight": float("nan")}),
                            "headers": {"content-type": "application/json"}}, {422}),
    "Infinity weight": (lambda: {"content": json.dumps({"image_id": 1, "image_weight": float("inf")}),
                                 "headers": {"content-type": "application/json"}}, {422}),
    "bad base64": (lambda: {"json": {"image": "%%% not base64 %%%" * 100}}, {400}),
    "not an image": (lambda: {"json": {"image": base64.b64encode(os.urandom(50_000)).decode()}}, {400}),
}


KNN_ABUSE = {  # the same for /knn-service (clip-retrieval's API)
    "declared 50 MB body": ABUSE["declared 50 MB body"],
    "chunked 20 MB body": ABUSE["chunked 20 MB body"],
    "50,000-char text": (lambda: {"json": {"text": "x" * 50_000, "num_images": 24}}, {422}),
    "NaN in embedding_input": (lambda: {"content": json.dumps({"embedding_input": [float("nan")] * 64,
                                                                "num_images": 24})}, {422}),
    "image_url": (lambda: {"json": {"image_url": "http://169.254.169.254/latest", "num_images": 24}}, {400}),
    "bad base64": (lambda: {"json": {"image": "%%% not base64 %%%" * 100, "num_images": 24}}, {400}),
    "not an image": (lambda: {"json": {"image": base64.b64encode(os.urandom(50_000)).decode(), "num_images": 24}},
                     {400}),
    "num_result_ids 1e9": (lambda: {"json": {"text": "cat", "num_images": 24, "num_result_ids": 10**9}}, {400}),
}


def abuser(url: str, seed: int, stop: threading.Event, answers: dict, api: str = "search") -> None:
    table, route = (KNN_ABUSE, "/knn-service") if api == "knn" else (ABUSE, "/search")
    kinds = itertools.cycle(random.Random(seed).sample(list(table), len(table)))
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.is_set():
            kind = next(kinds)
            make, good = table[kind]
            try:
                status = http.post(route, **make()).status_code
                outcome = "correct" if status in good else f"HTTP {status}"
            except httpx.HTTPError as err:  # the server may close a connection it refused a large body on
                outcome = "closed" if "body" in kind else type(err).__name__
            answers.setdefault(kind, {}).setdefault(outcome, 0)
            answers[kind][outcome] += 1


def server_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def abusers_process(url: str, abusers: int, seed: int, started, stop, results, api: str = "search") -> None:
    """The abusive clients, in a process of their own (as an attacker is): building 50 MB bodies and base64 noise
    in the measuring process held its GIL, and the normal clients' latencies then measured the bench, not the
    service (their p99 doubled with the server idle between requests)."""
    answers: dict = {}
    event = threading.Event()
    bad = [threading.Thread(target=abuser, args=(url, seed + 100 + i, event, answers, api)) for i in range(abusers)]
    for t in bad:
        t.start()
    started.set()
    stop.wait()
    event.set()
    for t in bad:
        t.join()
    results.put(answers)


def run_phase(url: str, clients: int, queries: int, abusers: int, seed: int, api: str = "search") -> dict:
    import multiprocessing

    latencies: list[float] = []
    errors: list = []
    answers: dict = {}
    context = multiprocessing.get_context("spawn")
    started, stop, results = context.Event(), context.Event(), context.Queue()
    process = None
    if abusers:
        process = context.Process(target=abusers_process, args=(url, abusers, seed, started, stop, results, api))
        process.start()
        started.wait(60)
    normal = [threading.Thread(target=client, args=(url, queries, seed + i, latencies, errors, api))
              for i in range(clients)]
    start = time.perf_counter()
    for t in normal:
        t.start()
    for t in normal:
        t.join()
    wall = time.perf_counter() - start
    if process is not None:
        stop.set()
        answers = results.get(timeout=120)
        process.join(timeout=60)
    ordered = sorted(latencies)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "qps": len(ordered) / wall, "errors": len(errors), "queries": len(ordered), "answers": answers}


def ensure_large_index(model: Path, dim: int, n: int, out: Path) -> dict[str, Path]:
    """A synthetic embed output of `n` random unit vectors (the model's width, metadata for every row), indexed flat
    and IVF: the indexes by name."""
    import numpy as np

    from openalign.index.embed import MANIFEST, _write_part

    emb, indexes = out / f"synthetic-{n}", {"flat": out / f"synthetic-{n}-flat", "ivf": out / f"synthetic-{n}-ivf"}
    if not (emb / MANIFEST).is_file():
        rng, part, parts = np.random.default_rng(0), 50_000, {}
        emb.mkdir(parents=True, exist_ok=True)
        for i, start in enumerate(range(0, n, part)):
            x = rng.standard_normal((min(part, n - start), dim)).astype(np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            rows = [{"key": f"{start + j}.jpg", "path": f"/synthetic/{start + j}.jpg",
                     "caption": f"synthetic {start + j}", "width": 256, "height": 256} for j in range(len(x))]
            _write_part(emb, i, x, rows)
            parts[str(i)] = {"rows": len(x), "skipped": 0}
        (emb / MANIFEST).write_text(json.dumps({"complete": True, "parts": parts, "model": str(model), "dim": dim}))
    openalign = [sys.executable, "-m", "openalign.cli"]
    for kind, index in indexes.items():
        if not (index / "index.json").is_file():
            subprocess.run(openalign + ["index", str(emb), "--out", str(index), "--kind", kind, "--quiet"], check=True,
                           cwd=ROOT)
    return indexes


LARGE_K = [("/search", "k=10", lambda q, name: {"text": q, "k": 10, "index": name}),
           ("/search", "k=10,000 (metadata: first 200)", lambda q, name: {"text": q, "k": 10_000, "index": name}),
           ("/knn-service", "num_result_ids=10", lambda q, name: {"text": q, "num_images": 10, "num_result_ids": 10,
                                                                   "indice_name": name}),
           ("/knn-service", "num_result_ids=10,000, num_images=10",
            lambda q, name: {"text": q, "num_images": 10, "num_result_ids": 10_000, "indice_name": name}),
           ("/knn-service", "num_result_ids=10,000, num_images=10,000",
            lambda q, name: {"text": q, "num_images": 10_000, "num_result_ids": 10_000, "indice_name": name})]


def run_large_k(indexes: dict[str, Path], model: Path, queries: int) -> list[dict]:
    server, url = start_server([f"{name}={path}" for name, path in indexes.items()], model)
    rows = []
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            count = http.get("/health").json()["count"]
            for name in indexes:
                for route, what, make in LARGE_K:
                    rng, latencies, fewest = random.Random(0), [], None
                    for i in range(queries + 2):  # the first two warm up
                        body = make(" ".join(rng.sample(WORDS, rng.randint(1, 3))), name)
                        start = time.perf_counter()
                        response = http.post(route, json=body)
                        elapsed = time.perf_counter() - start
                        response.raise_for_status()
                        got = response.json()
                        got = len(got["results"] if route == "/search" else got)
                        if i >= 2:
                            latencies.append(elapsed)
                            fewest = got if fewest is None else min(fewest, got)
                    ordered = sorted(latencies)
                    rows.append({"index": name, "route": route, "what": what, "fewest": fewest, "count": count,
                                 "p50": statistics.median(ordered),
                                 "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]})
    finally:
        server.terminate()
        server.wait(timeout=30)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--abusers", type=int, default=4)
    parser.add_argument("--mixed-clients", type=int, default=16)
    parser.add_argument("--mixed-queries", type=int, default=100)
    parser.add_argument("--model", default=str(ROOT / "runs/demo/model"))
    parser.add_argument("--index", default=str(ROOT / "runs/demo/emoji-index"))
    parser.add_argument("--large-n", type=int, default=100_000, help="vectors of the synthetic large-k index")
    parser.add_argument("--large-queries", type=int, default=30, help="queries per large-k configuration")
    args = parser.parse_args()
    ensure_index(Path(args.model), Path(args.index))
    parted = Path(args.index).parent / "emoji-index-ivf-parts"
    ensure_parted_index(Path(args.model), parted)
    server, url = start_server([f"emoji={args.index}"], Path(args.model))
    try:
        clean = run_phase(url, args.clients, args.queries, 0, seed=0)
        rss_before = server_rss_mib(server.pid)
        abused = run_phase(url, args.clients, args.queries, args.abusers, seed=0)
        rss_after = server_rss_mib(server.pid)
        knn_clean = run_phase(url, args.clients, args.queries, 0, seed=1, api="knn")
        knn_abused = run_phase(url, args.clients, args.queries, args.abusers, seed=1, api="knn")
        alive = httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
    wrong = {k: {o: n for o, n in v.items() if o not in ("correct", "closed")} for k, v in abused["answers"].items()}
    wrong = {k: v for k, v in wrong.items() if v}
    p99_ratio = abused["p99"] / clean["p99"]
    rows = [
        f"### Service load test ({args.clients} clients x {args.queries} queries on loopback, demo model, "
        f"emoji index, {os.cpu_count()} cores), clean and beside {args.abusers} abusive clients", "",
        "| phase | queries | errors | p50 latency | p99 latency | queries/s |", "|---|---|---|---|---|---|",
        *(f"| {name} | {r['queries']:,} | {r['errors']} | {r['p50'] * 1e3:.0f} ms | {r['p99'] * 1e3:.0f} ms | "
          f"{r['qps']:.1f} |" for name, r in (("clean", clean), ("under abuse", abused))), "",
        f"Under abuse the normal clients' p99 is {p99_ratio:.2f}x the clean run's (target <= 2x); the server's "
        f"resident memory went from {rss_before:,.0f} to {rss_after:,.0f} MiB while it was sent "
        f"{sum(sum(v.values()) for v in abused['answers'].values()):,} abusive requests:", "",
        "| abusive request | answers |", "|---|---|",
        *(f"| {kind} | " + ", ".join(f"{o} {n:,}" for o, n in sorted(v.items())) + " |"
          for kind, v in sorted(abused["answers"].items())), "",
        "- normal queries: three in four are text queries of 1-3 words, one in four an indexed image with a "
        "\"+ text\" term; k=24",
        "- correct: 413 for bodies over the limit, 422 for over-long terms and non-finite weights, 400 for bad "
        "base64 and non-images; closed: the server refused a large body and closed the connection mid-upload",
        f"- command: `.venv/bin/python bench/serve_load.py --clients {args.clients} --queries {args.queries} "
        f"--abusers {args.abusers}`", "",
    ]
    knn_wrong = {k: {o: n for o, n in v.items() if o not in ("correct", "closed")} for k, v in
                 knn_abused["answers"].items()}
    knn_wrong = {k: v for k, v in knn_wrong.items() if v}
    knn_ratio = knn_abused["p99"] / knn_clean["p99"]
    rows += [
        f"### clip-retrieval's API under abuse ({args.clients} clients x {args.queries} `POST /knn-service` requests, "
        f"the body ClipClient sends), clean and beside {args.abusers} abusive clients", "",
        "| phase | queries | errors | p50 latency | p99 latency | queries/s |", "|---|---|---|---|---|---|",
        *(f"| {name} | {r['queries']:,} | {r['errors']} | {r['p50'] * 1e3:.0f} ms | {r['p99'] * 1e3:.0f} ms | "
          f"{r['qps']:.1f} |" for name, r in (("clean", knn_clean), ("under abuse", knn_abused))), "",
        f"Under abuse the normal clients' p99 is {knn_ratio:.2f}x the clean run's (target <= 2x); "
        f"{sum(sum(v.values()) for v in knn_abused['answers'].values()):,} abusive requests:", "",
        "| abusive request | answers |", "|---|---|",
        *(f"| {kind} | " + ", ".join(f"{o} {n:,}" for o, n in sorted(v.items())) + " |"
          for kind, v in sorted(knn_abused["answers"].items())), "",
        "- normal requests: ClipClient's body (a JSON string without a content type; `deduplicate`, the safety and "
        "aesthetic flags, reported as not applied): three in four a text of 1-3 words, one in four an uploaded emoji; "
        "num_images 24",
        "- correct: 413 for bodies over the limit, 422 for an over-long text and NaN, 400 for `image_url`, bad base64, "
        "non-images and num_result_ids over 10,000", "",
    ]
    dim = json.loads((Path(args.index) / "index.json").read_text())["dim"]
    large = run_large_k(ensure_large_index(Path(args.model), dim, args.large_n, Path(args.index).parent),
                        Path(args.model), args.large_queries)
    base = {(r["index"], r["route"]): r["p50"] for r in large if r["what"] in ("k=10", "num_result_ids=10")}
    rows += [
        f"### Large k ({args.large_n:,} synthetic unit vectors of {dim} dimensions, flat and IVF; one client, "
        f"{args.large_queries} text queries each)", "",
        "| index | route | request | p50 latency | p99 latency | p50 vs k=10 | fewest results |",
        "|---|---|---|---|---|---|---|",
        *(f"| {r['index']} | `{r['route']}` | {r['what']} | {r['p50'] * 1e3:.0f} ms | {r['p99'] * 1e3:.0f} ms | "
          f"{r['p50'] / base[(r['index'], r['route'])]:.2f}x | {r['fewest']:,} |" for r in large), "",
        "- the latency is the whole request on loopback: encoding the text, the search, the metadata of the results "
        "that carry it, and the JSON; clip-retrieval issue #213 reports 2,000 results in 38 s",
        "- IVF: a large k probes the cells that hold about 4k vectors for that search (the tuned nprobe's cells hold "
        "a few hundred), so 10,000 results come back",
        f"- command: `.venv/bin/python bench/serve_load.py --large-n {args.large_n} --large-queries "
        f"{args.large_queries}`", "",
    ]
    mixed = run_mixed(parted, Path(args.model), args.mixed_clients, args.mixed_queries)
    groups = pq.ParquetFile(parted / "meta.parquet").num_row_groups
    rows += [
        f"### Concurrent mixed requests ({args.mixed_clients} clients x {args.mixed_queries}, started together) on an "
        f"IVF index with float32 cells over {mixed['count']:,} images from {groups} embed parts", "",
        "| requests | errors | p50 latency | p99 latency | requests/s | server alive after |",
        "|---|---|---|---|---|---|",
        f"| {mixed['queries']:,} | {mixed['errors']} | {mixed['p50'] * 1e3:.0f} ms | {mixed['p99'] * 1e3:.0f} ms | "
        f"{mixed['qps']:.1f} | {'yes' if mixed['alive'] else 'NO'} |", "",
        f"- the metadata has {groups} row groups (the reader caches 8); one request in five each: a text query, an "
        "image id, an image id with a plus and a minus term, an uploaded emoji with a term, a thumbnail",
        "- before the fix (one pyarrow ParquetFile shared by request threads): 348 of 400 requests failed, then a "
        "segfault in libparquet",
        f"- command: `.venv/bin/python bench/serve_load.py --mixed-clients {args.mixed_clients} --mixed-queries "
        f"{args.mixed_queries}`", "",
    ]
    write_section("LOAD", "\n".join(rows))
    print("\n".join(rows))
    verdict_mixed = "PASS" if not mixed["errors"] and mixed["alive"] else "FAIL"
    print(f"LOAD mixed_errors={mixed['errors']} examples={mixed['examples']} {verdict_mixed}")
    knn_ok = not knn_clean["errors"] and not knn_abused["errors"] and knn_ratio <= 2.0 and not knn_wrong
    large_ok = all(r["fewest"] == min(r["count"], 10 if r["what"] in ("k=10", "num_result_ids=10") else 10_000)
                   for r in large)
    print(f"LOAD knn errors={knn_clean['errors'] + knn_abused['errors']} p99_ratio={knn_ratio:.2f} "
          f"wrong_answers={knn_wrong} {'PASS' if knn_ok else 'FAIL'}")
    print(f"LOAD large_k full_results={large_ok} {'PASS' if large_ok else 'FAIL'}")
    ok = not clean["errors"] and not abused["errors"] and p99_ratio <= 2.0 and not wrong and alive
    ok = ok and not mixed["errors"] and mixed["alive"] and knn_ok and large_ok
    print(f"LOAD errors={clean['errors'] + abused['errors']} p99_ratio={p99_ratio:.2f} wrong_answers={wrong} "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
