"""A study's report: one Markdown table and one bar panel per group of variants (mean ± std over seeds)."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.lab.runner import Study

COLUMNS = (("mean_recall", "mean recall"), ("i2t_r1", "I2T R@1"), ("t2i_r1", "T2I R@1"),
           ("zeroshot_top1", "zero-shot top-1"), ("knn_top1", "KNN R@1"), ("temperature", "final temperature"),
           ("modality_gap", "modality gap"))


def mean_std(mean: float, std: float, seeds: int, digits: str = ".3f") -> str:
    """`mean ± std`, or the mean alone for one seed (a std of 0 would read as no spread)."""
    return f"{mean:{digits}} ± {std:{digits}}" if seeds > 1 else f"{mean:{digits}}"


def mean_std_of(runs: list[dict], keys) -> dict:
    """{"mean": {key: mean}, "std": {key: population std}} of `keys` over the runs' rows (one per seed)."""
    return {"mean": {k: statistics.fmean(r[k] for r in runs) for k in keys},
            "std": {k: statistics.pstdev(r[k] for r in runs) for k in keys}}


def seeds_phrase(seeds: int, spread: bool = True) -> str:
    """"mean ± std over 3 seeds" (or "mean over 1 seed" without `spread`)."""
    return f"mean{' ± std' if spread else ''} over {seeds} seed{'s' * (seeds > 1)}"


def _cell(row: dict, key: str) -> str:
    return mean_std(row["mean"][key], row["std"][key], len(row["runs"])) if key in row["mean"] else "—"


def groups(results: dict) -> dict[str, list[tuple[str, dict]]]:
    """Rows by group; a variant of group "baseline" heads every group (it is trained once)."""
    shared = [(name, row) for name, row in results.items() if row["group"] == "baseline"]
    out: dict[str, list] = {}
    for name, row in results.items():
        if row["group"] != "baseline":
            out.setdefault(row["group"], list(shared)).append((name, row))
    return out or {"baseline": shared}


def write(study: Study, results: dict, seeds: int, out: Path, headline: tuple[str, str]) -> Path:
    """report.md and study.png in `out`, with `headline` = (result key, label) the metric compared, then the study's
    own sections (`Study.extra_report`); returns the report's path."""
    key, metric = headline
    columns = [c for c in [(key, metric), *(c for c in COLUMNS if c[0] != key)]
               if any(c[0] in row["mean"] for row in results.values())]
    lines = [f"# openalign study: {study.name}", "", study.intro, "",
             f"Held-out metrics after training, mean ± std over {seeds} seed{'s' if seeds > 1 else ''} "
             f"(population std); Δ: {metric} against the group's baseline.", ""]
    if study.paper_columns:
        lines += [f"The paper's numbers (\"paper:\" columns) are from {study.paper.removeprefix('Jia et al. 2021, ')} "
                  "They are at full scale: compare the direction and size of each change, not the values.", ""]
    for group, rows in groups(results).items():
        base = next((row for _, row in rows if row["baseline"]), None)
        head = ["variant", *(label for _, label in columns), f"Δ {metric}",
                *(f"paper: {c}" for c in study.paper_columns)]
        lines += [f"## {group}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, row in rows:
            delta = "—" if base is None or row is base or key not in row["mean"] else \
                f"{row['mean'][key] - base['mean'][key]:+.3f}"
            paper = [str(row["paper"].get(c, "—")) for c in study.paper_columns]
            label = f"**{row['label']}**" if row["baseline"] else row["label"]
            lines.append("| " + " | ".join([label, *(_cell(row, k) for k, _ in columns), delta, *paper]) + " |")
        lines.append("")
    lines += [f"![{metric} per variant](study.png)", ""]
    _plot(results, out / "study.png", key, metric)
    if study.extra_report:
        lines += study.extra_report(results, out)
    path = out / "report.md"
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
    return path


def save_figure(fig, path: Path, legend_axes=(), legend_size: int = 8) -> None:
    """A study's figure: legends on `legend_axes`, tight layout, a 110-dpi PNG at `path`, the figure closed."""
    for ax in legend_axes:
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grouped_bars(ax, series: list[tuple[str, list[float], list[float]]], ticks: list[str], **tick_options) -> None:
    """One bar per (label, means, stds) series at each tick, side by side; error bars only where a std is known."""
    width = 0.8 / len(series)
    for i, (label, means, stds) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(ticks))]
        ax.bar(xs, means, width, yerr=stds if any(stds) else None, capsize=3, label=label, alpha=0.85)
    ax.set_xticks(range(len(ticks)), ticks, **tick_options)
    ax.grid(axis="y", alpha=0.3)


def _plot(results: dict, out: Path, key: str, metric: str) -> None:
    by_group = groups(results)
    cols = min(3, len(by_group))
    rows_of_panels = -(-len(by_group) // cols)
    fig, axes = plt.subplots(rows_of_panels, cols, figsize=(4.6 * cols, 4.0 * rows_of_panels), squeeze=False)
    for ax in axes.flat[len(by_group):]:
        ax.axis("off")
    for ax, (group, rows) in zip(axes.flat, by_group.items()):
        labels = [row["label"] for _, row in rows]
        means = [row["mean"].get(key, float("nan")) for _, row in rows]
        stds = [row["std"].get(key, 0.0) for _, row in rows]
        colors = ["tab:red" if row["baseline"] else "tab:blue" for _, row in rows]
        ax.bar(range(len(rows)), means, yerr=stds if any(stds) else None, color=colors, capsize=4, alpha=0.8)
        chance = rows[0][1]["chance"].get(key)
        if chance:
            ax.axhline(chance, color="gray", ls=":", label="chance")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
        ax.set(title=group, ylabel=f"held-out {metric}")
        ax.grid(axis="y", alpha=0.3)
    save_figure(fig, out)


def paired_bars(rows: dict, series: tuple[tuple[str, str], ...], ticks: list[str], chance: float, path: Path,
                **axes) -> None:
    """Two metrics side by side for each row (`rows`: name -> {"mean", "std"}), the seeds' spread as error bars and
    chance as a dashed line; `axes` are matplotlib's axis settings (ylabel, title, ylim)."""
    names = list(rows)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, (key, label) in enumerate(series):
        ax.bar([j + 0.4 * i for j in range(len(names))], [rows[x]["mean"][key] for x in names], 0.4,
               yerr=[rows[x]["std"][key] for x in names], capsize=3, label=label)
    ax.axhline(chance, color="k", ls="--", lw=0.8, label="chance")
    ax.set_xticks([j + 0.2 for j in range(len(names))], ticks)
    ax.set(**axes)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path, legend_axes=[ax])
