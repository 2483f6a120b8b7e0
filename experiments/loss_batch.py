"""`python -m experiments.loss_batch`: SigLIP's sigmoid loss against the paper's softmax over batch sizes.

The same model and data for every run, and the same number of training examples seen: batch 32 to 512, the steps
(and the warmup) scaled so that steps x batch is the base's. The claim tested, from the SigLIP paper (Zhai et al.
2023): the sigmoid loss is ahead at small batches, and the two meet at large ones (the softmax needs many
negatives in its normalisation; the sigmoid scores each pair on its own).

The sigmoid runs start from SigLIP's initialisation: the logits' scale at 10 (`loss.temperature.init=0.1`, over the
demo preset's 0.07), learned as log(1/T) as SigLIP learns it (the sigmoid's own parameterization), and the bias at
-10; the softmax from the base's.
"""

from __future__ import annotations

import sys

from openalign.config import Config
from experiments.lab import command
from experiments.lab.report import save_figure
from experiments.lab.runner import Study, Variant

BATCHES = (32, 64, 128, 256, 512)
LOSSES = (("softmax", "softmax (the paper's)", ()),
          ("sigmoid", "sigmoid (SigLIP)", ("loss.kind=sigmoid", "loss.label_smoothing=0", "loss.temperature.init=0.1")))
INTRO = ("The paper's softmax loss against SigLIP's sigmoid loss at batch sizes 32 to 512, each run seeing the same "
         "number of training examples (the steps scaled to the batch). SigLIP's claim: the sigmoid is ahead at small "
         "batches and the two meet at large ones.")


def budget(base: Config) -> int:
    """Training examples every run sees: the base's steps x its batch."""
    return base.train.steps * base.data.global_batch


def variants(base: Config) -> list[Variant]:
    examples, plan = budget(base), []
    for kind, label, overrides in LOSSES:
        for batch in BATCHES:
            steps = max(1, examples // batch)
            warmup = min(steps, round(base.optim.warmup_steps * base.data.global_batch / batch))
            plan.append(Variant(f"{kind}_b{batch}", label, (f"data.global_batch={batch}", f"train.steps={steps}",
                                                            f"optim.warmup_steps={warmup}", *overrides),
                                f"{label}, batch {batch}", baseline=batch == 128))
    return plan


def extra_report(results: dict, out) -> list[str]:
    """Held-out mean recall against the batch for both losses (loss_batch.png), and where the sigmoid leads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {(kind, b): results[f"{kind}_b{b}"] for kind, _, _ in LOSSES for b in BATCHES
            if f"{kind}_b{b}" in results}
    batches = [b for b in BATCHES if all((kind, b) in rows for kind, _, _ in LOSSES)]
    if not batches:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for (kind, label, _), color in zip(LOSSES, ("tab:blue", "tab:orange")):
        ax.errorbar(batches, [rows[kind, b]["mean"]["mean_recall"] for b in batches],
                    yerr=[rows[kind, b]["std"]["mean_recall"] for b in batches], marker="o", capsize=3, color=color,
                    label=label)
    ax.set(xscale="log", xticks=batches, xlabel="batch (pairs), equal examples seen", ylabel="held-out mean recall",
           title="softmax against sigmoid over batch sizes")
    ax.set_xticklabels([str(b) for b in batches])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    save_figure(fig, out / "loss_batch.png", [ax])
    lines = ["## Softmax against sigmoid over batch sizes", "",
             "| batch | softmax mean recall | sigmoid mean recall | sigmoid − softmax |", "|---|---|---|---|"]
    for b in batches:
        soft, sig = rows["softmax", b], rows["sigmoid", b]
        lines.append(f"| {b} | {soft['mean']['mean_recall']:.3f} ± {soft['std']['mean_recall']:.3f} | "
                     f"{sig['mean']['mean_recall']:.3f} ± {sig['std']['mean_recall']:.3f} | "
                     f"{sig['mean']['mean_recall'] - soft['mean']['mean_recall']:+.3f} |")
    return lines + ["", "![mean recall against batch](loss_batch.png)", ""]


STUDY = Study("loss_batch", variants, INTRO, extra_report=extra_report)


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
