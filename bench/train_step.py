"""P3, P4: the training step in one process and in two gloo processes.

P4: openalign's step (train/step.py) vs a plain transformers AlignModel(return_loss=True) + AdamW step:
same towers, same batch, same threads; medians over repeats. openalign's step runs in this process as
the trainer runs it (host.reuse_freed_memory: glibc keeps freed blocks); the plain step runs in a fresh
process with the C library's defaults, as a plain script would (each waits while the other runs). Also
the share of step time spent waiting for the real data loader.

P3: two gloo processes (DDP, one thread each), each with half the batch, run one step in fp64; their
loss and every parameter gradient are compared with one process on the whole batch (BatchNorm per
half, as per device), and their all_gather calls are counted. Their fp32 step time is reported too.

    .venv/bin/python bench/train_step.py [--preset demo] [--batch 128] [--steps 15] [--repeats 3]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers
from torch.utils import flop_counter

from _common import free_port, verdict, write_section
from openalign import host, presets
from openalign.distributed import Dist
from openalign.data import tars
from openalign.data import transforms
from openalign.corpora import resolve_data
from openalign.data.loader import Position, StreamSpec, epoch_plan, train_loader
from openalign.model.dual_encoder import DualEncoder, Encoding, hf_config
from openalign.tokenizer import train_tokenizer
from openalign.train.optim import build_optimizer, set_lr
from openalign.train.step import batch_loss, forward_backward

WORLD = 2


def openalign_step(model, optimizer, cfg, batch, runner=None, layout=None):
    optimizer.zero_grad(set_to_none=True)
    forward_backward(runner or model, model, batch, cfg.loss, cfg.train.micro_batch, layout or Dist(),
                     torch.device("cpu"), nullcontext)
    optimizer.step()


def plain_step(model, optimizer, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                pixel_values=batch["pixel_values"], return_loss=True)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    optimizer.step()


def plain_worker(conn, cfg, state: dict, batch: dict, steps: int, threads: int) -> None:
    """The plain step timed on request, in its own process (the C library's default allocator)."""
    torch.set_num_threads(threads)
    plain = transformers.AlignModel(hf_config(cfg.model)).train()
    plain.load_state_dict(state, strict=False)  # same weights as openalign's (plain keeps its pooler)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    while conn.recv() == "go":
        conn.send(time_steps(lambda b: plain_step(plain, plain_opt, b), batch, steps))


def time_steps(step, batch, n: int) -> float:
    step(batch)  # warm-up (allocator, first-call overheads)
    start = time.perf_counter()
    for _ in range(n):
        step(batch)
    return (time.perf_counter() - start) / n


def _grouped_conv_backward_flops(*args, **kwargs) -> int:
    """torch.utils.flop_counter's convolution backward ignores `groups` (torch 2.13): a depthwise layer's
    backward counts C times its FLOPs. Its formula divided by the groups is exact (both gradients are
    per-group convolutions)."""
    return flop_counter.conv_backward_flop(*args, **kwargs) // args[9]


_grouped_conv_backward_flops._get_raw = True  # called with the op's own arguments (torch's formula takes them)


def gemm_peak(threads: int, size: int = 2048, repeats: int = 10) -> float:
    """The machine's fp32 GEMM rate (FLOP/s): the best of `repeats` square [size x size] products."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def step_flops(cfg, batch) -> int:
    """The step's FLOPs (forward + backward) as the model defines them, counted on a model whose depthwise
    convolutions run the library's own backward (model/depthwise.py computes the same gradient another way)."""
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).train()
    for module in model.modules():
        vars(module).pop("forward", None)
    counter = flop_counter.FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: _grouped_conv_backward_flops})
    with counter:
        forward_backward(model, model, batch, cfg.loss, cfg.train.micro_batch, Dist(), torch.device("cpu"),
                         nullcontext)
    return counter.get_total_flops()


def top_operators(step, batch, n: int = 8) -> list[tuple[str, float, float]]:
    """(operator, ms per step, share of the step's operator time) by self time over two profiled steps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step(batch)
    events = [e for e in prof.key_averages() if not e.key.startswith(("autograd::", "Optimizer."))]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [(e.key, e.self_cpu_time_total / 2e3, e.self_cpu_time_total / total) for e in events[:n]]


def synthetic_batch(cfg, batch_size: int, length: int = 24) -> dict:
    """Random uint8 images at the preset's size and random token ids (a paper preset has no built-in corpus)."""
    g = torch.Generator().manual_seed(0)
    size = cfg.model.vision.image_size
    return {"pixel_values": torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=g),
            "input_ids": torch.randint(5, cfg.model.text.vocab_size, (batch_size, length), generator=g),
            "attention_mask": torch.ones(batch_size, length, dtype=torch.long)}


