"""P4: openalign's training step vs a plain transformers AlignModel(return_loss=True) + AdamW step.

Same towers, same batch, same threads; medians over interleaved repeats, so machine noise hits both
sides alike. Also measures the share of step time spent waiting for the real data loader.

    .venv/bin/python bench/train_step.py [--preset demo] [--batch 128] [--steps 15] [--repeats 3]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import torch
import transformers

from _common import write_section
from openalign import presets
from openalign.data import shards as shard_lib
from openalign.data.corpora import resolve_data
from openalign.data.loader import StreamSpec, batches_per_role, train_loader
from openalign.model.dual_encoder import DualEncoder, hf_config
from openalign.tokenizer import train_tokenizer
from openalign.train.optim import build_optimizer, set_lr
from openalign.train.trainer import compute_loss



def openalign_step(model, optimizer, cfg, batch):
    img, txt = model(batch["pixel_values"], batch["input_ids"], batch["attention_mask"])
    loss = compute_loss(model, img.embeds, txt.embeds, cfg.loss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def plain_step(model, optimizer, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                pixel_values=batch["pixel_values"], return_loss=True)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    optimizer.step()


def time_steps(step, batch, n: int) -> float:
    step(batch)  # warm-up (allocator, first-call overheads)
    start = time.perf_counter()
    for _ in range(n):
        step(batch)
    return (time.perf_counter() - start) / n


def data_wait_fraction(cfg, model, optimizer, tokenizer, shards, n: int) -> float:
    """Share of wall time the training loop waits on the real loader (decode, augment, tokenize)."""
    spec = StreamSpec.for_config(cfg, shards)
    counts = {s: shard_lib.count_samples(s) for s in shards}
    wait, total, steps, epoch = 0.0, 0.0, 0, 0
    while steps < n:
        start = time.perf_counter()
        for batch in train_loader(spec, tokenizer, epoch, batches_per_role(spec, epoch, counts)):
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
        epoch += 1
    return wait / total


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    cfg = presets.get(args.preset)
    train_shards, _ = resolve_data(cfg.data)
    tokenizer = train_tokenizer(shard_lib.all_texts(train_shards), cfg.model.text.vocab_size)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, text=dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))))
    spec = StreamSpec.for_config(cfg, train_shards, batch_size=args.batch, workers=0)
    batch = next(iter(train_loader(spec, tokenizer, 0, 1)))

    ours = DualEncoder(cfg.model, cfg.loss).train()
    ours_opt = build_optimizer(ours, cfg.optim)
    set_lr(ours_opt, 1e-4)
    plain = transformers.AlignModel(hf_config(cfg.model)).train()
    plain.load_state_dict(ours.align.state_dict(), strict=False)  # same weights (plain keeps its pooler)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)

    ours_t, plain_t = [], []
    for _ in range(args.repeats):  # interleaved: noise hits both alike
        ours_t.append(time_steps(lambda b: openalign_step(ours, ours_opt, cfg, b), batch, args.steps))
        plain_t.append(time_steps(lambda b: plain_step(plain, plain_opt, b), batch, args.steps))
    ours_s, plain_s = statistics.median(ours_t), statistics.median(plain_t)
    ratio = plain_s / ours_s  # pairs/s ratio = inverse time ratio
    data_frac = data_wait_fraction(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=args.batch)),
                                   ours, ours_opt, tokenizer, train_shards, 3 + 4 * args.steps)

    rows = [
        f"### P4 training step ({args.preset} preset, batch {args.batch}, {torch.get_num_threads()} threads)", "",
        "| step | s/step (median of {}) | pairs/s |".format(args.repeats), "|---|---|---|",
        f"| openalign (channels_last, no text pooler, length-bucketed text, LAMB, paper loss) | {ours_s:.3f} | {args.batch / ours_s:.0f} |",
        f"| transformers AlignModel(return_loss=True) + AdamW | {plain_s:.3f} | {args.batch / plain_s:.0f} |", "",
        f"- pairs/s ratio openalign / plain: **{ratio:.2f}x** (target >= 1.0)",
        f"- time waiting for the real loader (1 worker, emoji shards): **{data_frac:.1%}** of the step (target <= 5%)",
        f"- command: `.venv/bin/python bench/train_step.py --preset {args.preset} --batch {args.batch}`", "",
    ]
    write_section("P4", "\n".join(rows))
    print("\n".join(rows))
    print(f"P4 train_step_ratio={ratio:.2f} target>=1.0 {'PASS' if ratio >= 1.0 else 'FAIL'}")
    print(f"P4 data_loading_frac={data_frac:.3f} target<=0.05 {'PASS' if data_frac <= 0.05 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
