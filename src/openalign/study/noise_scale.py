"""`openalign study noise-vs-scale`: does more noisy data beat less clean data? (the paper's Table 10)

The built-in emoji corpus with its alt-text noise (wrong captions, file names, boilerplate, partial
keywords) off, against the same sources with noise at `NOISE` at 1x, 2x and 4x the clean size (each
emoji also as augmented views with independently noised texts: `data.corpus_options=copies=N`). Same
model and the same number of steps for every run; the held-out split (whole emoji families) is clean
and the same for all.

With `data.corpus=shapes` the larger corpora hold more *distinct* images (`per_combo` x N), the way
the paper's larger samples of web data do; the headline is then zero-shot top-1 over the 64
colour-shape pairs (the shapes' repeated captions make retrieval ties by construction).
"""

from __future__ import annotations

from openalign.config import Config, ConfigError
from openalign.corpora import corpus_options
from openalign.eval import paper as paper_lib
from openalign.study.report import save_figure
from openalign.study.runner import Study, Variant, corpus_override

NOISE = 0.5  # the noisy corpora's rate: half the alt-texts replaced by one of the four kinds of noise
SIZES = (1, 2, 4)
INTRO = (f"Clean alt-texts at 1x against {NOISE:.0%} noisy alt-texts at 1x, 2x and 4x the size (the paper's "
         "Table 10: noisy data at 4x the size of CC-3M beat it), at an equal training budget.")
PAPER = ("Jia et al. 2021, Table 10: EfficientNet-B7 + BERT-base on clean CC-3M against 3M, 6M and 12M pairs sampled "
         "from the noisy ALIGN data; zero-shot MSCOCO R@1 and ImageNet KNN R@1, in %.")
PAPER_COLUMNS = ("MSCOCO I2T R@1", "MSCOCO T2I R@1", "ImageNet KNN R@1")
# our variants -> the paper's rows of Table 10 (eval/paper_tables.csv)
TABLE_10 = {"clean_x1": "CC-3M data", "noisy_x1": "ALIGN 3M data", "noisy_x2": "ALIGN 6M data",
            "noisy_x4": "ALIGN 12M data"}


def variants(base: Config) -> list[Variant]:
    if base.data.corpus not in ("emoji", "shapes") or base.data.train:
        raise ConfigError("the noise-vs-scale study varies a built-in corpus: use data.corpus=emoji (the default) "
                          "or data.corpus=shapes, and no --data")
    paper = {name: paper_lib.row_values(10, row) for name, row in TABLE_10.items()}
    if base.data.corpus == "emoji":  # more augmented views of the same emoji
        scaled = {n: (corpus_override(base, noise=NOISE, copies=n),) for n in SIZES}
        clean = (corpus_override(base, noise=0.0),)
    else:  # more distinct drawings of every colour-shape pair
        from openalign.study.compositional import SHAPES_EVAL

        per_combo = corpus_options("shapes", base.data.corpus_options).get("per_combo", 60)
        scaled = {n: (corpus_override(base, noise=NOISE, per_combo=per_combo * n), *SHAPES_EVAL) for n in SIZES}
        clean = (corpus_override(base, noise=0.0), *SHAPES_EVAL)
    plan = [Variant("clean_x1", "baseline", clean, "clean, 1x", baseline=True, paper=paper["clean_x1"])]
    plan += [Variant(f"noisy_x{n}", "corpus size", scaled[n], f"{NOISE:.0%} noise, {n}x", paper=paper[f"noisy_x{n}"])
             for n in SIZES]
    return plan


def headline(base: Config) -> tuple[str, str]:
    return ("zeroshot_top1", "zero-shot top-1") if base.data.corpus == "shapes" else ("mean_recall", "mean recall")


def extra_report(results: dict, out) -> list[str]:
    """The metric against corpus size with the clean result as a line (noise_vs_scale.png), and where the
    noisy corpus catches up with the clean one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clean = results.get("clean_x1")
    sizes = [n for n in SIZES if f"noisy_x{n}" in results]
    if "clean_x1" not in results or not sizes:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for key, label, color in (("mean_recall", "mean recall", "tab:blue"), ("zeroshot_top1", "zero-shot top-1",
                                                                           "tab:green")):
        if key not in clean["mean"]:
            continue
        means = [results[f"noisy_x{n}"]["mean"][key] for n in sizes]
        stds = [results[f"noisy_x{n}"]["std"][key] for n in sizes]
        ax.errorbar(sizes, means, yerr=stds if any(stds) else None, marker="o", color=color,
                    label=f"{NOISE:.0%} noisy: {label}")
        ax.axhline(clean["mean"][key], color=color, ls="--", label=f"clean 1x: {label}")
    ax.set(xscale="log", xticks=sizes, xlabel="corpus size (x the clean corpus)", ylabel="held-out metric",
           title="noisy data at scale vs clean data")
    ax.set_xticklabels([f"{n}x" for n in sizes])
    ax.minorticks_off()  # (a log axis labels its minor ticks, 3 x 10^0, otherwise)
    ax.grid(alpha=0.3)
    save_figure(fig, out / "noise_vs_scale.png", [ax])
    key, label = ("mean_recall", "mean recall") if "mean_recall" in clean["mean"] else ("zeroshot_top1",
                                                                                         "zero-shot top-1")
    target = clean["mean"][key]
    caught = next((n for n in sizes if results[f"noisy_x{n}"]["mean"][key] >= target), None)
    verdict = (f"The noisy corpus reaches the clean corpus's {label} ({target:.3f}) at {caught}x its size."
               if caught else f"The noisy corpus does not reach the clean corpus's {label} ({target:.3f}) "
                              f"up to {sizes[-1]}x its size.")
    return ["## Noisy data against corpus size", "", verdict, "", "![metric against corpus size](noise_vs_scale.png)",
            ""]


STUDY = Study(variants, INTRO, PAPER, PAPER_COLUMNS, extra_report, metric=headline, tasks=("knn",))
