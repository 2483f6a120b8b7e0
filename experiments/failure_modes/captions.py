"""`generic-captions`: the PMI study's table (experiments/pmi.py) with generic captions added, captions that go with
every image as often as the image occurs ("image", "photo", "click here"), half of all pairs.

The claim: a dual encoder trained contrastively approximates PMI plus a constant, and PMI divides by p(y), so a
caption that goes with everything scores near zero: never the best caption of an image, although it is the most
frequent one for every image. The in-batch softmax learns this alone, as popular captions are negatives in
proportion to their frequency.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from tqdm import tqdm

from experiments import pmi
from experiments.failure_modes.options import FailureOptions
from experiments.lab.report import mean_std_of, save_figure, seeds_phrase

NAME = "generic-captions"
RARELY = 0.05  # the claim holds when a generic caption is the best of at most this share of the images


def run(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """The PMI study's table plus generic captions; free unit vectors trained by openalign's loss (pmi.train_scores)
    and compared with PMI: each caption's frequency and its learned score less the best constant, and how often a
    generic caption is an image's best by the learned scores, by PMI and by plain co-occurrence (the likelihood a
    captioning model would learn)."""
    table_options = pmi.PmiOptions(steps=options.generic_steps, widths=(options.generic_width,))
    counts = pmi.count_table(table_options)
    rng = np.random.default_rng(table_options.table_seed + 1)
    px = counts.sum(axis=1) / counts.sum()
    per_generic = options.generic_share / (1 - options.generic_share) * counts.sum() / options.generic
    generic = rng.poisson(np.outer(px, np.full(options.generic, per_generic))) + 1.0  # independent of the image
    table = np.concatenate([counts, generic], axis=1)
    first = counts.shape[1]
    truth = pmi.pmi_matrix(table)
    runs = []
    for seed in tqdm(range(seeds), desc="generic captions", unit="run", disable=not progress):
        scores = pmi.train_scores(table, options.generic_width, "both", table_options, seed)
        centred = scores - (scores - truth).mean()  # the one constant the loss is blind to
        runs.append({"generic_score": float(centred[:, first:].mean()),
                     "specific_score": float(centred[:, :first].mean()),
                     "specific_best": float(centred.max(axis=1).mean()),
                     "generic_best_share": float((scores.argmax(axis=1) >= first).mean()),
                     "column_scores": centred.mean(axis=0).tolist()})
    frequency = (table.sum(axis=0) / table.sum()).tolist()
    keys = ("generic_score", "specific_score", "specific_best", "generic_best_share")
    return {"first_generic": first, "frequency": frequency, "pmi_columns": truth.mean(axis=0).tolist(),
            "pmi_generic": float(truth[:, first:].mean()),
            "pmi_generic_best_share": float((truth.argmax(axis=1) >= first).mean()),
            "count_generic_best_share": float((table.argmax(axis=1) >= first).mean()),
            **mean_std_of(runs, keys),
            "column_scores": [statistics.fmean(r["column_scores"][j] for r in runs) for j in range(table.shape[1])]}


def figure(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    first = result["first_generic"]
    fig, ax = plt.subplots(figsize=(6, 4))
    freq, learned, pmi_cols = result["frequency"], result["column_scores"], result["pmi_columns"]
    ax.scatter(freq[:first], learned[:first], label="captions of the table: learned score", color="tab:blue")
    ax.scatter(freq[first:], learned[first:], label="generic captions: learned score", color="tab:red", marker="s")
    ax.scatter(freq, pmi_cols, label="PMI (the target)", facecolors="none", edgecolors="k", s=30)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="caption frequency p(y)",
           ylabel="mean over images of the score\n(less the one constant)",
           title="a caption that goes with everything scores near zero")
    ax.grid(alpha=0.3)
    save_figure(fig, path, legend_axes=[ax], legend_size=7)


def reading(result: dict) -> str:
    m = result["mean"]
    if m["generic_best_share"] > RARELY:
        return (f"The claim does not reproduce here: the generic captions are the best caption of "
                f"{m['generic_best_share']:.0%} of the images (more than {RARELY:.0%}); see the rows.")
    return (f"The generic captions are the most frequent for {result['count_generic_best_share']:.0%} of the images, "
            f"and the contrastive model makes them the best caption of {m['generic_best_share']:.0%}: their learned "
            f"score, {m['generic_score']:.2f}, against PMI's {result['pmi_generic']:.2f}, where an image's best "
            f"caption scores {m['specific_best']:.2f}. The claim reproduces: the in-batch negatives divide by p(y) "
            "without being told.")


def section(result: dict, options: FailureOptions, seeds: int, out: Path) -> list[str]:
    figure(result, out / "generic_captions.png")
    m, sd = result["mean"], result["std"]
    return ["## Generic captions (the PMI study's table, plus captions that go with everything)", "",
            f"{options.generic} generic captions, {options.generic_share:.0%} of all pairs, each as likely with "
            f"every image; width {options.generic_width}, {options.generic_steps} steps; {seeds_phrase(seeds)}. "
            "Scores are the learned logits less the one constant the loss is blind to.", "",
            "| | generic captions | the table's captions |", "|---|---|---|",
            f"| mean learned score | {m['generic_score']:.2f} ± {sd['generic_score']:.2f} | "
            f"{m['specific_score']:.2f} ± {sd['specific_score']:.2f} (an image's best: {m['specific_best']:.2f}) |",
            f"| mean PMI | {result['pmi_generic']:.2f} | — |",
            f"| images whose best caption is generic: learned | {m['generic_best_share']:.0%} | |",
            f"| ... by PMI | {result['pmi_generic_best_share']:.0%} | |",
            f"| ... by co-occurrence count (a likelihood) | {result['count_generic_best_share']:.0%} | |", "",
            reading(result), "", "![caption frequency against learned score](generic_captions.png)", ""]
