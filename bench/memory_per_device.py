"""Expected training memory per device for the paper's presets, measured on this CPU.

For each preset, fresh child processes run one forward + backward of the towers at the paper's image
size (289 px) and 64 text tokens with 1 and with 2 pairs, in fp32; the difference of their extra peak
memory (VmHWM minus resident memory before) is the activation memory per pair. The static memory is
counted: fp32 weights, gradients and LAMB's two moments, 16 bytes per parameter. The totals are an
estimate for a GPU: the same tensors are saved, bf16 autocast roughly halves the activations, and
CUDA adds its context and workspaces (about 1 GiB).

    .venv/bin/python bench/memory_per_device.py [--presets align-b7-base align-l2-large]

Writes its table into docs/scale.md (between its MEMORY markers) and prints it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
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


def measure(preset: str, pairs: int) -> dict:
    cmd = [sys.executable, str(HERE), "--child", preset, "--pairs", str(pairs)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["align-b7-base", "align-l2-large"])
    parser.add_argument("--child")
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pairs)
        return 0
    rows = ["| preset | parameters | static (weights, grads, LAMB) | activations per pair, fp32 | "
            + " | ".join(f"{n} pairs/device, bf16" for n in PER_DEVICE) + " |",
            "|---|---|---|---|" + "---|" * len(PER_DEVICE)]
    for preset in args.presets:
        one, two = measure(preset, 1), measure(preset, 2)
        per_pair = (two["extra_mib"] - one["extra_mib"]) / 1024
        static = 16 * two["params"] / 2**30
        totals = [static + 1.0 + n * per_pair / 2 for n in PER_DEVICE]
        rows.append(f"| {preset} | {two['params'] / 1e6:,.0f} M | {static:.1f} GiB | {per_pair:.2f} GiB | "
                    + " | ".join(f"~{t:.0f} GiB" for t in totals) + " |")
        print(rows[-1], flush=True)
    body = "\n".join([
        "Measured on this CPU with `.venv/bin/python bench/memory_per_device.py` (289 px images, 64 tokens,",
        "one forward + backward per child process); totals assume bf16 autocast halves the activations",
        "and add ~1 GiB for the CUDA context. Beyond what fits, use `train.micro_batch` (memory of one",
        "micro-batch) or more devices.", "",
        *rows, ""])
    text = (ROOT / "docs" / "scale.md").read_text()
    if "MEMORY_TABLE" in text:
        text = text.replace("MEMORY_TABLE", "<!-- MEMORY begin -->\n<!-- MEMORY end -->")
        (ROOT / "docs" / "scale.md").write_text(text)
    write_section("MEMORY", body, ROOT / "docs" / "scale.md")
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
