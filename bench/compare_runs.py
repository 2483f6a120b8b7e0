"""Side-by-side plot of `openalign eval` metrics JSONs (docs/results.md: EfficientNet against ViT, and the
dual encoder against its late-interaction re-rank).

    python bench/compare_runs.py --out docs/results_vit.png --metrics mean_recall i2t_r10 t2i_r10 \
        "EfficientNet, 100 steps=eff-eval.json" "ViT, 100 steps=vit-eval.json" ...
    python bench/compare_runs.py --out docs/results_rerank.png --rerank "ViT + FILIP loss=vitfilip-eval.json"

Each run is `LABEL=PATH` (several paths joined by `+` are seeds: mean and std). With --rerank, each metric
is drawn before and after the re-rank (`*_rerank`), and a second panel gives the scoring time per query.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(spec: str) -> tuple[str, list[dict]]:
    label, _, paths = spec.rpartition("=")
    return label, [json.loads(Path(p).read_text()) for p in paths.split("+")]


def mean_std(runs: list[dict], key: str) -> tuple[float, float]:
    values = [r[key] for r in runs]
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=PATH[+PATH]")
    p.add_argument("--out", required=True)
    p.add_argument("--metrics", nargs="+", default=["i2t_r1", "t2i_r1", "mean_recall"])
    p.add_argument("--rerank", action="store_true", help="each metric before and after the re-rank, and the time")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    runs = [load(s) for s in args.runs]
    panels = 2 if args.rerank else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    series = [(label, key) for label, _ in runs for key in ([None, "rerank"] if args.rerank else [None])]
    width = 0.8 / len(series)
    for i, (label, suffix) in enumerate(series):
        data = dict(runs)[label]
        stats = [mean_std(data, f"{m}_{suffix}" if suffix else m) for m in args.metrics]
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(args.metrics))]
        ax.bar(xs, [s[0] for s in stats], width, yerr=[s[1] for s in stats] if len(data) > 1 else None, capsize=3,
               label=f"{label}, re-ranked" if suffix else label, alpha=0.85)
    ax.set_xticks(range(len(args.metrics)), args.metrics)
    ax.set(ylabel="held-out recall", title=args.title or "held-out retrieval")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    if args.rerank:
        ax = axes[0][1]
        labels = [label for label, _ in runs]
        pooled = [mean_std(d, "ms_per_query")[0] for _, d in runs]
        late = [mean_std(d, "rerank_ms_per_query")[0] for _, d in runs]
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], pooled, 0.4, label="dual encoder")
        ax.bar([x + 0.2 for x in xs], late, 0.4, label="+ late-interaction re-rank")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set(ylabel="ms per query (scoring only)", title="time per query", yscale="log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
