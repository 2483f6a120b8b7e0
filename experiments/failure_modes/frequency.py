"""`concept-frequency`: zero-shot accuracy against how often a class's words occur in training.

For each (model, training shards, held-out shards) set: every held-out image classified among all the held-out class
names (its own caption: emoji's CLDR name, openclipart's title), and its class's training frequency (the count of
its rarest word in the training captions); accuracy by frequency bin, and the fitted slope per decade of frequency.
The teaching: zero-shot accuracy follows how often a concept was seen (roughly log-linearly).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import openalign
from openalign.data.images import BadImage, load_rgb
from openalign.data.tars import BadSample, all_texts, image_bytes, list_shards, read_samples, sample_texts
from experiments.failure_modes.options import FailureOptions
from experiments.lab.report import save_figure

NAME = "concept-frequency"
DECADES = ((0, 1), (1, 10), (10, 100), (100, 1_000), (1_000, 10_000), (10_000, float("inf")))


def words(text: str) -> list[str]:
    return [w for w in re.split(r"[^0-9a-z]+", text.lower()) if w]


def held_out(shards: str) -> tuple[list, list[str]]:
    """The readable held-out images of `shards` and their names (each sample's first caption)."""
    images, names = [], []
    for sample in read_samples(list_shards(shards)):
        try:
            name, image = sample_texts(sample)[0], load_rgb(image_bytes(sample))
        except (BadSample, BadImage, KeyError):
            continue
        images.append(image)
        names.append(name)
    return images, names


def run(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Per set: each held-out image's zero-shot hit (its own name ranked first among all held-out names) and its
    class's training frequency; accuracy by frequency bin and the least-squares slope per decade."""
    sets = list(zip(options.frequency_models, options.frequency_train, options.frequency_eval))
    if not sets or len({len(options.frequency_models), len(options.frequency_train), len(options.frequency_eval)}) > 1:
        raise openalign.ConfigError("concept-frequency: give as many frequency_models as frequency_train and "
                                    "frequency_eval")
    results = {}
    for model_dir, train, evaluation in tqdm(sets, desc="concept frequency", unit="set", disable=not progress):
        if not (Path(model_dir) / "config.json").is_file():
            raise openalign.ConfigError(f"concept-frequency needs a model at {model_dir} (run `make demo`, or give "
                                        "frequency_models=DIR)")
        counts = Counter(w for text in all_texts(list_shards(train)) for w in words(text))
        images, names = held_out(evaluation)
        classes = sorted(set(names))
        model = openalign.load(model_dir)
        scores = model.encode_images(images) @ model.encode_texts(classes).T
        hits = (scores.argmax(dim=1) == torch.tensor([classes.index(n) for n in names])).float().numpy()
        # a class's frequency: the training count of its rarest word (the word that names it: "grinning" more than
        # "face"); the mean count of its words beside it
        frequency = np.array([min([counts.get(w, 0) for w in words(n)] or [0]) for n in names])
        mean_count = np.array([statistics.fmean([counts.get(w, 0) for w in words(n)] or [0]) for n in names])
        x = np.log10(1 + frequency)
        slope, intercept = np.polyfit(x, hits, 1) if x.std() > 0 else (0.0, float(hits.mean()))
        x_mean = np.log10(1 + mean_count)
        slope_mean = float(np.polyfit(x_mean, hits, 1)[0]) if x_mean.std() > 0 else 0.0
        bins = []
        for lo, hi in DECADES:
            inside = (frequency >= lo) & (frequency < hi)
            if inside.any():
                bins.append({"low": lo, "high": hi, "images": int(inside.sum()), "accuracy": float(hits[inside].mean()),
                             "centre": float(x[inside].mean())})
        results[f"{Path(evaluation).parent.name or evaluation}"] = {
            "model": str(model_dir), "images": len(names), "classes": len(classes), "chance": 1 / len(classes),
            "accuracy": float(hits.mean()), "slope_per_decade": float(slope), "intercept": float(intercept),
            "slope_per_decade_mean_count": slope_mean,
            "unseen_share": float((frequency == 0).mean()), "bins": bins}
    return {"sets": results}


def figure(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in result["sets"].items():
        xs = [b["centre"] for b in row["bins"]]
        line = ax.plot(xs, [b["accuracy"] for b in row["bins"]], marker="o", label=f"{name}: binned")[0]
        ax.plot(xs, [row["intercept"] + row["slope_per_decade"] * x for x in xs], ls="--", color=line.get_color(),
                label=f"{name}: fit, {row['slope_per_decade']:+.3f} per decade")
        ax.axhline(row["chance"], color=line.get_color(), lw=0.6, ls=":")
    ax.set(xlabel="log10(1 + training count of the class's rarest word)", ylabel="zero-shot top-1",
           title="zero-shot accuracy against concept frequency")
    ax.grid(alpha=0.3)
    save_figure(fig, path, legend_axes=[ax], legend_size=7)


def reading(name: str, row: dict) -> str:
    """Whether accuracy rises with frequency in this set: a positive fitted slope, and the most frequent bin ahead of
    the rarest."""
    bins = row["bins"]
    rises = row["slope_per_decade"] > 0 and len(bins) > 1 and bins[-1]["accuracy"] > bins[0]["accuracy"]
    return (f"- {name}: {row['slope_per_decade']:+.3f} top-1 per decade of the rarest word's count; "
            + (f"accuracy rises with how often the concept was seen ({bins[0]['accuracy']:.3f} in the rarest bin, "
               f"{bins[-1]['accuracy']:.3f} in the most frequent), as the teaching says." if rises else
               "accuracy does not rise with how often the concept was seen here."))


def span(b: dict) -> str:
    if b["high"] == 1:
        return "0 (never)"
    return f"{b['low']:,}–{b['high'] - 1:,}" if b["high"] != float("inf") else f"{b['low']:,} or more"


def section(result: dict, options: FailureOptions, seeds: int, out: Path) -> list[str]:
    figure(result, out / "concept_frequency.png")
    lines = ["## Zero-shot accuracy against concept frequency", "",
             "Each held-out image classified among every held-out class name; its class's frequency is the training "
             "count of the name's rarest word (the word that names it), the words' mean count beside it.", "",
             "| held-out set | model | images (classes) | zero-shot top-1 (chance) | names with a word never seen in "
             "training | slope per decade of the rarest word's count | ... of the words' mean count |",
             "|---|---|---|---|---|---|---|"]
    for name, row in result["sets"].items():
        lines.append(f"| {name} | {row['model']} | {row['images']:,} ({row['classes']:,}) | {row['accuracy']:.3f} "
                     f"({row['chance']:.4f}) | {row['unseen_share']:.0%} | {row['slope_per_decade']:+.3f} | "
                     f"{row['slope_per_decade_mean_count']:+.3f} |")
    lines += ["", "| held-out set | training count of the rarest word | images | zero-shot top-1 |",
              "|---|---|---|---|"]
    for name, row in result["sets"].items():
        lines += [f"| {name} | {span(b)} | {b['images']} | {b['accuracy']:.3f} |" for b in row["bins"]]
    lines += ["", *(reading(name, row) for name, row in result["sets"].items())]
    return lines + ["", "![zero-shot accuracy against concept frequency](concept_frequency.png)", ""]
