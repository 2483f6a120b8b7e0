"""The end-of-training report: report.md, a PNG of loss / temperature / recall over steps, a summary."""

from __future__ import annotations

import json
from pathlib import Path

from openalign import plots
from openalign import loss as loss_lib
from openalign.config import Config
from openalign.eval.metrics import chance_key
from openalign.eval.report import caveats

HEADLINE = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "mean_recall", "zeroshot_top1",
            "zeroshot_top5")


__all__ = ["plot_curves", "read_log", "write"]


def read_log(path: Path) -> tuple[list[dict], list[dict]]:
    """A run's metrics.jsonl: its training rows (step, loss, temperature, ...), and its held-out evaluations (step and
    the metrics under "eval"), in order."""
    steps, evals = [], []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        (evals if "eval" in row else steps).append(row)
    return steps, [e for e in evals if e["eval"]]


def plot_curves(log: Path, out: Path) -> None:
    steps, evals = read_log(log)
    geometry = [e for e in evals if "modality_gap" in e["eval"]]
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 4 if geometry else 3, figsize=(17 if geometry else 13, 3.6))
    x = [r["step"] for r in steps]
    axes[0].plot(x, [r["loss"] for r in steps])
    axes[0].set(title="contrastive loss (L_i2t + L_t2i)", xlabel="step")
    axes[1].plot(x, [r["temperature"] for r in steps])
    axes[1].set(title="temperature", xlabel="step", yscale="log")
    if evals:
        ex = [e["step"] for e in evals]
        for key in ("i2t_r10", "t2i_r10", "zeroshot_top5"):
            axes[2].plot(ex, [e["eval"].get(key, float("nan")) for e in evals], marker="o", label=key)
        axes[2].axhline(evals[-1]["eval"].get("chance_i2t_r10", 0), color="gray", ls=":", label="chance R@10")
        axes[2].legend(fontsize=8)
    axes[2].set(title="held-out evaluation", xlabel="step")
    if geometry:  # the modality gap and the cones (eval/metrics.py: modality_gap)
        gx = [e["step"] for e in geometry]
        for key, label in (("modality_gap", "gap: |mean image - mean text|"), ("image_cone", "image cone (mean cos)"),
                           ("text_cone", "text cone (mean cos)")):
            axes[3].plot(gx, [e["eval"][key] for e in geometry], marker="o", label=label)
        axes[3].set(title="geometry of the shared space", xlabel="step", ylim=(0, None))
        axes[3].legend(fontsize=8)
    plots.save(fig, out)


def eval_line(step: int, metrics: dict) -> str:
    """An evaluation during a run as one short line: its headline numbers (or its first four)."""
    keys = [k for k in ("mean_recall", "i2t_r10", "t2i_r10", "zeroshot_top1", "knn_r1") if k in metrics]
    keys = keys or [k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)][:4]
    return f"step {step} eval: " + ", ".join(f"{k} {metrics[k]:.3f}" for k in keys)


def trained_sources(cfg: Config) -> tuple[str, ...]:
    """The built-in corpora a run trains on (none when it trains on --data)."""
    return () if cfg.data.train or not cfg.data.corpus else tuple(n.strip() for n in cfg.data.corpus.split("+"))


def summary_lines(metrics: dict, trained: tuple[str, ...] = ()) -> list[str]:
    """The held-out headline numbers with their chance levels, then each source's (a source not in `trained`, the
    run's training corpora, is marked as never trained on: its figures measure transfer)."""
    lines = []
    for key in HEADLINE:
        if key not in metrics:
            continue
        chance = metrics.get(chance_key(key, metrics))
        ratio = f"{metrics[key] / chance:5.1f}x chance" if chance else ""
        lines.append(f"  {key:<14} {metrics[key]:.3f}   (chance {chance:.3f}, {ratio})" if chance else
                     f"  {key:<14} {metrics[key]:.3f}")
    for key in ("i2t_median_rank", "t2i_median_rank", "n_images", "n_texts", "zeroshot_n_classes"):
        if key in metrics:
            lines.append(f"  {key:<14} {metrics[key]:g}")
    return lines + source_lines(metrics, trained) + caveats(metrics)


def source_lines(metrics: dict, trained: tuple[str, ...] = ()) -> list[str]:
    """Several corpora (data.corpus=emoji+openclipart): each one's held-out split alone (metrics NAME/...); one
    evaluated but not trained on (data.eval_corpus) is marked as such."""
    lines = []
    for name in dict.fromkeys(k.split("/", 1)[0] for k in metrics if "/" in k):
        own = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(name + "/")}
        parts = []
        for key in ("i2t_r10", "t2i_r10", "mean_recall", "zeroshot_top1"):
            if key in own:
                chance = own.get(chance_key(key, own))
                parts.append(f"{key} {own[key]:.3f}" + (f" ({own[key] / chance:.1f}x chance)" if chance else ""))
        if parts:
            label = f"{name} alone" + (", never trained on" if trained and name not in trained else "") + ":"
            lines.append(f"  {label:<14} " + ", ".join(parts) + f" ({own.get('n_images', 0):g} images)")
    return lines


def write(out: Path, cfg: Config, metrics: dict, model_info: dict) -> str:
    out = Path(out)
    plot_curves(out / "metrics.jsonl", out / "training.png")
    (out / "final_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    steps, _ = read_log(out / "metrics.jsonl")
    speed = sorted(r["pairs_per_s"] for r in steps[1:]) or [0.0]
    kind = loss_lib.kind_of(cfg.loss)
    text = "\n".join([
        f"# openalign run: {cfg.preset or 'custom'}", "",
        f"- model: EfficientNet (width {cfg.model.vision.width_coefficient},"
        f" depth {cfg.model.vision.depth_coefficient},"
        f" {model_info['vision_params']:,} params) + BERT ({cfg.model.text.num_layers}x{cfg.model.text.hidden_size},"
        f" {model_info['text_params']:,} params), embedding {cfg.model.embed_dim}",
        f"- steps {steps[-1]['step'] if steps else 0}, batch {cfg.data.global_batch},"
        f" images {cfg.model.vision.image_size}px,"
        f" median {speed[len(speed) // 2]:.0f} pairs/s",
        f"- temperature: init {kind.initial_scalars(cfg.loss)['temperature']:g}, final "
        f"{model_info['temperature']:.4f}, learned {kind.learned_as(cfg.loss)}"
        f" (lr scale {cfg.loss.temperature.lr_scale}; the paper's init is 1.0 — for runs this short it"
        " costs held-out recall, measured in docs/demo.md)", "",
        "## Held-out evaluation (family split: no variant of these emoji was seen in training)"
        if cfg.data.corpus == "emoji" and not cfg.data.train
        else f"## Held-out evaluation ({cfg.data.eval or cfg.data.corpus or 'none'})", "",
        "```", *summary_lines(metrics, trained_sources(cfg)), "```", "",
        "![training curves](training.png)", "",
    ])
    (out / "report.md").write_text(text)
    return text
