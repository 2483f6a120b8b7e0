"""Expected training memory per device for the paper's presets, measured on this CPU.

For each preset, fresh child processes run one forward + backward of the towers at the paper's image
size (289 px) and 64 text tokens with 1 and with 2 pairs, in fp32; the difference of their extra peak
memory (VmHWM minus resident memory before) is the activation memory per pair. The static memory is
counted: fp32 weights, gradients and LAMB's two moments, 16 bytes per parameter. The totals are an
estimate for a GPU: the same tensors are saved, bf16 autocast roughly halves the activations, and
CUDA adds its context and workspaces (about 1 GiB).

With FSDP (`train.fsdp=true`), two gloo processes shard a preset and take one LAMB step with one
pair each; every rank counts the bytes of its own shards of weights, gradients and LAMB's moments,
and the extra peak of the step (activations plus the FSDP units made whole in flight). Two
L2 + BERT-Large processes do not fit this machine's 24 GiB: for it the same sizes are counted from a
model on the meta device (for B7 + BERT-Base the count equals the measurement to the byte).

    .venv/bin/python bench/memory_per_device.py [--presets align-b7-base align-l2-large]

Writes its table into docs/scale.md (between its MEMORY markers) and prints it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from contextlib import nullcontext
import sys
from pathlib import Path

import torch

from _common import ROOT, peak_rss_mib, resident_mib, write_section

HERE = Path(__file__).resolve()
PER_DEVICE = (16, 64, 256)  # the paper's 16 per core; 16,384 over 256 and over 64 GPUs


def child(preset: str, pairs: int) -> None:
    from openalign import presets
    from openalign.model.dual_encoder import DualEncoder

    torch.set_num_threads(2)
    cfg = presets.get(preset)
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).train()
    size = cfg.model.vision.image_size
    pixels = torch.randn(pairs, 3, size, size)
    ids = torch.randint(5, cfg.model.text.vocab_size, (pairs, cfg.model.text.max_length))
    mask = torch.ones_like(ids)
    for p in model.parameters():  # gradients allocated before the baseline: what is left is activations
        p.grad = torch.zeros_like(p)
    before = resident_mib()
    img, txt = model(pixels, ids, mask)
    ((img.embeds * txt.embeds).sum() / model.temperature).backward()
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"extra_mib": peak_rss_mib() - before, "params": params}))


def fsdp_child(rank: int, preset: str, port: int, out: str) -> None:
    import os

    import torch.distributed as dist

    from openalign import distributed, presets
    from openalign.model.dual_encoder import DualEncoder
    from openalign.train import fsdp
    from openalign.train.optim import build_optimizer, set_lr
    from openalign.train.step import forward_backward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = presets.get(preset)
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).train()
    fsdp.wrap(model)
    optimizer = build_optimizer(model, cfg.optim, fsdp=True)
    size, length = cfg.model.vision.image_size, cfg.model.text.max_length
    g = torch.Generator().manual_seed(rank)
    batch = {"pixel_values": torch.randint(0, 256, (1, 3, size, size), generator=g, dtype=torch.uint8),
             "input_ids": torch.randint(5, cfg.model.text.vocab_size, (1, length), generator=g),
             "attention_mask": torch.ones(1, length, dtype=torch.long)}

    def step() -> None:
        set_lr(optimizer, 1e-4)
        optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as between training steps
        forward_backward(model, model, batch, cfg.loss, 0, distributed.from_env(), torch.device("cpu"), nullcontext)
        optimizer.step()

    step()  # allocates the sharded gradients and LAMB's moments
    local = [fsdp.local(p) for p in model.parameters()]
    state_bytes = sum(fsdp.local(t).numel() * t.element_size() for s in optimizer.state.values()
                      for t in s.values() if t.ndim)
    static = sum(t.numel() * t.element_size() * 2 for t in local) + state_bytes  # weights + gradients
    units = [sum(p.numel() * p.element_size() for p in m.parameters()) for m in model.modules()
             if fsdp.is_wrapped(m) and m is not model]
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to what is resident now
    before = resident_mib()
    step()
    out_file = Path(out) / f"rank{rank}.json"
    out_file.write_text(json.dumps({"static_bytes": static, "extra_mib": peak_rss_mib() - before,
                                    "largest_unit_bytes": max(units),
                                    "params": sum(p.numel() for p in model.parameters())}))
    dist.destroy_process_group()


def measure_fsdp(preset: str) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    from _common import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(fsdp_child, args=(preset, free_port(), out), nprocs=2, start_method="fork")
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(2)]
    return {k: max(r[k] for r in ranks) for k in ranks[0]}


def fsdp_sizes(preset: str, world: int = 2) -> dict:
    """What `fsdp_child` measures for static memory, counted: a model on the meta device (no memory),
    16 bytes per parameter split over `world` ranks, and the largest FSDP unit's weights."""
    from openalign import presets
    from openalign.model.dual_encoder import DualEncoder

    cfg = presets.get(preset)
    with torch.device("meta"):
        model = DualEncoder(cfg.model, cfg.loss)
    units = model.tower_blocks()
    params = sum(p.numel() for p in model.parameters())
    return {"static_bytes": 16 * params / world,
            "largest_unit_bytes": max(sum(4 * p.numel() for p in u.parameters()) for u in units)}


