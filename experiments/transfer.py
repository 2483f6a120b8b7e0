"""`python -m experiments.transfer`: does a model work on a source it never saw? (leave one source out)

A held-out split of a training source shares the source's drawing style, its photographers, its way of writing
alt-texts: recall on it overstates what a model does on images from anywhere else. Here each built-in source is
left out of training in turn and the model is evaluated on it (its held-out split, so the images are the same as in
the in-source figure), beside a model trained on every source, which gives the in-source figures. Both are read as
multiples of chance, per source: retrieval R@10 both ways, and zero-shot top-1 over the source's categories (its
shards' labels: openclipart's top-level categories, Tux Paint's stamp categories, the icons' contexts, the symbols'
Unicode blocks, the shapes' colour-shape pairs and emoji names).

Every run is deduplicated against the held-out splits of every source (`data.dedup_heldout`), and each trains its
own tokenizer on its own training texts, so a left-out source's words are as new to it as its images.
"""

from __future__ import annotations

import sys

from openalign.config import Config, ConfigError
from openalign.corpora import sources
from experiments.lab import command
from experiments.lab.report import grouped_bars, mean_std, save_figure
from experiments.lab.runner import Study, Variant

SOURCES = ("emoji", "openclipart", "shapes", "tuxpaint", "icons", "symbols")
# the budget of a full run: the clipart preset's ablations' 600 steps (docs/demo.md), with one evaluation at the end
BUDGET = ("train.steps=600", "train.eval_every=0", "train.checkpoint_every=0")
METRICS = (("i2t_r10", "R@10 image→text"), ("t2i_r10", "R@10 text→image"), ("zeroshot_top1", "zero-shot top-1"))
INTRO = ("Each built-in source left out of training in turn and evaluated on its held-out split, beside a model "
         "trained on every source (the in-source figures): R@10 both ways and zero-shot top-1 over the source's "
         "categories, as multiples of chance.")


def without(name: str) -> str:
    return f"without_{name}"


def variants(base: Config) -> list[Variant]:
    names = sources(base.data.corpus) if base.data.corpus else []
    if base.data.train or len(names) < 2:
        raise ConfigError("the transfer study leaves built-in sources out in turn: give two or more as "
                          "--sources emoji+openclipart+... (not --data)")
    every = "+".join(names)
    plan = [Variant("all", "leave one source out", (f"data.eval_corpus={every}",), "every source", baseline=True)]
    for name in names:
        rest = "+".join(n for n in names if n != name)
        plan.append(Variant(without(name), "leave one source out", (f"data.corpus={rest}", f"data.eval_corpus={every}"),
                            f"without {name}"))
    return plan


def multiple(row: dict, source: str, key: str) -> tuple[float, float] | None:
    """A run group's metric on `source` as a multiple of its chance level (mean, std over seeds); None if absent."""
    value, chance = f"{source}/{key}", row["chance"].get(f"{source}/{key}")
    if value not in row["mean"] or not chance:
        return None
    return row["mean"][value] / chance, row["std"][value] / chance


def table(results: dict) -> list[dict]:
    """One row per source: its in-source and left-out figures (multiples of chance) and the run groups they come
    from."""
    rows = []
    for name in [n.removeprefix("without_") for n in results if n.startswith("without_")]:
        inside, outside = results.get("all"), results[without(name)]
        row = {"source": name, "seeds": len(outside["runs"])}
        for key, _ in METRICS:
            row[key] = (multiple(inside, name, key) if inside else None, multiple(outside, name, key))
        rows.append(row)
    return rows


def extra_report(results: dict, out) -> list[str]:
    """The leave-one-source-out table and its plot (transfer.png), with the weakest transfer named."""
    rows = table(results)
    if not rows:
        return []
    seeds = rows[0]["seeds"]

    def cell(pair) -> str:
        return "—" if pair is None else mean_std(pair[0], pair[1], seeds, ".1f") + "x"

    head = ["source", *(f"{label}: in-source" for _, label in METRICS), *(f"{label}: left out" for _, label in METRICS)]
    lines = ["## Leave one source out", "",
             "Multiples of chance on each source's held-out split: trained on every source (in-source) and trained "
             f"on all the others (left out); {'mean ± std over ' + str(seeds) + ' seeds' if seeds > 1 else '1 seed'}.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join([row["source"], *(cell(row[k][0]) for k, _ in METRICS),
                                        *(cell(row[k][1]) for k, _ in METRICS)]) + " |")
    scored = [(min(row[k][1][0] for k in ("i2t_r10", "t2i_r10")), row["source"]) for row in rows
              if all(row[k][1] for k in ("i2t_r10", "t2i_r10"))]
    if scored:
        worst, name = min(scored)
        ratios = [row["i2t_r10"][0][0] / row["i2t_r10"][1][0] for row in rows
                  if row["i2t_r10"][0] and row["i2t_r10"][1] and row["i2t_r10"][1][0] > 0]
        lines += ["", f"The weakest transfer is to {name}: {worst:.1f}x chance R@10 in its weaker direction when left "
                  "out" + (f"; over the sources, the in-source R@10 image→text is {min(ratios):.1f}x to "
                           f"{max(ratios):.1f}x the left-out one." if ratios else ".")]
    _plot(rows, out / "transfer.png")
    return lines + ["", "![in-source against left-out, per source](transfer.png)", ""]


def _plot(rows: list[dict], path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
    for ax, (key, label) in zip(axes, METRICS):
        series = []
        for i, what in enumerate(("in-source", "left out")):
            pairs = [row[key][i] or (0.0, 0.0) for row in rows]
            series.append((what, [p[0] for p in pairs], [p[1] for p in pairs]))
        grouped_bars(ax, series, [row["source"] for row in rows], rotation=30, ha="right")
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.set(title=label, ylabel="multiple of chance", yscale="log")
    save_figure(fig, path, legend_axes=[axes[0]])


STUDY = Study("transfer", variants, INTRO, extra_report=extra_report, tasks=("retrieval", "zeroshot"),
              metric=("mean_recall", "mean recall (every source's held-out split)"))


def flags(p) -> None:
    p.add_argument("--sources", default="+".join(SOURCES),
                   help=f"the built-in sources, joined by + (default: {'+'.join(SOURCES)})")


def shared(names: list[str], quick: bool) -> tuple[str, ...]:
    """The overrides every run over several sources takes: openclipart's 96 px rule, the held-out deduplication and
    the full runs' budget."""
    own = ("data.corpus_options=openclipart.min_short_side=96",) if "openclipart" in names and len(names) > 1 else ()
    return (*own, "data.dedup_heldout=true", *(() if quick else BUDGET))


def extra(args) -> tuple[str, ...]:
    names = sources(args.sources)
    return (f"data.corpus={'+'.join(names)}", *shared(names, args.quick))


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv, flags, extra)


if __name__ == "__main__":
    sys.exit(main())