def efficiency(cfg, batch, steps: int, peak: float) -> dict:
    """Seconds per step, FLOPs per step, achieved FLOP/s as a fraction of the GEMM peak, and the top ops."""
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).train()
    optimizer = build_optimizer(model, cfg.optim)
    set_lr(optimizer, 1e-4)
    step = lambda b: openalign_step(model, optimizer, cfg, b)  # noqa: E731
    seconds = time_steps(step, batch, steps)
    flops = step_flops(cfg, batch)
    return {"seconds": seconds, "flops": flops, "fraction": flops / seconds / peak,
            "top": top_operators(step, batch)}


def data_wait_fraction(cfg, model, optimizer, tokenizer, shards, n: int) -> float:
    """Share of wall time the training loop waits on the real loader (decode, augment, tokenize)."""
    spec = StreamSpec.for_config(cfg, shards)
    counts = {s: tars.count_samples(s) for s in shards}
    wait, total, steps = 0.0, 0.0, 0
    start = time.perf_counter()
    for batch in train_loader(spec, tokenizer, epoch_plan(spec, counts, Position(), n)):
        got = time.perf_counter()
        openalign_step(model, optimizer, cfg, batch)
        done = time.perf_counter()
        if steps >= 3:  # skip worker start-up
            wait += got - start
            total += done - start
        steps += 1
        start = time.perf_counter()
        if steps >= n:
            break
    return wait / total


def prepare(preset: str, batch_size: int):
    torch.manual_seed(0)
    cfg = presets.get(preset)
    train_shards, _ = resolve_data(cfg.data)
    tokenizer = train_tokenizer(tars.all_texts(train_shards), cfg.model.text.vocab_size)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, text=dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))))
    spec = StreamSpec.for_config(cfg, train_shards, rank_batch=batch_size, workers=0)
    batch = next(iter(train_loader(spec, tokenizer, (1,))))
    batch["pixel_values"] = transforms.to_unit_range(batch["pixel_values"])  # both steps get float pixels
    return cfg, tokenizer, train_shards, batch