def measure(preset: str, pairs: int) -> dict:
    cmd = [sys.executable, str(HERE), "--child", preset, "--pairs", str(pairs)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["align-b7-base", "align-l2-large"])
    parser.add_argument("--fsdp-presets", nargs="*", default=["align-b7-base"],
                        help="presets whose FSDP step is run on two processes (the others are counted)")
    parser.add_argument("--child")
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pairs)
        return 0
    rows = ["| preset | parameters | static (weights, grads, LAMB) | activations per pair, fp32 | "
            + " | ".join(f"{n} pairs/device, bf16" for n in PER_DEVICE) + " |",
            "|---|---|---|---|" + "---|" * len(PER_DEVICE)]
    sharded = ["| preset | static per device, FSDP over 2 (measured) | largest unit, whole "
               "| extra peak of a 1-pair step, fp32 | static per device over 64 | 16 pairs/device over 64, bf16 |",
               "|---|---|---|---|---|---|"]
    for preset in args.presets:
        one, two = measure(preset, 1), measure(preset, 2)
        per_pair = (two["extra_mib"] - one["extra_mib"]) / 1024
        static = 16 * two["params"] / 2**30
        totals = [static + 1.0 + n * per_pair / 2 for n in PER_DEVICE]
        rows.append(f"| {preset} | {two['params'] / 1e6:,.0f} M | {static:.1f} GiB | {per_pair:.2f} GiB | "
                    + " | ".join(f"~{t:.0f} GiB" for t in totals) + " |")
        print(rows[-1], flush=True)
        if preset in args.fsdp_presets:
            f = measure_fsdp(preset)
            static_2, extra = f"{f['static_bytes'] / 2**30:.2f} GiB", f"{f['extra_mib'] / 1024:.2f} GiB"
        else:  # two such processes do not fit this machine: the shards' sizes, from a model on the meta device
            f = fsdp_sizes(preset)
            static_2, extra = f"{f['static_bytes'] / 2**30:.2f} GiB (counted)", "not measured"
        unit = f["largest_unit_bytes"] / 2**30
        over64 = f["static_bytes"] * 2 / 64 / 2**30
        # in flight: a unit's whole weights, the next one prefetched, and a whole gradient in backward
        total16 = over64 + 3 * unit + 1.0 + 16 * per_pair / 2
        sharded.append(f"| {preset} | {static_2} | {unit * 1024:.0f} MiB | {extra} | {over64:.2f} GiB | "
                       f"~{total16:.0f} GiB |")
        print(sharded[-1], flush=True)
    body = "\n".join([
        "Measured on this CPU with `.venv/bin/python bench/memory_per_device.py` (289 px images, 64 tokens,",
        "one forward + backward per child process); totals assume bf16 autocast halves the activations",
        "and add ~1 GiB for the CUDA context. Beyond what fits, use `train.micro_batch` (memory of one",
        "micro-batch) or more devices.", "",
        *rows, "",
        "With `train.fsdp=true` (two gloo processes here, one LAMB step each, static counted from each rank's",
        "own shards): the static part divides by the number of devices; in flight are the whole weights of",
        "the running FSDP unit (one EfficientNet block or BERT layer), the prefetched next one, and a whole",
        "gradient in backward. The last column adds those, ~1 GiB of CUDA context and the bf16 activations.",
        "Two L2 + BERT-Large processes do not fit this machine's 24 GiB, so its shards are counted from a model",
        "on the meta device (for B7 + BERT-Base the count equals the measurement to the byte).", "",
        *sharded, ""])
    text = (ROOT / "docs" / "scale.md").read_text()
    if "MEMORY_TABLE" in text:
        text = text.replace("MEMORY_TABLE", "<!-- MEMORY begin -->\n<!-- MEMORY end -->")
        (ROOT / "docs" / "scale.md").write_text(text)
    write_section("MEMORY", body, ROOT / "docs" / "scale.md")
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
