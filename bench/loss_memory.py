"""P1, P2: the exact chunked contrastive loss against the naive full-matrix loss.

Each case runs forward + backward of the symmetric label-smoothed loss (smoothing 0.1) in a fresh
child process; its extra peak memory is VmHWM after minus resident memory before (inputs already
allocated). Cases: naive and chunked at N=16,384, chunked at N=65,536 (d=640, fp32, all threads).
Gradients of the chunked loss are compared with an fp64 naive reference at --check-n; FLOPs are
counted by torch.utils.flop_counter at a small N and reported per N^2*d.

    .venv/bin/python bench/loss_memory.py [--n 16384] [--big-n 65536] [--dim 640] [--repeats 2]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _common import peak_rss_mib, resident_mib, verdict, write_section

HERE = Path(__file__).resolve()


def inputs(n: int, dim: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=-1)
    txt = F.normalize(img + 1.5 * torch.randn(n, dim, generator=g, dtype=torch.float64) / dim**0.5, dim=-1)
    t = torch.tensor(1 / 64, dtype=torch.float64)
    return [x.to(dtype).requires_grad_() for x in (img, txt, t)]


def loss_fn(kind: str):
    from openalign import loss as L

    if kind == "naive":
        return lambda img, txt, t: L.softmax_loss(img, txt, t, 0.1)
    return lambda img, txt, t: L.chunked_cross_entropy(img, txt, t, 0.1, columns=True)


def child(args) -> None:
    torch.set_num_threads(args.threads)
    img, txt, t = inputs(args.n, args.dim)
    fn = loss_fn(args.child)
    small = inputs(64, args.dim)
    fn(*small).backward()  # load BLAS and warm the allocator before the baseline
    before = resident_mib()
    times = []
    for _ in range(args.repeats):
        img.grad = txt.grad = t.grad = None
        start = time.perf_counter()
        fn(img, txt, t).backward()
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "extra_mib": peak_rss_mib() - before}))


def run_child(kind: str, n: int, args, repeats: int) -> dict:
    cmd = [sys.executable, str(HERE), "--child", kind, "--n", str(n), "--dim", str(args.dim),
           "--repeats", str(repeats), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def gradient_error(n: int, dim: int) -> float:
    """Largest relative gradient difference (img, txt, temperature) of fp32 chunked vs fp64 naive."""
    ours = inputs(n, dim)
    loss_fn("chunked")(*ours).backward()
    ref = inputs(n, dim, torch.float64)
    loss_fn("naive")(*ref).backward()
    return max(float((a.grad.double() - b.grad).abs().max() / b.grad.abs().max()) for a, b in zip(ours, ref))


def flops_per_n2d(kind: str, n: int, dim: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    img, txt, t = inputs(n, dim)
    with FlopCounterMode(display=False) as counter:
        loss_fn(kind)(img, txt, t).backward()
    return counter.get_total_flops() / (n * n * dim)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16_384)
    parser.add_argument("--big-n", type=int, default=65_536)
    parser.add_argument("--dim", type=int, default=640)
    parser.add_argument("--check-n", type=int, default=4_096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", choices=["naive", "chunked"])
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    torch.set_num_threads(args.threads)
    runs = {}
    for name, kind, n in (("naive", "naive", args.n), ("chunked", "chunked", args.n), ("chunked_big", "chunked", args.big_n)):
        runs[name] = run_child(kind, n, args, args.repeats if n == args.n else 1)
        print(f"{name} N={n:,}: {runs[name]['seconds']:.2f} s, extra peak {runs[name]['extra_mib']:.0f} MiB", flush=True)
    error = gradient_error(args.check_n, args.dim)
    flops = {kind: flops_per_n2d(kind, 1_024, args.dim) for kind in ("naive", "chunked")}
    memory_ratio = runs["chunked"]["extra_mib"] / runs["naive"]["extra_mib"]
    time_ratio = runs["chunked"]["seconds"] / runs["naive"]["seconds"]
    rows = [
        f"### P1, P2 contrastive loss (forward + backward, label smoothing 0.1, d={args.dim}, fp32, {args.threads} threads)", "",
        f"| loss | N | seconds (median of {args.repeats}) | extra peak memory | FLOPs / (N^2 d) |", "|---|---|---|---|---|",
        f"| naive (materialized [N, N] logits, log_softmax both ways) | {args.n:,} | {runs['naive']['seconds']:.2f} | "
        f"{runs['naive']['extra_mib']:,.0f} MiB | {flops['naive']:.1f} |",
        f"| openalign chunked (streaming log-sum-exp, recomputed blocks of {32} MiB) | {args.n:,} | "
        f"{runs['chunked']['seconds']:.2f} | {runs['chunked']['extra_mib']:,.0f} MiB | {flops['chunked']:.1f} |",
        f"| openalign chunked (one run) | {args.big_n:,} | {runs['chunked_big']['seconds']:.2f} | "
        f"{runs['chunked_big']['extra_mib']:,.0f} MiB | |", "",
        f"- extra peak, chunked / naive at N={args.n:,}: **{memory_ratio:.3f}x** (target <= 0.10x); "
        f"N={args.big_n:,}: **{runs['chunked_big']['extra_mib'] / 1024:.2f} GiB** (target <= 1.5 GiB)",
        f"- time, chunked / naive: **{time_ratio:.2f}x** (target <= 0.6x); FLOPs {flops['chunked']:.1f}·N²·d "
        "(target <= 8; counted by torch.utils.flop_counter at N=1,024)",
        f"- gradients vs an fp64 naive reference at N={args.check_n:,}: largest relative difference "
        f"**{error:.1e}** (target <= 1e-5)",
        f"- command: `.venv/bin/python bench/loss_memory.py --n {args.n} --big-n {args.big_n} --dim {args.dim}`", "",
    ]
    print("\n".join(rows))
    write_section("P1", "\n".join(rows))
    print(verdict("P1", "loss_memory_ratio", memory_ratio, 0.10, at_least=False))
    print(verdict("P1", "loss_big_extra_gib", runs["chunked_big"]["extra_mib"] / 1024, 1.5, at_least=False))
    print(verdict("P2", "loss_time_ratio", time_ratio, 0.6, at_least=False))
    print(verdict("P2", "loss_flops_per_n2d", flops["chunked"], 8, at_least=False))
    print(verdict("P2", "loss_grad_rel_error", error, 1e-5, at_least=False, fmt=".1e"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
