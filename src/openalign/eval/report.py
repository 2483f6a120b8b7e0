"""What `openalign eval` writes: metrics JSON (flat keys), a Markdown table, a PNG of the panels the tasks drew
(each task's figure says how it is drawn: eval/panels.py), and the lines printed to the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from openalign.outputs import staged
from openalign.eval import metrics as M  # noqa: E402

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


def plot(figures: dict, out: Path) -> bool:
    """One panel per figure that a task gave something to draw (`"draw": fn(ax, figure)`, the task's own: see
    eval/panels.py), in the tasks' order, into `out`; False (and nothing written) when none."""
    panels = [figure for figure in figures.values() if callable(figure.get("draw"))]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5), squeeze=False)
    for ax, figure in zip(axes[0], panels):
        figure["draw"](ax, figure)
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
