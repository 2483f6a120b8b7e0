"""P12 an index larger than RAM: 10M x 640 vectors (25.6 GB as float32, more than this machine's 24 GiB)
stored as float16 parts, indexed within a 4 GiB budget, then searched from a memory-mapped open.

Phases, each in a process of its own so that each peak RSS is its own:
1. `generate`: float16 parts of normalized vectors drawn around 4,096 centres with noise as large as the
   centres' scale (`--noise 1.0`: overlapping clusters; at 1.5 the collection is close to uniform on the
   sphere and IVF needs half its cells for recall 0.95), written as an `openalign embed` output; 200
   held-out queries from the same distribution.
2. `truth`: the queries' exact top 10 over all 10M vectors (streamed, as the index's own tuning is).
3. `build`: `openalign index EMB --kind ivf --memory 4G --workers 2`: IVF trained on a sample, then, since
   8-bit codes for 10M vectors (6.5 GB) pass half the budget, IVF shards added by 2 worker processes.
   The peak is the largest sum of resident memory over the build's process tree (driver, fork server,
   add workers), sampled every 0.2 s, and never below the driver's own VmHWM.
4. `query`: `index.opened.load` (memory-mapped shards), then one query at a time and a batch of 200;
   recall@10 against phase 2, latency, and the RSS after the open and after the queries.

    .venv/bin/python bench/index_scale.py [--n 10000000] [--dim 640] [--nlist 1024] [--dir /tmp/p12]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines. Needs ~14 GB of disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import ROOT, peak_rss_mib, resident_mib, verdict, write_section

GIB = 2**30


def phase_generate(args) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from openalign.index.embed import MANIFEST, META_SCHEMA

    start = time.perf_counter()
    emb = Path(args.dir) / "emb"
    emb.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((4_096, args.dim), dtype=np.float32)
    parts = {}

    def draw(m: int) -> np.ndarray:
        x = centres[rng.integers(0, len(centres), m)]
        x += args.noise * rng.standard_normal((m, args.dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    for i, first in enumerate(range(0, args.n, args.part)):
        m = min(args.part, args.n - first)
        np.save(emb / f"part-{i:06d}.npy", draw(m).astype(np.float16))
        keys = pa.array([f"v{first + j}" for j in range(m)])
        empty = pa.array([""] * m)
        ones = pa.array(np.ones(m, np.int32))
        pq.write_table(pa.Table.from_arrays([keys, empty, empty, ones, ones], schema=META_SCHEMA),
                       emb / f"meta-{i:06d}.parquet")
        parts[str(i)] = {"rows": m, "skipped": 0}
    (emb / MANIFEST).write_text(json.dumps({"complete": True, "parts": parts, "model": "synthetic", "dim": args.dim,
                                            "count": args.n, "dtype": "float16"}))
    np.save(Path(args.dir) / "queries.npy", draw(args.queries))
    return {"generate_s": time.perf_counter() - start}


def phase_truth(args) -> dict:
    from openalign.index.build import Parts, streaming_search
    from openalign.index.parts import part_files

    start = time.perf_counter()
    queries = np.load(Path(args.dir) / "queries.npy")
    _, ids = streaming_search(Parts(part_files(Path(args.dir) / "emb")), queries, 10)
    np.save(Path(args.dir) / "truth.npy", ids)
    return {"truth_s": time.perf_counter() - start, "truth_peak_mib": peak_rss_mib()}


def tree_rss_mib(root: int) -> float:
    """Resident memory of process `root` and all its descendants now (the add workers are children of a
    fork server, not of us: resource.RUSAGE_CHILDREN never sees them)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0.0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def phase_build(args) -> dict:
    import threading

    from openalign import cli

    out = Path(args.dir) / "index"
    shutil.rmtree(out, ignore_errors=True)
    peak, stop = [0.0], threading.Event()

    def watch():  # the sum over the process tree, sampled: what the machine must hold at once
        while not stop.wait(0.2):
            peak[0] = max(peak[0], tree_rss_mib(os.getpid()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    code = cli.main(["index", str(Path(args.dir) / "emb"), "--out", str(out), "--kind", "ivf", "--nlist",
                     str(args.nlist), "--memory", args.memory, "--workers", str(args.workers), "--quiet"])
    build_s = time.perf_counter() - start
    stop.set()
    watcher.join()
    if code:
        raise SystemExit(code)
    info = json.loads((out / "index.json").read_text())
    return {"build_s": build_s, "driver_peak_mib": peak_rss_mib(), "tree_peak_mib": peak[0],
            "info": info, "index_bytes": sum(f.stat().st_size for f in out.iterdir())}


def phase_query(args) -> dict:
    from openalign.index.build import recall_at_10
    from openalign.index.opened import load

    queries = np.load(Path(args.dir) / "queries.npy")
    truth = np.load(Path(args.dir) / "truth.npy")
    before = resident_mib()
    start = time.perf_counter()
    index = load(Path(args.dir) / "index")
    open_s = time.perf_counter() - start
    after_open = resident_mib()
    single, found = [], []
    for q in queries:
        t = time.perf_counter()
        found.append(index.search(q[None], 10)[1][0])
        single.append(time.perf_counter() - t)
    t = time.perf_counter()
    _, batch_ids = index.search(queries, 10)
    batch_s = time.perf_counter() - t
    return {"open_s": open_s, "rss_before_open_mib": before, "rss_after_open_mib": after_open,
            "rss_after_queries_mib": resident_mib(), "query_peak_mib": peak_rss_mib(),
            "latency_ms_p50": 1000 * statistics.median(single),
            "latency_ms_p95": 1000 * float(np.percentile(single, 95)),
            "batch_qps": len(queries) / batch_s, "recall_single": recall_at_10(np.stack(found), truth),
            "recall_batch": recall_at_10(batch_ids, truth)}


PHASES = {"generate": phase_generate, "truth": phase_truth, "build": phase_build, "query": phase_query}


def run_phase(name: str, argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, "--phase", name, *argv], capture_output=True, text=True,
                          env=os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    if done.returncode:
        raise SystemExit(f"phase {name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=640)
    parser.add_argument("--part", type=int, default=250_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--noise", type=float, default=1.0, help="noise scale relative to the centres' (per dimension)")
    parser.add_argument("--memory", default="4G")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", default="/tmp/openalign-p12")
    parser.add_argument("--keep", action="store_true", help="keep the generated data and the index")
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](args), default=float))
        return
    argv = [a for a in sys.argv[1:] if a != "--keep"]
    results = {}
    for name in PHASES:
        print(f"P12 phase {name} ...", flush=True)
        results |= run_phase(name, argv)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    info = results["info"]
    from openalign.sizes import parse_size

    budget_gib = parse_size(args.memory, "--memory") / GIB
    build_peak = max(results["driver_peak_mib"], results["tree_peak_mib"]) / 1024
    float32_gib = args.n * args.dim * 4 / GIB
    lines = [
        verdict("P12", "build_peak_rss_gib", build_peak, budget_gib, at_least=False),
        verdict("P12", "recall_at_10", results["recall_batch"], 0.95, at_least=True, fmt=".3f"),
        f"P12 float32_gib={float32_gib:.1f} "
        f"ram_gib={os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GIB:.1f}",
        f"P12 build_s={results['build_s']:.0f} query_ms_p50={results['latency_ms_p50']:.1f} "
        f"query_rss_mib={results['rss_after_queries_mib']:.0f}",
    ]
    table = "\n".join([
        "## P12 index larger than RAM",
        "",
        f"`{' '.join(['.venv/bin/python bench/index_scale.py', *argv])}`: {args.n:,} x {args.dim} vectors (noise "
        f"{args.noise} x the centres' scale) stored as "
        f"float16 parts ({args.n * args.dim * 2 / GIB:.1f} GiB on disk; {float32_gib:.1f} GiB as float32, more than "
        f"this machine's RAM), indexed by `openalign index --kind ivf --nlist {args.nlist} --memory {args.memory} "
        f"--workers {args.workers}`.",
        "",
        "| what | measured |",
        "|---|---|",
        f"| build time (train on {info['params']['trained_on']:,} vectors, add in {len(info['shards'])} IVF shards "
        f"by {args.workers} processes, tune) | {results['build_s']:.0f} s |",
        f"| build peak RSS, summed over the process tree (driver VmHWM {results['driver_peak_mib']:.0f} MiB) | "
        f"**{build_peak:.2f} GiB** (budget {args.memory}) |",
        f"| index on disk ({info['params']['codes']} codes + ids + direct maps) "
        f"| {results['index_bytes'] / GIB:.2f} GiB |",
        f"| nprobe (tuned on the first shard for recall@10 >= 0.95) | {info['params']['nprobe']} of {args.nlist} |",
        f"| recall@10 of {args.queries} held-out queries vs exact search over all {args.n:,} | "
        f"**{results['recall_batch']:.3f}** |",
        f"| memory-mapped open | {results['open_s'] * 1000:.0f} ms; RSS {results['rss_before_open_mib']:.0f} -> "
        f"{results['rss_after_open_mib']:.0f} MiB |",
        f"| one query at a time | p50 {results['latency_ms_p50']:.1f} ms, p95 {results['latency_ms_p95']:.1f} ms |",
        f"| a batch of {args.queries} queries | {results['batch_qps']:.0f} queries/s |",
        f"| RSS after all queries (mapped pages of the probed lists included) "
        f"| {results['rss_after_queries_mib']:.0f} MiB |",
        f"| exact truth, streamed over the float16 parts | {results['truth_s']:.0f} s, "
        f"peak {results['truth_peak_mib']:.0f} MiB |",
        "",
        "```",
        *lines,
        "```",
    ])
    write_section("P12", table)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
