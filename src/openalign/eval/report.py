"""What `openalign eval` writes: metrics JSON (flat keys), a Markdown table, a PNG of the panels the tasks drew
(each task's figure says how it is drawn: eval/panels.py), and the lines printed to the terminal."""

from __future__ import annotations

import json
from pathlib import Path

from openalign import plots
from openalign.config import ConfigError
from openalign.outputs import staged
from openalign.eval import metrics as M

def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown_table(metrics: dict, paper: dict | None = None) -> str:
    """metric | value | chance, and with `paper` (eval/paper.beside) a column of the paper's figures and their cells."""
    paper = paper or {}
    head = ["metric", "value", "chance"] + (["paper (Jia et al. 2021)"] if paper else [])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, value in metrics.items():
        if not M.is_chance(key):
            chance = metrics.get(M.chance_key(key, metrics))
            cells = [key, _fmt(value), _fmt(chance) if chance is not None else ""]
            if paper:
                cells.append("; ".join(f"{c['value']:.4f}" + (f" ± {c['std']:.4f}" if c["std"] else "")
                                       + f" ({c['cell']})" for c in paper.get(key, [])))
            rows.append("| " + " | ".join(cells) + " |")
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
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5), squeeze=False)
    for ax, figure in zip(axes[0], panels):
        figure["draw"](ax, figure)
    plots.save(fig, out)
    return True


def write_report(metrics: dict, out: Path, figures: dict | None = None, paper: dict | None = None) -> list[Path]:
    """metrics JSON at `out`, the Markdown table (and the PNG, if any) beside it; returns the files. `paper`: the
    paper's figures for some of the metrics (eval/paper.beside), a column of the table and the JSON's `paper`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table, png = out.with_suffix(".md"), out.with_suffix(".png")
    drawn = bool(figures) and plot(figures, png)
    with staged(table) as tmp:
        tmp.write_text(markdown_table(metrics, paper))
    with staged(out) as tmp:  # last: the metrics file appears only when the evaluation finished
        tmp.write_text(json.dumps(metrics | ({"paper": paper} if paper else {}), indent=2) + "\n")
    return [out, table] + ([png] if drawn else [])


# ---------------------------------------------------------------------------------------------- CLIP_benchmark

def clip_benchmark_results(results: dict[str, dict], model: str, dataset: str, language: str = "en") -> dict[str, dict]:
    """{task: its result file} in CLIP_benchmark's result JSON, what its `clip_benchmark build` reads: `metrics`,
    `model`, `pretrained`, and `dataset`, `task`, `language` (`results`: {its task name: metrics under its keys})."""
    pretrained = str(Path(model).resolve())
    return {task: {"dataset": dataset, "model": Path(model).name, "pretrained": pretrained, "task": task,
                   "metrics": values, "language": language} for task, values in results.items()}


def write_clip_benchmark(results: dict[str, dict], out: str, model: str, dataset: str) -> list[Path]:
    """Each task's CLIP_benchmark result file at `out`, whose `{task}`, `{dataset}`, `{model}`, `{pretrained}` and
    `{language}` are filled in as CLIP_benchmark's --output is (`{task}` is needed for more than one task)."""
    results = clip_benchmark_results(results, model, dataset)
    if len(results) > 1 and "{task}" not in out:
        raise ConfigError(f"--format clip_benchmark writes one file per task ({', '.join(results)}); put {{task}} in "
                          f"--out (e.g. {{dataset}}_{{task}}.json), or give one --task")
    written = []
    for result in results.values():
        fields = {k: result[k] for k in ("dataset", "model", "task", "language")} | {
            "pretrained": Path(result["pretrained"]).name}
        name = out
        for field, value in fields.items():
            name = name.replace("{" + field + "}", value.replace("/", "_"))
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with staged(path) as tmp:
            tmp.write_text(json.dumps(result, indent=2) + "\n")
        written.append(path)
    return written
