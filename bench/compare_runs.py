"""Side-by-side plot of `openalign eval` metrics JSONs (docs/results.md: EfficientNet against ViT, and the
dual encoder against its late-interaction re-rank).

    python bench/compare_runs.py --out docs/results_vit.png --metrics mean_recall i2t_r10 t2i_r10 \
        "EfficientNet, 100 steps=eff-eval.json" "ViT, 100 steps=vit-eval.json" ...
    python bench/compare_runs.py --out docs/results_rerank.png --rerank "ViT + FILIP loss=vitfilip-eval.json"

Each run is `LABEL=PATH` (several paths joined by `+` are seeds: mean and std). With --rerank, each metric
is drawn before and after the re-rank (`*_rerank`), and a second panel gives the scoring time per query.

With --curves each PATH is a training run directory instead, and each metric gets a panel of its held-out
evaluations over the steps (metrics.jsonl): every seed faint, their mean bold, and a markdown table of mean ± std
per step printed (the numbers behind the plot). --per-chance divides each metric by its chance level:

    python bench/compare_runs.py --curves --per-chance --out docs/clipart_seeds.png \
        "clipart preset=runs/clipart+runs/clipart-seed1+runs/clipart-seed2" \
        --metrics openclipart/i2t_r10 openclipart/t2i_r10 emoji/i2t_r10 emoji/t2i_r10
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def parse(spec: str) -> tuple[str, list[Path]]:
    """`LABEL=PATH[+PATH...]` -> (LABEL, [PATH, ...])."""
    label, _, paths = spec.rpartition("=")
    return label, [Path(p) for p in paths.split("+")]


def load(spec: str) -> tuple[str, list[dict]]:
    label, paths = parse(spec)
    return label, [json.loads(p.read_text()) for p in paths]


def mean_std(runs: list[dict], key: str) -> tuple[float, float]:
    values = [r[key] for r in runs]
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def eval_series(run: Path, evals: list[tuple[int, dict]], metric: str, per_chance: bool) -> dict[int, float]:
    """step -> the metric at each of a training run's evaluations `evals` (over its chance level with per_chance)."""
    from openalign.eval.metrics import chance_key

    series = {}
    for step, metrics in evals:
        if metric not in metrics:
            raise SystemExit(f"{run}: no {metric!r} in its evaluations (it has {', '.join(sorted(metrics))})")
        if per_chance and not (chance := chance_key(metric, metrics)):
            raise SystemExit(f"{run}: no chance level of {metric!r} in its evaluations: drop --per-chance")
        series[step] = metrics[metric] / metrics[chance] if per_chance else metrics[metric]
    if not series:
        raise SystemExit(f"{run}: no held-out evaluation in metrics.jsonl (train with train.eval_every > 0)")
    return series


def curves(specs: list[str], metrics: list[str], out: str, per_chance: bool, title: str) -> str:
    """One panel per metric over the steps, and the markdown table of mean ± std over each label's seeds
    at the steps all of them evaluated."""
    from openalign.train.report import read_log

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.8), squeeze=False)
    colors = itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    unit = " (x chance)" if per_chance else ""
    fmt = ".1f" if per_chance else ".3f"
    lines = []
    for spec, color in zip(specs, colors):
        label, runs = parse(spec)
        evals = [[(e["step"], e["eval"]) for e in read_log(run / "metrics.jsonl")[1]] for run in runs]  # read once
        seeds = f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
        by_metric = []  # per metric: step -> its value in every seed, at the steps every seed evaluated
        for ax, metric in zip(axes[0], metrics):
            series = [eval_series(run, found, metric, per_chance) for run, found in zip(runs, evals)]
            for one in series:
                ax.plot(list(one), list(one.values()), color=color, alpha=0.3, lw=1)
            shared = sorted(set.intersection(*(set(one) for one in series)))
            by_step = {step: [one[step] for one in series] for step in shared}
            ax.plot(shared, [statistics.fmean(v) for v in by_step.values()], color=color, lw=2, marker="o", ms=3,
                    label=f"{label} ({seeds})")
            ax.set(title=metric, xlabel="step", ylabel=metric.rpartition("/")[2] + unit)
            ax.grid(alpha=0.3)
            by_metric.append(by_step)
        lines += [f"{label}, mean ± std over {seeds}{unit}:", "",
                  "| step | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
        for step in sorted(set.intersection(*(set(by_step) for by_step in by_metric))):
            lines.append(f"| {step:,} | " + " | ".join(
                f"{statistics.fmean(b[step]):{fmt}} ± {statistics.pstdev(b[step]):{fmt}}" for b in by_metric) + " |")
        lines.append("")
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=PATH[+PATH]")
    p.add_argument("--out", required=True)
    p.add_argument("--metrics", nargs="+", default=["i2t_r1", "t2i_r1", "mean_recall"])
    p.add_argument("--rerank", action="store_true", help="each metric before and after the re-rank, and the time")
    p.add_argument("--curves", action="store_true", help="PATHs are training runs: each metric over the steps")
    p.add_argument("--per-chance", action="store_true", help="with --curves: each metric over its chance level")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    if args.curves:
        print(curves(args.runs, args.metrics, args.out, args.per_chance, args.title))
        print(f"wrote {args.out}")
        return 0
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
