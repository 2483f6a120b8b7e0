"""`python -m experiments.model_data`: does a bigger model need more data? (the paper's Table 9)

Two model sizes, the base config's towers and a smaller pair (half the text tower's width and depth,
half the image tower's width and depth coefficients, the same embedding dimension, as the paper keeps
640), each trained on the whole emoji corpus, on a 10% sample of it, and on a clean 10% (no alt-text
noise: the paper's small curated CC-3M), all for the same number of steps. The held-out split is the same.

On your own shards (`--data`), the 10% is `data.fraction=0.1` of them and there is no clean row (a
curated set is a dataset of its own: train on it with `python -m experiments.model_data --data CLEAN`).
"""

from __future__ import annotations

import sys

from openalign.config import Config, ConfigError
from openalign.eval import paper as paper_lib
from experiments.lab import command
from experiments.lab.report import save_figure
from experiments.lab.runner import Study, Variant, corpus_override

FRACTION = 0.1  # the paper's "10% of ALIGN data"
INTRO = ("Two model sizes, each on the whole noisy corpus, a 10% sample of it and a clean 10% (the paper's small "
         "curated CC-3M), at an equal training budget (the paper's Table 9: the larger model gains from the full "
         "data, the smaller one saturates at 10%, and on small curated data the larger one overfits).")
PAPER = ("Jia et al. 2021, Table 9: EfficientNet-B7 + BERT-base and EfficientNet-B3 + BERT-mini on the full ALIGN "
         "data, 10% of it and CC-3M (trained for 1/10 of the steps); zero-shot MSCOCO R@1 and ImageNet KNN R@1, "
         "in %.")
PAPER_COLUMNS = ("MSCOCO I2T R@1", "MSCOCO T2I R@1", "ImageNet KNN R@1")
# our (size, data) -> the paper's (model, row) of Table 9 (eval/paper_tables.csv)
MODELS = {"large": "EfficientNet-B7 + BERT-base", "small": "EfficientNet-B3 + BERT-mini"}
ROWS = {"full": "ALIGN full data", "10%": "ALIGN 10% data", "clean": "CC-3M data"}
TABLE_9 = {(size, data): tuple(paper_lib.row_values(9, ROWS[data], MODELS[size]).values()) for size in MODELS
           for data in ROWS}
DATA = (("full", "all data", {}), ("10%", f"{FRACTION:.0%} of the data", {"fraction": FRACTION}),
        ("clean", f"clean {FRACTION:.0%}", {"fraction": FRACTION, "noise": 0.0}))


def smaller(base: Config) -> tuple[str, ...]:
    """Overrides for the smaller model: half the towers' width and depth, the same embedding dimension."""
    text, vision = base.model.text, base.model.vision
    return (f"model.text.hidden_size={text.hidden_size // 2}", f"model.text.num_layers={max(1, text.num_layers // 2)}",
            f"model.text.num_heads={max(1, text.num_heads // 2)}",
            f"model.text.intermediate_size={text.intermediate_size // 2}",
            f"model.vision.width_coefficient={vision.width_coefficient / 2:g}",
            f"model.vision.depth_coefficient={vision.depth_coefficient / 2:g}")


def variants(base: Config) -> list[Variant]:
    if not base.data.train and base.data.corpus != "emoji":
        raise ConfigError("the model-vs-data study samples the built-in emoji corpus or your shards: use "
                          "data.corpus=emoji, or pass --data SHARDS and --eval-data HELDOUT")
    plan = []
    for size, group, model in (("large", "base model", ()), ("small", "smaller model", smaller(base))):
        for key, label, options in DATA:
            if base.data.train:  # the user's shards: a fixed sample of them (data.fraction); nothing to clean
                if "noise" in options:
                    continue
                data = tuple(f"data.{k}={v}" for k, v in options.items())
            else:
                data = (corpus_override(base, **options),) if options else ()
            plan.append(Variant(f"{size}_{key.rstrip('%')}", group, model + data, f"{group}, {label}",
                                baseline=key == "full", paper=dict(zip(PAPER_COLUMNS, TABLE_9[size, key]))))
    return plan


def extra_report(results: dict, out) -> list[str]:
    """Held-out mean recall of both sizes on each corpus, side by side with the paper's MSCOCO I2T R@1
    (model_vs_data.png), and whether the larger model's gain from the full data exceeds the smaller's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [row for row in DATA if all(f"{size}_{row[0].rstrip('%')}" in results for size in ("large", "small"))]
    keys = [key.rstrip("%") for key, _, _ in data]
    if keys[:2] != ["full", "10"]:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for size, color in (("large", "tab:blue"), ("small", "tab:orange")):
        rows = [results[f"{size}_{k}"] for k in keys]
        axes[0].errorbar(range(len(keys)), [r["mean"]["mean_recall"] for r in rows],
                         yerr=[r["std"]["mean_recall"] for r in rows], marker="o", color=color, capsize=3,
                         label=rows[0]["group"])
        axes[1].plot(range(len(DATA)), [TABLE_9[size, key][0] for key, _, _ in DATA], marker="o", color=color,
                     label="B7 + BERT-base" if size == "large" else "B3 + BERT-mini")
    axes[0].set(title="openalign (held-out split)", ylabel="held-out mean recall")
    axes[1].set(title="paper, Table 9", ylabel="MSCOCO I2T R@1 (%)")
    for ax, labels in ((axes[0], [label for _, label, _ in data]), (axes[1], ["ALIGN full", "ALIGN 10%", "CC-3M"])):
        ax.set_xticks(range(len(labels)), labels)
        ax.grid(alpha=0.3)
    save_figure(fig, out / "model_vs_data.png", axes)
    gain = {size: results[f"{size}_full"]["mean"]["mean_recall"] - results[f"{size}_10"]["mean"]["mean_recall"]
            for size in ("large", "small")}
    verdict = ("the larger model gains more from the full data than the smaller one" if gain["large"] > gain["small"]
               else "the larger model does not gain more from the full data than the smaller one")
    return ["## Model size against data size", "",
            f"Mean recall gained from 10% to all of the data: base model {gain['large']:+.3f}, smaller model "
            f"{gain['small']:+.3f}: {verdict} (paper, MSCOCO I2T R@1: +3.4 and +0.7).", "",
            "![model size against data size](model_vs_data.png)", ""]


STUDY = Study("model_data", variants, INTRO, PAPER, PAPER_COLUMNS, extra_report, tasks=("knn",))


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
