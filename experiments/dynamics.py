"""`python -m experiments.dynamics`: the temperature and the shape of the shared space over training.

The paper (Section 6.1): the learned temperature "quickly decreases to only around 1.2x of the converged
values in the first 100k steps" (of 1.2M), then slowly converges (near 1/64). Runs from the paper's
initial temperature 1.0 and from CLIP's 0.07, evaluated every few steps, plot the temperature, the
modality gap (the distance between the image and text embeddings' centroids) and each modality's cone
(the mean cosine between two of its embeddings) over the steps.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from openalign.config import Config
from openalign.train.report import read_log
from openalign.train.trainer import METRICS
from experiments.lab import command
from experiments.lab.report import mean_std, save_figure
from experiments.lab.runner import Study, Variant

INITS = (1.0, 0.07)  # the paper's and CLIP's
NEAR = 1.2  # the paper's "around 1.2x of the converged value"
INTRO = ("The learned temperature, from the paper's initial value 1.0 and from CLIP's 0.07, and the modality gap "
         "and cones of the held-out embeddings, over the steps of training (the paper: the temperature falls to "
         f"about {NEAR}x its final value within the first 100k of 1.2M steps, then slowly converges).")


def variants(base: Config) -> list[Variant]:
    return [Variant(f"t_init{t:g}", "temperature init", (f"loss.temperature.init={t}",),
                    f"init T = {t:g}" + (" (paper)" if t == 1.0 else " (CLIP)"), baseline=t == 1.0) for t in INITS]


def read_curves(run: Path) -> tuple[list[tuple[int, float]], list[tuple[int, dict]]]:
    """(step, temperature) of every logged step, and (step, metrics) of every evaluation, of one run."""
    steps, evals = read_log(run / METRICS)
    return [(r["step"], r["temperature"]) for r in steps if "temperature" in r], [(e["step"], e["eval"]) for e in evals]


def settle_step(temps: list[tuple[int, float]], near: float = NEAR) -> int:
    """The first logged step from which the temperature stays within `near` x its final value (either side)."""
    final = temps[-1][1]
    i = len(temps) - 1
    while i > 0 and final / near <= temps[i - 1][1] <= final * near:
        i -= 1
    return temps[i][0]


def _mean_std(values: list[float], digits: str) -> str:
    return mean_std(statistics.fmean(values), statistics.pstdev(values), len(values), digits)


def extra_report(results: dict, out) -> list[str]:
    """Temperature, modality gap and cones over steps of every variant: every seed's curves (seed 0 drawn
    bold) in dynamics.png, and a table of mean ± std over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: sorted(p for p in (Path(out) / "runs" / name).glob("seed*") if (p / "metrics.jsonl").is_file())
            for name in results}
    runs = {name: found for name, found in runs.items() if found}
    if not runs:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    seeds = max(len(found) for found in runs.values())
    lines = ["## Over the steps of training", "",
             f"Mean ± std over {seeds} seed(s); the plot draws seed 0 bold and the others faint.", "",
             f"| variant | final temperature | within {NEAR}x of it from step | share of training | "
             "modality gap, first → last evaluation | image cone | text cone |", "|---|---|---|---|---|---|---|"]
    for (name, found), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        label = results[name]["label"]
        finals, settles, shares, geometry = [], [], [], {k: ([], []) for k in ("modality_gap", "image_cone",
                                                                               "text_cone")}
        for i, run in enumerate(found):
            temps, evals = read_curves(run)
            style = {"alpha": 1.0 if i == 0 else 0.35, "lw": 1.5 if i == 0 else 0.8}
            axes[0].plot([s for s, _ in temps], [t for _, t in temps], color=color, label=label if i == 0 else None,
                         **style)
            for key, ls in (("modality_gap", "-"), ("image_cone", "--"), ("text_cone", ":")):
                points = [(s, e[key]) for s, e in evals if key in e]
                target = axes[1] if key == "modality_gap" else axes[2]
                target.plot([s for s, _ in points], [v for _, v in points], ls, marker="o" if i == 0 else None, ms=3,
                            color=color, label=f"{label}: {key.replace('_', ' ')}" if i == 0 else None, **style)
                if points:
                    geometry[key][0].append(points[0][1])
                    geometry[key][1].append(points[-1][1])
            finals.append(temps[-1][1])
            settles.append(settle_step(temps))
            shares.append(settles[-1] / temps[-1][0])
        final = statistics.fmean(finals)
        cells = [label, f"{_mean_std(finals, '.4f')} (1/{1 / final:.0f})", _mean_std(settles, '.0f'),
                 f"{statistics.fmean(shares):.0%}"]
        cells += [f"{statistics.fmean(first):.3f} → {_mean_std(last, '.3f')}" if first else "—"
                  for first, last in geometry.values()]
        lines.append("| " + " | ".join(cells) + " |")
    axes[0].axhline(1 / 64, color="gray", ls=":", label="1/64 (paper's converged value)")
    axes[0].set(title="learned temperature", xlabel="step", yscale="log")
    axes[1].set(title="modality gap (held-out)", xlabel="step", ylim=(0, None))
    axes[2].set(title="cones: mean cosine within a modality", xlabel="step", ylim=(0, 1))
    for ax in axes:
        ax.grid(alpha=0.3)
    save_figure(fig, out / "dynamics.png", axes, legend_size=7)
    return lines + ["", "Paper: the temperature is within about 1.2x of its converged value after 100k of 1.2M steps "
                        "(8%).", "", "![temperature and geometry over steps](dynamics.png)", ""]


# --quick: 300 steps evaluated every 25 (the 100-step runs of the other studies are too short to converge)
STUDY = Study("dynamics", variants, INTRO, extra_report=extra_report, quick=("train.steps=300", "train.eval_every=25"))


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
