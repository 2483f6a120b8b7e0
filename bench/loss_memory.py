"""P1, P2: the exact chunked contrastive loss against the naive full-matrix loss; P13: the sigmoid loss, chunked
and over ranks, against its naive form and OpenCLIP's.

Each case runs forward + backward of the symmetric label-smoothed loss (smoothing 0.1) in a fresh
child process; its extra peak memory is VmHWM after minus resident memory before (inputs already
allocated). Cases: naive and chunked at N=16,384, chunked at N=65,536 (d=640, fp32, all threads).
Gradients of the chunked loss are compared with an fp64 naive reference at --check-n; FLOPs are
counted by torch.utils.flop_counter at a small N and reported per N^2*d.

    .venv/bin/python bench/loss_memory.py [--n 16384] [--big-n 65536] [--dim 640] [--repeats 2] [--only p1|p13]

P13 (SigLIP's sigmoid loss): naive ([N, N] logits kept for the backward) against openalign's chunked form at
N=16,384 on one process; per-rank extra peak memory and time at 2,048 pairs per rank on 2, 4 and 8 gloo
processes (spawned, one thread each), for the gathered and the ring exchange; and OpenCLIP 3.3.0's own
`SigLipLoss` and `ClipLoss` in the same run (open_clip_torch installed with --no-deps into bench/.openclip, its
loss.py loaded alone: it imports only torch).

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


# ---------------------------------------------------------------------------------------------- P13

OPENCLIP = HERE.parent / ".openclip"
OPENCLIP_VERSION = "3.3.0"


def openclip_loss_module():
    """OpenCLIP's loss.py, loaded alone (the package needs torchvision); installed once without dependencies."""
    import importlib.util

    path = OPENCLIP / "open_clip" / "loss.py"
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(OPENCLIP),
                        f"open_clip_torch=={OPENCLIP_VERSION}"], check=True)
    spec = importlib.util.spec_from_file_location("openclip_loss", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sigmoid_fn(kind: str, rank: int = 0, world: int = 1):
    """(img, txt, t, bias) -> this process's loss."""
    from openalign import loss as L
    from openalign.loss import sigmoid, softmax

    if kind == "sigmoid_naive":
        return lambda img, txt, t, b: L.sigmoid_loss(img, txt, t, b, "naive")
    if kind == "sigmoid_chunked":
        return lambda img, txt, t, b: L.sigmoid_loss(img, txt, t, b, "chunked")
    if kind == "gather":
        return lambda img, txt, t, b: sigmoid.gathered_sigmoid_loss(img, txt, t, b, "chunked")
    if kind == "ring":
        return lambda img, txt, t, b: sigmoid.ring_sigmoid_loss(img, txt, t, b, "chunked")
    if kind == "softmax":  # the paper's loss, gathered both ways, chunked: for the by-world-size table
        return lambda img, txt, t, b: softmax.gathered_softmax_loss(img, txt, t, 0.1, "chunked")
    module = openclip_loss_module()
    if kind == "openclip_siglip":  # its default exchange under torchrun (bidirectional neighbour exchange)
        loss = module.SigLipLoss(rank=rank, world_size=world)
        return lambda img, txt, t, b: loss(img, txt, 1 / t, b)
    loss = module.ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world)  # openclip_clip
    return lambda img, txt, t, b: loss(img, txt, 1 / t)


def sigmoid_inputs(n: int, dim: int, seed: int = 0):
    img, txt, t = inputs(n, dim, seed=seed)
    return img, txt, t, torch.tensor(-10.0, requires_grad=True)


def tensor_peak_mib(fn, args) -> float:
    """The largest extra memory held by tensors during one forward + backward (MiB above what they held before):
    torch's own record of every allocation and free (the profiler's memory timeline), so, unlike the resident
    memory, it does not move with how malloc's arenas happen to grow or what gloo's threads hold."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    for x in args:
        x.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn(*args).backward()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    held = [sum(row) for row in sizes]
    return (max(held) - held[0]) / 2**20


def measure(fn, args, repeats: int) -> dict:
    """Forward + backward `repeats` times after a small warm-up: median seconds and extra peak memory (MiB), from
    the resident memory and from torch's tensor allocations (`tensor_peak_mib`, one more run)."""
    img, txt, t, b = args
    small = sigmoid_inputs(64, img.shape[1])
    fn(*small).backward()
    before = resident_mib()
    times = []
    for _ in range(repeats):
        for x in (img, txt, t, b):
            x.grad = None
        start = time.perf_counter()
        fn(img, txt, t, b).backward()
        times.append(time.perf_counter() - start)
    extra = peak_rss_mib() - before
    return {"seconds": statistics.median(times), "extra_mib": extra, "tensor_mib": tensor_peak_mib(fn, args)}


