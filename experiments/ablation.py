"""`python -m experiments.ablation`: the paper's Table 8 design choices, on one base config.

Groups (each against the same baseline run): embedding dimension (the base's, /2, /4, /8: the paper's
640/320/160/80 scaled to the base), the fraction of in-batch negatives (100/50/25%), a fixed
temperature (1/128, 1/64, 1/32) against the learned one, the temperature's initial value (the paper's
1.0 against CLIP's 0.07) and learning rate (x10), label smoothing on/off, the softmax loss against
SigLIP's sigmoid loss, and the softmax's row or column term alone (with the spread of per-query best
similarity thresholds: `threshold_report`).
"""

from __future__ import annotations

import sys

from openalign import loss as loss_lib
from openalign.config import Config
from openalign.eval import paper as paper_lib
from experiments.lab import command
from experiments.lab.report import mean_std
from experiments.lab.runner import Study, Variant

INTRO = ("The paper's Table 8 ablations (embedding dimension, in-batch negatives, temperature), plus the "
         "temperature's initial value and learning rate, label smoothing and the loss, each changed alone "
         "from one baseline.")
PAPER = ("Jia et al. 2021, Table 8: EfficientNet-B5 + BERT-base, embedding dimension 640, all in-batch negatives "
         "and a learned temperature as the baseline; zero-shot MSCOCO R@1 and ImageNet KNN R@1, in %. Our "
         "dimensions are the base's /2, /4, /8, as the paper's 320/160/80 are 640's.")
PAPER_COLUMNS = ("MSCOCO I2T R@1", "MSCOCO T2I R@1", "ImageNet KNN R@1")
# our variants -> the paper's rows of Table 8 (eval/paper_tables.csv)
TABLE_8 = {"baseline": "B5 + BERT-base", "dim/2": "w/ embedding dim=320", "dim/4": "w/ embedding dim=160",
           "dim/8": "w/ embedding dim=80", "negatives50": "w/ 50% in-batch negs", "negatives25": "w/ 25% in-batch negs",
           "fixed_t128": "w/ softmax temp=1/128", "fixed_t64": "w/ softmax temp=1/64",
           "fixed_t32": "w/ softmax temp=1/32"}


def _paper(key: str) -> dict:
    return paper_lib.row_values(8, TABLE_8[key]) if key in TABLE_8 else {}


def variants(base: Config) -> list[Variant]:
    dim = base.model.embed_dim
    start = loss_lib.kind_of(base.loss).initial_scalars(base.loss)["temperature"]  # init 0: the kind's own
    other_init = 1.0 if start != 1.0 else 0.07
    plan = [Variant("baseline", "baseline", (), f"baseline (dim {dim}, learned T)", baseline=True,
                    paper=_paper("baseline"))]
    plan += [Variant(f"dim{dim // f}", "embedding dimension", (f"model.embed_dim={dim // f}",), f"dim {dim // f}",
                     paper=_paper(f"dim/{f}")) for f in (2, 4, 8)]
    plan += [Variant(f"negatives{p}", "in-batch negatives", (f"loss.negatives_fraction={p / 100}",), f"{p}% negatives",
                     paper=_paper(f"negatives{p}")) for p in (50, 25)]
    plan += [Variant(f"fixed_t{d}", "temperature", (f"loss.temperature.fixed={1 / d!r}",), f"fixed T = 1/{d}",
                     paper=_paper(f"fixed_t{d}")) for d in (128, 64, 32)]
    plan += [Variant(f"t_init{other_init:g}", "temperature init and lr", (f"loss.temperature.init={other_init}",),
                     f"init T = {other_init:g}"),
             Variant("t_lr10", "temperature init and lr",
                     (f"loss.temperature.lr_scale={base.loss.temperature.lr_scale * 10:g}",), "T lr x10")]
    plan += [Variant("no_smoothing", "label smoothing", ("loss.label_smoothing=0.0",), "no label smoothing")]
    plan += [Variant("sigmoid", "loss", ("loss.kind=sigmoid", "loss.label_smoothing=0"), "sigmoid loss (SigLIP)")]
    plan += [Variant("rows_only", DIRECTION, ("loss.direction=image_to_text",), "row loss alone (image→text)"),
             Variant("columns_only", DIRECTION, ("loss.direction=text_to_image",), "column loss alone (text→image)")]
    return plan


DIRECTION = "loss direction"
THRESHOLDS = (("threshold_std", "best-threshold std"), ("threshold_iqr", "IQR"), ("youden_own", "J own"),
              ("youden_shared", "J shared"))


def threshold_report(results: dict, out) -> list[str]:
    """The loss-direction group's threshold spread: does one similarity threshold fit every query?"""
    rows = [(name, row) for name, row in results.items() if row["baseline"] or row["group"] == DIRECTION]
    if len(rows) < 2:
        return []
    head = ["variant", *(f"{d} {label}" for d in ("i2t", "t2i") for _, label in THRESHOLDS)]
    lines = ["## One threshold for every query?", "",
             "Per held-out query, the similarity threshold that best separates its matches from the rest "
             "(Youden's J); the spread of those thresholds across queries, and the mean J at each query's own "
             "threshold against one shared (median) threshold. The PMI view predicts the symmetric loss pins "
             "every score to one constant, so its spread should be the smallest (see `python -m experiments.pmi`).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, row in rows:
        cells = [mean_std(row["mean"][f"{d}_{k}"], row["std"][f"{d}_{k}"], len(row["runs"]))
                 if f"{d}_{k}" in row["mean"] else "—" for d in ("i2t", "t2i") for k, _ in THRESHOLDS]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


STUDY = Study("ablation", variants, INTRO, PAPER, PAPER_COLUMNS, extra_report=threshold_report, tasks=("knn",))


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
