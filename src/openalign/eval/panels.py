"""How a task's figure is drawn: each task puts `"draw": one of these` into the figure it returns, and the report
(eval/report.py) draws one panel per such figure. A new task with a picture brings its own drawer (arithmetic's
is in eval/arithmetic.py); nothing in the report names a task.

    retrieval      recall@K curves of both directions against their chance levels
    zeroshot       the confusion of the most frequent classes
    calibration    the zero-shot reliability diagram, before and after temperature scaling
"""

from __future__ import annotations

import torch

from openalign.eval import metrics as M

CONFUSION_CLASSES = 12  # the most frequent classes drawn in the zero-shot confusion matrix


def recall_curve(ranks: torch.Tensor, max_k: int) -> tuple[list[int], list[float]]:
    ks = list(range(1, max_k + 1))
    counts = torch.bincount(ranks.clamp(max=max_k), minlength=max_k + 1)[:max_k].cumsum(0)
    return ks, (counts.double() / len(ranks)).tolist()


def retrieval(ax, data: dict) -> None:
    max_k = min(100, len(data["t2i"]), len(data["i2t"]))
    n_images = len(data["i2t"])
    for direction, color in (("i2t", "tab:blue"), ("t2i", "tab:orange")):
        ks, recall = recall_curve(data[direction], max_k)
        ax.plot(ks, recall, color=color, label=f"{'image→text' if direction == 'i2t' else 'text→image'}")
    i2t_chance = M.positive_chance(data["captions_per_image"], data["n_texts"], ks)
    ax.plot(ks, [i2t_chance[k] for k in ks], color="tab:blue", ls=":", label="chance image→text")
    ax.plot(ks, [min(1.0, k / n_images) for k in ks], color="tab:orange", ls=":", label="chance text→image")
    ax.set(xscale="log", xlabel="K", ylabel="recall@K", ylim=(0, 1.02),
           title=f"retrieval: {n_images:,} images, {data['n_texts']:,} texts")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def confusion_worth_drawing(true: torch.Tensor) -> bool:
    """One image per class leaves nothing to confuse: no panel."""
    return len(true) > 0 and int(torch.bincount(true).max()) >= 2


def confusion(ax, data: dict) -> None:
    true, predicted, classes = data["true"], data["predicted"], data["classes"]
    top = torch.bincount(true, minlength=len(classes)).argsort(descending=True, stable=True)[:CONFUSION_CLASSES]
    index = {int(c): i for i, c in enumerate(top)}
    matrix = torch.zeros(len(top), len(top) + 1)  # last column: predicted outside the drawn classes
    for t, p in zip(true.tolist(), predicted.tolist()):
        if t in index:
            matrix[index[t], index.get(p, len(top))] += 1
    matrix /= matrix.sum(dim=1, keepdim=True).clamp(min=1)
    image = ax.imshow(matrix.numpy(), cmap="viridis", vmin=0, vmax=1)
    names = [classes[int(c)][:18] for c in top]
    ax.set_xticks(range(len(top) + 1), names + ["other"], rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(top)), names, fontsize=7)
    ax.set(xlabel="predicted", ylabel="true", title=f"zero-shot confusion ({len(top)} most frequent classes)")
    ax.figure.colorbar(image, ax=ax, fraction=0.046)


def reliability(ax, data: dict) -> None:
    """Zero-shot reliability diagram: accuracy per confidence bin, at the model's temperature and (when
    fitted) after temperature scaling, against the diagonal of perfect calibration."""
    bins = len(data["before"]["count"])
    width = 1 / bins
    drawn = [(key, color, text) for key, color, text in (("before", "tab:red", "model's temperature"),
                                                          ("after", "tab:green", "temperature-scaled"))
             if key in data]
    for i, (key, color, text) in enumerate(drawn):
        shift = (i - (len(drawn) - 1) / 2) * width / len(drawn)
        accuracy = [a if a == a else 0.0 for a in data[key]["accuracy"]]  # an empty bin: no bar
        ax.bar([(m + 0.5) * width + shift for m in range(bins)], accuracy, width=width / len(drawn), color=color,
               alpha=0.7, label=f"{text} (ECE {data[key]['ece']:.3f})")
    ax.plot([0, 1], [0, 1], color="black", ls="--", lw=1, label="perfectly calibrated")
    sigmoid = data.get("head") == "sigmoid"  # SigLIP's probability is its pair's own, not a share of the classes'
    ax.set(xlabel="confidence (top probability: " + ("per-pair sigmoid)" if sigmoid else "softmax over classes)"),
           ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.02), title=f"zero-shot reliability ({bins} bins)")
    ax.legend(fontsize=8, loc="upper left")