def sigmoid_child(args) -> None:
    torch.set_num_threads(args.threads)
    print(json.dumps(measure(sigmoid_fn(args.child), sigmoid_inputs(args.n, args.dim), args.repeats)))


def rank_worker(rank: int, world: int, port: int, kind: str, n: int, dim: int, repeats: int, out: str) -> None:
    import torch.distributed as dist

    from openalign import host

    host.reuse_freed_memory()  # as a training process does (cli)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fn = sigmoid_fn(kind, rank, world)
    result = measure(fn, sigmoid_inputs(n, dim, seed=rank + 1), repeats)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # (gloo's teardown can abort or hang: pytorch/pytorch#75097)


def run_ranks(kind: str, world: int, n: int, dim: int, repeats: int) -> dict:
    """`world` spawned gloo processes, `n` pairs each: the largest extra peak and the slowest median time."""
    import tempfile

    import torch.multiprocessing as mp
    from _common import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(rank_worker, args=(world, free_port(), kind, n, dim, repeats, out), nprocs=world,
                           start_method="spawn")
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {key: max(r[key] for r in results) for key in ("seconds", "extra_mib", "tensor_mib")}


def p13(args) -> None:
    one = {}
    for kind in ("sigmoid_naive", "sigmoid_chunked", "openclip_siglip", "openclip_clip"):
        if kind.startswith("openclip"):
            openclip_loss_module()  # installed before the measurement, not during it
        one[kind] = run_child(kind, args.n, args, args.repeats)
        print(f"P13 one process {kind} N={args.n:,}: {one[kind]['seconds']:.2f} s, extra peak "
              f"{one[kind]['extra_mib']:.0f} MiB", flush=True)
    ranks: dict = {}
    for world in (2, 4, 8):
        for kind in ("gather", "ring", "softmax") + (("openclip_siglip", "openclip_clip") if world == 2 else ()):
            ranks[kind, world] = run_ranks(kind, world, args.per_rank, args.dim, args.repeats)
            print(f"P13 {world} ranks {kind} {args.per_rank:,} pairs each: {ranks[kind, world]['seconds']:.2f} s, "
                  f"extra peak {ranks[kind, world]['extra_mib']:.0f} MiB per rank (tensors "
                  f"{ranks[kind, world]['tensor_mib']:.1f} MiB)", flush=True)
    memory_ratio = one["sigmoid_chunked"]["extra_mib"] / one["sigmoid_naive"]["extra_mib"]
    time_ratio = one["sigmoid_chunked"]["seconds"] / one["sigmoid_naive"]["seconds"]
    default = min(("gather", "ring"), key=lambda k: sum(ranks[k, w]["seconds"] for w in (2, 4)))
    per_world = [ranks[default, w]["extra_mib"] for w in (2, 4, 8)]
    spread = (max(per_world) - min(per_world)) / min(per_world)
    tensors = [ranks[default, w]["tensor_mib"] for w in (2, 4, 8)]
    tensor_spread = (max(tensors) - min(tensors)) / min(tensors)
    rows = [
        f"### P13 sigmoid loss (SigLIP; forward + backward, d={args.dim}, fp32)", "",
        f"One process, N={args.n:,}, {args.threads} threads (median of {args.repeats}):", "",
        "| loss | seconds | extra peak memory (resident) | extra peak memory (tensors) |", "|---|---|---|---|",
        *(f"| {label} | {one[k]['seconds']:.2f} | {one[k]['extra_mib']:,.0f} MiB | {one[k]['tensor_mib']:,.0f} MiB |"
          for k, label in (
            ("sigmoid_naive", "naive sigmoid ([N, N] logits kept for the backward)"),
            ("sigmoid_chunked", "openalign chunked sigmoid (blocks recomputed in the backward)"),
            ("openclip_siglip", f"OpenCLIP {OPENCLIP_VERSION} `SigLipLoss`"),
            ("openclip_clip", f"OpenCLIP {OPENCLIP_VERSION} `ClipLoss` (softmax, for scale)"))), "",
        f"Over gloo processes on this machine ({args.per_rank:,} pairs per rank, 1 thread each; the slowest rank's "
        "median time and the largest rank's extra peak):", "",
        "| ranks | exchange | seconds | extra peak per rank (resident) | extra peak per rank (tensors) |",
        "|---|---|---|---|---|",
        *(f"| {w} | {label} | {ranks[k, w]['seconds']:.2f} | {ranks[k, w]['extra_mib']:,.0f} MiB | "
          f"{ranks[k, w]['tensor_mib']:,.1f} MiB |"
          for w in (2, 4, 8) for k, label in (("gather", "openalign, all_gather (`loss.exchange=gather`)"),
                                              ("ring", "openalign, ring (`loss.exchange=ring`)"),
                                              ("softmax", "openalign softmax (the paper's), gathered, chunked"),
                                              ("openclip_siglip", "OpenCLIP `SigLipLoss` (bidirectional exchange)"),
                                              ("openclip_clip", "OpenCLIP `ClipLoss` (local_loss, gather_with_grad)"))
          if (k, w) in ranks), "",
        f"- extra peak, chunked / naive at N={args.n:,}: **{memory_ratio:.3f}x** (target <= 0.05x); time "
        f"**{time_ratio:.2f}x** (target <= 1.0x)",
        f"- faster exchange over 2 and 4 ranks here: **{default}** (gloo on 2 cores measures contention, not NCCL: "
        "provisional); its extra peak per rank at 2/4/8 ranks, held by tensors (torch's allocation record): "
        + " / ".join(f"{m:,.1f}" for m in tensors) + f" MiB, spread **{tensor_spread:.1%}** (target <= 10%); "
        "resident (VmHWM over VmRSS, which also moves with malloc's arenas and gloo's threads): "
        + " / ".join(f"{m:,.0f}" for m in per_world) + f" MiB, spread {spread:.1%}",
        f"- command: `.venv/bin/python bench/loss_memory.py --only p13 --n {args.n} --per-rank {args.per_rank} "
        f"--dim {args.dim}`", "",
    ]
    print("\n".join(rows))
    write_section("P13", "\n".join(rows))
    print(verdict("P13", "sigmoid_memory_ratio", memory_ratio, 0.05, at_least=False, fmt=".3f"))
    print(verdict("P13", "sigmoid_time_ratio", time_ratio, 1.0, at_least=False))
    print(verdict("P13", "rank_memory_spread", tensor_spread, 0.10, at_least=False, fmt=".3f"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16_384)
    parser.add_argument("--big-n", type=int, default=65_536)
    parser.add_argument("--dim", type=int, default=640)
    parser.add_argument("--check-n", type=int, default=4_096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--per-rank", type=int, default=2_048)
    parser.add_argument("--only", choices=["p1", "p13"])
    parser.add_argument("--child", choices=["naive", "chunked", "sigmoid_naive", "sigmoid_chunked", "openclip_siglip",
                                            "openclip_clip"])
    args = parser.parse_args()
    if args.child in ("naive", "chunked"):
        child(args)
        return 0
    if args.child:
        sigmoid_child(args)
        return 0
    torch.set_num_threads(args.threads)
    if args.only == "p13":
        p13(args)
        return 0
    runs = {}
    for name, kind, n in (("naive", "naive", args.n), ("chunked", "chunked", args.n),
                          ("chunked_big", "chunked", args.big_n)):
        runs[name] = run_child(kind, n, args, args.repeats if n == args.n else 1)
        print(f"{name} N={n:,}: {runs[name]['seconds']:.2f} s, extra peak {runs[name]['extra_mib']:.0f} MiB",
              flush=True)
    error = gradient_error(args.check_n, args.dim)
    flops = {kind: flops_per_n2d(kind, 1_024, args.dim) for kind in ("naive", "chunked")}
    memory_ratio = runs["chunked"]["extra_mib"] / runs["naive"]["extra_mib"]
    time_ratio = runs["chunked"]["seconds"] / runs["naive"]["seconds"]
    rows = [
        f"### P1, P2 contrastive loss (forward + backward, label smoothing 0.1, d={args.dim}, fp32, "
        f"{args.threads} threads)", "",
        f"| loss | N | seconds (median of {args.repeats}) | extra peak memory | FLOPs / (N^2 d) |",
        "|---|---|---|---|---|",
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
    if args.only is None:
        p13(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
