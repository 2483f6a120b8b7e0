"""P10: building a zero-shot classifier, 1000 classes x 80 templates (CLIP's ImageNet prompts).

openalign: all prompts tokenized in one call, encoded in length order (each batch padded only to its own
longest prompt, length-bucketed inside the text tower), normalized, averaged per class, renormalized.
Naive: the per-class loop one writes from transformers' documentation: for each class, tokenize its 80
prompts as AlignProcessor does (padding to max_length 64), `AlignModel.get_text_features`, normalize,
average, renormalize. Same weights (the demo preset's text tower), same threads.

    .venv/bin/python bench/zeroshot_build.py [--classes 1000] [--repeats 1]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from _common import verdict, write_section
from openalign import presets
from openalign.eval import metrics as M
from openalign.eval.datasets import load_templates
from openalign.model.dual_encoder import DualEncoder
from openalign.model.encode import encode_texts
from openalign.tokenizer import train_tokenizer


def class_names(n: int, seed: int = 0) -> list[str]:
    """Made-up one- to three-word class names (ImageNet's are 1-4 words)."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ter", "von", "sa", "pri", "dul", "en", "gor", "ba", "sel", "tu", "rin"]
    word = lambda: "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))  # noqa: E731
    return [" ".join(word() for _ in range(rng.choice([1, 1, 2, 3]))) for _ in range(n)]


def naive(model: DualEncoder, tokenizer, classes: list[str], templates: tuple[str, ...]) -> torch.Tensor:
    weights = []
    with torch.no_grad():
        for name in classes:
            tokens = tokenizer([t.format(name) for t in templates], padding="max_length", max_length=64,
                               truncation=True, return_tensors="pt")
            emb = model.align.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
            emb = getattr(emb, "pooler_output", emb)  # transformers 5 returns an output object
            mean = torch.nn.functional.normalize(emb, dim=-1).mean(dim=0)
            weights.append(torch.nn.functional.normalize(mean, dim=-1))
    return torch.stack(weights)


def ours(model: DualEncoder, tokenizer, classes: list[str], templates: tuple[str, ...]) -> torch.Tensor:
    prompts = [t.format(c) for c in classes for t in templates]
    return M.class_weights(encode_texts(model, tokenizer, prompts, batch_size=256), len(classes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)  # the naive loop takes ~5 min at 1000 classes
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    templates = load_templates("imagenet80")
    classes = class_names(args.classes)
    tokenizer = train_tokenizer([t.format(c) for c in classes[:200] for t in templates], 4000, 64)
    model = DualEncoder(presets.demo().model).eval()
    naive_s, ours_s = [], []
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
        start = time.perf_counter()
        w_naive = naive(model, tokenizer, classes, templates)
        naive_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        w_ours = ours(model, tokenizer, classes, templates)
        ours_s.append(time.perf_counter() - start)
    diff = float((w_naive - w_ours).abs().max())
    ratio = statistics.median(naive_s) / statistics.median(ours_s)
    n_prompts = len(classes) * len(templates)
    rows = [
        f"### P10 zero-shot classifier build ({len(classes):,} classes x {len(templates)} templates = "
        f"{n_prompts:,} prompts, demo text tower, {args.threads} threads)", "",
        f"| builder | seconds (median of {args.repeats}) | prompts/s |", "|---|---|---|",
        f"| openalign (one tokenizer call, length-ordered batches of 256, length buckets) | "
        f"{statistics.median(ours_s):.2f} | {n_prompts / statistics.median(ours_s):,.0f} |",
        f"| naive per-class loop (AlignProcessor-style max_length padding, get_text_features) | "
        f"{statistics.median(naive_s):.2f} | {n_prompts / statistics.median(naive_s):,.0f} |", "",
        f"- speed-up: **{ratio:.1f}x** (target >= 3x); largest weight difference {diff:.1e} (target <= 1e-5)",
        f"- command: `.venv/bin/python bench/zeroshot_build.py --classes {args.classes}`", "",
    ]
    print("\n".join(rows))
    write_section("P10", "\n".join(rows))
    print(verdict("P10", "zeroshot_build_speedup", ratio, 3, at_least=True))
    print(f"P10 zeroshot_weights_max_abs_diff={diff:.1e} target<=1e-05 {'PASS' if diff <= 1e-5 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
