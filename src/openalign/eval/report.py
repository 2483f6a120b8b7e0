"""What `openalign eval` writes: metrics JSON (flat keys), a Markdown table, a PNG where a picture
helps (recall@K curves for retrieval, the confusion of the most frequent classes for zero-shot), and
the lines printed to the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from openalign.outputs import staged
from openalign.eval import metrics as M  # noqa: E402

CONFUSION_CLASSES = 12  # the most frequent classes drawn in the zero-shot confusion matrix


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown_table(metrics: dict) -> str:
    rows = ["| metric | value | chance |", "|---|---|---|"]
    for key, value in metrics.items():
        if not M.is_chance(key):
            chance = metrics.get(M.chance_key(key, metrics))
            rows.append(f"| {key} | {_fmt(value)} | {_fmt(chance) if chance is not None else ''} |")
    return "\n".join(rows) + "\n"


SHARED_CAPTIONS_NOTE = 0.1  # from this share of captions shared between images, retrieval gets a caveat


def caveats(metrics: dict) -> list[str]:
    """Sentences on what the numbers cannot show for this data (printed under them)."""
    shared = metrics.get("shared_captions", 0.0)
    if shared < SHARED_CAPTIONS_NOTE:
        return []
    return [f"  note: {shared:.0%} of the captions are also captions of other images (class-like captions such as "
            "\"a red star\"); such identical texts tie, and ties count against the model, so retrieval R@K "
            "understates: measure class-like data with --task zeroshot"]


def metric_lines(metrics: dict) -> list[str]:
    """Every metric on one line, with its chance level and the ratio where there is one, then any caveat."""
    width = max((len(k) for k in metrics), default=0)
    lines = []
    for key, value in metrics.items():
        if M.is_chance(key):
            continue
        chance = metrics.get(M.chance_key(key, metrics))
        note = f"   (chance {chance:.4f}, {value / chance:.1f}x)" if chance else ""
        lines.append(f"  {key:<{width}}  {_fmt(value)}{note}")
    return lines + caveats(metrics)


def recall_curve(ranks: torch.Tensor, max_k: int) -> tuple[list[int], list[float]]:
    ks = list(range(1, max_k + 1))
    counts = torch.bincount(ranks.clamp(max=max_k), minlength=max_k + 1)[:max_k].cumsum(0)
    return ks, (counts.double() / len(ranks)).tolist()


def reliability_panel(ax, data: dict) -> None:
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
    ax.set(xlabel="confidence (top probability)", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1.02),
           title=f"zero-shot reliability ({bins} bins)")
    ax.legend(fontsize=8, loc="upper left")


def plot(figures: dict, out: Path) -> bool:
    """Draw the panels `figures` has data for into `out`; False (and nothing written) when none."""
    zeroshot = figures.get("zeroshot")
    if zeroshot and int(torch.bincount(zeroshot["true"]).max()) < 2:  # one image per class: nothing to confuse
        figures = {k: v for k, v in figures.items() if k != "zeroshot"}
    panels = [name for name in ("retrieval", "zeroshot", "calibration", "arithmetic") if name in figures]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5), squeeze=False)
    for ax, name in zip(axes[0], panels):
        data = figures[name]
        if name == "retrieval":
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
        elif name == "calibration":
            reliability_panel(ax, data)
        elif name == "arithmetic":
            weights = data["weights"]
            for kind, recall in data["recall"].items():
                ax.plot(weights, recall, marker="o", alpha=0.6,
                        label=f"{kind.replace('_', ' ')} ({data['counts'][kind]:,})")
            ax.plot(weights, data["all"], marker="o", color="black", lw=2,
                    label=f"all queries ({sum(data['counts'].values()):,})")
            ax.axhline(data["text_only"], color="gray", ls="--", label="text alone")
            ax.axhline(data["chance"], color="gray", ls=":", label="chance")
            ax.axvline(2.0, color="tab:red", alpha=0.3, lw=6, label="paper: text 2, image 1")
            ax.set(xscale="symlog", xlabel="text weight (image weight 1)", ylabel="recall@10", ylim=(0, 1.02),
                   title="image + text query arithmetic")
            ax.set_xticks(weights, [f"{w:g}" for w in weights])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        else:
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
            fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def write_report(metrics: dict, out: Path, figures: dict | None = None) -> list[Path]:
    """metrics JSON at `out`, the Markdown table (and the PNG, if any) beside it; returns the files."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table, png = out.with_suffix(".md"), out.with_suffix(".png")
    drawn = bool(figures) and plot(figures, png)
    with staged(table) as tmp:
        tmp.write_text(markdown_table(metrics))
    with staged(out) as tmp:  # last: the metrics file appears only when the evaluation finished
        tmp.write_text(json.dumps(metrics, indent=2) + "\n")
    return [out, table] + ([png] if drawn else [])
