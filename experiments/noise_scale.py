"""`python -m experiments.noise_scale`: does more noisy data beat less clean data? (the paper's Table 10)

The built-in emoji corpus with its alt-text noise (wrong captions, file names, boilerplate, partial
keywords) off, against the same sources with noise at `NOISE` at 1x, 2x and 4x the clean size (each
emoji also as augmented views with independently noised texts: `data.corpus_options=copies=N`). Same
model and the same number of steps for every run; the held-out split (whole emoji families) is clean
and the same for all.

With `data.corpus=shapes` the larger corpora hold more *distinct* images (`per_combo` x N), the way
the paper's larger samples of web data do; the headline is then zero-shot top-1 over the 64
colour-shape pairs (the shapes' repeated captions make retrieval ties by construction).

With `--sources` (`data.corpus=emoji+openclipart+shapes`) "more data" is new sources, as the paper means it:
the clean 1x arm is emoji with its CLDR names as written; the noisy arms add openclipart's real clipart with its
noisy file-name titles (filtered by the paper's rules as the corpus is built: ~2x) and then shapes with `NOISE` of
its captions replaced (sized so that the three hold 4x the clean pairs). Every arm is evaluated on the same fixed
held-out split of each source (metrics `emoji/...`, `openclipart/...`, `shapes/...`) and on their union (the
headline), so domain coverage and scale can be told apart.
"""

from __future__ import annotations

import sys

from openalign.config import Config, ConfigError
from openalign.corpora import corpus_options
from openalign.eval import paper as paper_lib
from experiments.lab import command
from experiments.lab.report import save_figure
from experiments.lab.runner import Study, Variant, corpus_override

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


SOURCES = ("emoji", "openclipart", "shapes")
SOURCE_PAIRS = {"emoji": 3_179, "openclipart": 2_793}  # training pairs of the default builds (their manifests)
SEEN_COMBOS = 56  # shapes: the colour-shape pairs trained on (corpora/shapes.py)


def source_variants(base: Config) -> list[Variant]:
    """Clean emoji alone, then noisy sources added: 2x (+ openclipart), 4x (+ shapes); one evaluation for all."""
    paper = {name: paper_lib.row_values(10, row) for name, row in TABLE_10.items()}
    per_combo = max(1, (4 * SOURCE_PAIRS["emoji"] - sum(SOURCE_PAIRS.values())) // SEEN_COMBOS)
    given = dict(item.partition("=")[::2] for item in base.data.corpus_options)  # NAME.key=value: the base's own
    merged = {"shapes.per_combo": str(per_combo)} | given | {"emoji.noise": "0", "shapes.noise": str(NOISE)}
    options = "data.corpus_options=" + ",".join(f"{k}={v}" for k, v in merged.items())
    every = ("data.eval_corpus=" + "+".join(SOURCES), options)
    return [Variant("clean_x1", "baseline", ("data.corpus=emoji", *every), "clean emoji, 1x", baseline=True,
                    paper=paper["clean_x1"]),
            Variant("noisy_x2", "corpus size", ("data.corpus=emoji+openclipart", *every),
                    "emoji + openclipart (noisy titles), ~2x", paper=paper["noisy_x2"]),
            Variant("noisy_x4", "corpus size", ("data.corpus=emoji+openclipart+shapes", *every),
                    f"+ shapes ({NOISE:.0%} noisy), 4x", paper=paper["noisy_x4"])]


def variants(base: Config) -> list[Variant]:
    if base.data.corpus == "+".join(SOURCES) and not base.data.train:
        return source_variants(base)
    if base.data.corpus not in ("emoji", "shapes") or base.data.train:
        raise ConfigError("the noise-vs-scale study varies a built-in corpus: use data.corpus=emoji (the default) "
                          "or data.corpus=shapes, and no --data")
    paper = {name: paper_lib.row_values(10, row) for name, row in TABLE_10.items()}
    if base.data.corpus == "emoji":  # more augmented views of the same emoji
        scaled = {n: (corpus_override(base, noise=NOISE, copies=n),) for n in SIZES}
        clean = (corpus_override(base, noise=0.0),)
    else:  # more distinct drawings of every colour-shape pair
        from experiments.compositional import SHAPES_EVAL

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
    if clean is not None and "emoji/mean_recall" in clean["mean"]:  # --sources
        return source_report(results, out)
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


def source_report(results: dict, out) -> list[str]:
    """--sources: held-out mean recall of each arm on each source's split and on their union, as multiples of
    chance (noise_vs_sources.png), and whether the noisy arms catch up with the clean one on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [name for name in ("clean_x1", "noisy_x2", "noisy_x4") if name in results]
    splits = [("union", "mean_recall")] + [(s, f"{s}/mean_recall") for s in SOURCES]
    splits = [(label, key) for label, key in splits if key in results[arms[0]]["mean"]]

    def value(arm: str, key: str) -> tuple[float, float]:
        row = results[arm]
        chance = row["runs"][0].get(key.replace("mean_recall", "chance_mean_recall"))
        scale = 1 / chance if chance else 1.0
        return row["mean"][key] * scale, row["std"][key] * scale

    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        values = [value(arm, key) for _, key in splits]
        ax.bar([j + i * width for j in range(len(splits))], [v for v, _ in values], width,
               yerr=[e for _, e in values], label=results[arm]["label"], capsize=3)
    ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(splits))], [label for label, _ in splits])
    ax.set(ylabel="held-out mean recall (x chance)", title="clean 1x against noisy sources added")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, out / "noise_vs_sources.png", [ax])
    lines = ["## Clean data against noisy sources added", "",
             "More data as new sources (`--sources`): emoji with its CLDR names alone (clean, 1x), then openclipart's "
             "clipart with its file-name titles added (~2x), then shapes with half its captions noisy (4x), at the "
             "same steps. Held-out mean recall on each source's own split and on their union (the headline), mean ± "
             "std over seeds, (x chance):", "",
             "| held-out split | " + " | ".join(results[a]["label"] for a in arms) + " |",
             "|---|" + "---|" * len(arms)]
    for label, key in splits:
        lines.append(f"| {label} | " + " | ".join(f"{results[a]['mean'][key]:.3f} ± {results[a]['std'][key]:.3f} "
                                                  f"({value(a, key)[0]:.1f}x)" for a in arms) + " |")
    verdicts = []
    for label, key in splits:
        clean = results["clean_x1"]["mean"][key]
        caught = [a for a in arms[1:] if results[a]["mean"][key] >= clean]
        verdicts.append(f"{label}: " + (f"the noisy arm {results[caught[0]]['label']} reaches the clean one "
                                        f"({results[caught[0]]['mean'][key]:.3f} against {clean:.3f})" if caught else
                                        f"no noisy arm reaches the clean one ({clean:.3f})"))
    return lines + ["", *[f"- {v}" for v in verdicts], "", "![mean recall by source](noise_vs_sources.png)", ""]


STUDY = Study("noise_scale", variants, INTRO, PAPER, PAPER_COLUMNS, extra_report, metric=headline, tasks=("knn",))


def source_flags(p) -> None:
    p.add_argument("--sources", action="store_true", help="more data as new sources (clean emoji against emoji + "
                   "openclipart + shapes with noisy alt-texts), each source's held-out split measured")


def sources(args) -> tuple[str, ...]:
    return ("data.corpus=" + "+".join(SOURCES),) if args.sources else ()


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv, flags=source_flags, extra=sources)


if __name__ == "__main__":
    sys.exit(main())