def gloo_worker(rank: int, port: int, out: str, cfg, batch: dict, steps: int) -> None:
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_fn

    from openalign import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    local = {k: v.chunk(WORLD)[rank] if torch.is_tensor(v) else v for k, v in batch.items()}
    layout = distributed.from_env()
    gathers = []
    real = dist_fn.all_gather
    dist_fn.all_gather = lambda x, *a, **k: gathers.append(tuple(x.shape)) or real(x, *a, **k)
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).double().train()
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    double = {k: v.double() if torch.is_floating_point(v) else v for k, v in local.items() if torch.is_tensor(v)}
    loss = forward_backward(ddp, model, double, cfg.loss, 0, layout, torch.device("cpu"), nullcontext)
    result = {"loss": distributed.mean_over_ranks(loss.item(), layout), "gathers": len(gathers),
              "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None}}
    torch.manual_seed(0)  # fp32 timing
    model = DualEncoder(cfg.model, cfg.loss).train()
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = build_optimizer(model, cfg.optim)
    set_lr(optimizer, 1e-4)
    result["seconds"] = time_steps(lambda b: openalign_step(model, optimizer, cfg, b, ddp, layout), local, steps)
    if rank == 0:
        torch.save(result, Path(out) / "gloo.pt")
    dist.destroy_process_group()


def gloo_check(args, cfg, batch) -> dict:
    """P3: two gloo processes against one process on the whole batch, in fp64."""
    import torch.multiprocessing as mp

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        # the parent's config and batch: a tokenizer trained again in each worker could number tokens differently
        mp.start_processes(gloo_worker, args=(port, tmp, cfg, batch, args.steps), nprocs=WORLD,
                           start_method="spawn")
        ranks = torch.load(Path(tmp) / "gloo.pt")
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).double().train()
    img, txt = [], []
    for part in range(WORLD):  # BatchNorm per device batch
        chunk = {k: v.chunk(WORLD)[part] for k, v in batch.items() if torch.is_tensor(v)}
        i, t = model(chunk["pixel_values"].double(), chunk["input_ids"], chunk["attention_mask"])
        img.append(i.embeds)
        txt.append(t.embeds)
    loss = batch_loss(model, Encoding(torch.cat(img), None), Encoding(torch.cat(txt), None),
                      dataclasses.replace(cfg.loss, implementation="naive"))
    loss.backward()
    # relative to the largest gradient entry of the model: some gradients are zero up to rounding (a
    # BatchNorm bias followed by another BatchNorm), where a per-tensor ratio would only compare noise
    scale = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    worst = max(float((ranks["grads"][n] - p.grad).abs().max()) for n, p in model.named_parameters()
                if p.grad is not None) / scale
    return {"loss_error": abs(ranks["loss"] - loss.item()) / abs(loss.item()), "grad_error": worst,
            "gathers": ranks["gathers"], "seconds": ranks["seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paper-preset", default="align-b1-mini")
    parser.add_argument("--paper-batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    cfg, tokenizer, train_shards, batch = prepare(args.preset, args.batch)

    ours = DualEncoder(cfg.model, cfg.loss).train()
    ours_opt = build_optimizer(ours, cfg.optim)
    set_lr(ours_opt, 1e-4)
    ours_t, plain_t = [], []
    context = mp.get_context("spawn")  # a fresh process: glibc's default malloc settings
    here, there = context.Pipe()
    child = context.Process(target=plain_worker, args=(there, cfg, ours.align.state_dict(), batch, args.steps,
                                                       torch.get_num_threads()))
    child.start()
    host.reuse_freed_memory()  # what the trainer does (train/trainer.py)
    for _ in range(args.repeats):  # alternating: noise hits both alike
        here.send("go")
        plain_t.append(here.recv())
        ours_t.append(time_steps(lambda b: openalign_step(ours, ours_opt, cfg, b), batch, args.steps))
    here.send("stop")
    child.join()
    ours_s, plain_s = statistics.median(ours_t), statistics.median(plain_t)
    ratio = plain_s / ours_s  # pairs/s ratio = inverse time ratio
    batched = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, global_batch=args.batch))
    data_frac = data_wait_fraction(batched, ours, ours_opt, tokenizer, train_shards, 3 + 4 * args.steps)
    gloo = gloo_check(args, cfg, batch)
    peak = gemm_peak(torch.get_num_threads())
    paper_cfg = presets.get(args.paper_preset)
    runs = {f"{args.preset}, batch {args.batch}": efficiency(cfg, batch, args.steps, peak),
            f"{args.paper_preset}, batch {args.paper_batch}":
                efficiency(paper_cfg, synthetic_batch(paper_cfg, args.paper_batch), 3, peak)}
    profile_rows = ["", f"Where the step's time goes (fp32 GEMM peak measured here: {peak / 1e9:.0f} GFLOP/s, "
                    "the best [2,048 x 2,048] product; FLOPs by torch.utils.flop_counter, grouped convolutions' "
                    "backward counted per group; top operators by self time, torch.profiler):", "",
                    "| model | s/step | GFLOP/step | GFLOP/s | of the GEMM peak | top operators (ms/step, share) |",
                    "|---|---|---|---|---|---|"]
    for name, run in runs.items():
        top = "; ".join(f"{op.removeprefix('aten::')} {ms:.0f} ({share:.0%})" for op, ms, share in run["top"][:6])
        profile_rows.append(f"| {name} | {run['seconds']:.3f} | {run['flops'] / 1e9:.1f} | "
                            f"{run['flops'] / run['seconds'] / 1e9:.1f} | {run['fraction']:.0%} | {top} |")

    rows = [
        f"### P3, P4 training step ({args.preset} preset, batch {args.batch}, {torch.get_num_threads()} threads)", "",
        f"| step | s/step (median of {args.repeats}) | pairs/s |", "|---|---|---|",
        f"| openalign (channels_last, no text pooler, length-bucketed text, LAMB, paper loss) | {ours_s:.3f} "
        f"| {args.batch / ours_s:.0f} |",
        f"| transformers AlignModel(return_loss=True) + AdamW | {plain_s:.3f} | {args.batch / plain_s:.0f} |",
        f"| openalign, 2 gloo processes x 1 thread, {args.batch // WORLD} pairs each (DDP) | {gloo['seconds']:.3f} | "
        f"{args.batch / gloo['seconds']:.0f} |", "",
        f"- pairs/s ratio openalign / plain: **{ratio:.2f}x** (target >= 2.0)",
        f"- time waiting for the real loader (1 worker, emoji shards): **{data_frac:.1%}** of the step (target <= 5%)",
        f"- P3, 2 gloo processes vs 1 process on the whole batch (fp64, BatchNorm per half): loss relative "
        f"difference **{gloo['loss_error']:.1e}**, largest gradient difference / largest gradient "
        f"**{gloo['grad_error']:.1e}** "
        f"(target <= 1e-6); all_gather calls per rank per step: **{gloo['gathers']}** (target: one per modality)",
        *profile_rows, "",
        f"- command: `.venv/bin/python bench/train_step.py --preset {args.preset} --batch {args.batch}`", "",
    ]
    write_section("P4", "\n".join(rows))
    print("\n".join(rows))
    print(verdict("P4", "train_step_ratio", ratio, 2.0, at_least=True))
    for name, run in runs.items():  # no target: the fraction says how far the step is from the machine's limit
        print(f"P4 step_gflops_fraction={run['fraction']:.3f} ({name})")
    print(verdict("P4", "data_loading_frac", data_frac, 0.05, at_least=False, fmt=".3f"))
    print(verdict("P3", "gloo_grad_rel_error", gloo["grad_error"], 1e-6, at_least=False, fmt=".1e"))
    print(verdict("P3", "gloo_loss_rel_error", gloo["loss_error"], 1e-6, at_least=False, fmt=".1e"))
    print(f"P3 all_gathers_per_step={gloo['gathers']} target=2 {'PASS' if gloo['gathers'] == 2 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
