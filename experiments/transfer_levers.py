"""`python -m experiments.transfer_levers`: what buys transfer to a source never trained on?

One source (or several, `--left-out tuxpaint+icons`) is left out of training; every run trains on the rest and is
evaluated on every source's held-out split, so each lever is read on what it does where it matters: the left-out
sources' R@10 both ways and zero-shot top-1 over their categories, as multiples of chance, beside the minutes the
run took (a preset has an hour: a lever that costs time must buy more than the steps that time would give).

The levers, each changed alone from the baseline (the base preset on the other sources):
- sources: the clipart preset's two (openclipart + emoji) instead of every other source; and one source more,
  the same concepts in other styles: letters (each character in eight faces), symbola (the emoji's names with
  Symbola's line drawings) or gcompris (photographs), and the three together;
- augmentation: Szegedy et al.'s random-resized crop (`data.crop=inception`) with the smallest area share at 0.08
  (theirs) and at 0.35;
- resolution: 1.5x the image side;
- text tower: two layers more and 1.5x the width;
- captions: each training text in a sentence template half of the time ("a {}.", "a picture of {}.": the built-in
  sources' texts are names, a left-out source's may be sentences);
- vocabulary: twice the WordPiece vocabulary (the demo's 8,000 is full on five sources, so a rare word of a
  left-out caption, "gorilla" or "hibiscus", is split into pieces even where an emoji's name taught it whole);
- steps: twice as many.
"""

from __future__ import annotations

import sys

from openalign.config import Config, ConfigError
from openalign.corpora import sources
from experiments.lab import command
from experiments.lab.report import grouped_bars, mean_std, save_figure
from experiments.lab.runner import Study, Variant
from experiments import transfer
from experiments.transfer import METRICS, multiple

INTRO = ("Each lever changed alone from a baseline trained without the left-out source(s), read on the left-out "
         "sources' held-out splits as multiples of chance, beside each run's minutes.")
FEWER = ("openclipart", "emoji")  # the clipart preset's sources
MORE = {"letters": "+ letters (8 faces)", "symbola": "+ symbola (the emoji as line art)",
        "gcompris": "+ gcompris (photographs)"}  # a source more, each
# Every built-in source's texts are names or titles ("duck", "latin capital letter y"), a left-out source's may be
# sentences ("A duck.", "The letter Y."): each training text as it is half of the time, else in a sentence
SENTENCES = ("{}", "{}", "{}", "{}", "a {}.", "the {}.", "a picture of {}.", "a drawing of the {}.")


def variants(base: Config) -> list[Variant]:
    trained = sources(base.data.corpus) if base.data.corpus else []
    evaluated = sources(base.data.eval_corpus) if base.data.eval_corpus else []
    if base.data.train or not trained or not set(evaluated) - set(trained):
        raise ConfigError("the transfer levers study leaves built-in sources out of training: give them as "
                          "--sources emoji+openclipart+... --left-out NAME (not --data)")
    v, t = base.model.vision, base.model.text
    side = round(v.image_size * 1.5)
    plan = [Variant("baseline", "baseline", (), f"baseline: {len(trained)} sources", baseline=True)]
    if set(FEWER) < set(trained):
        plan.append(Variant("fewer_sources", "sources", (f"data.corpus={'+'.join(FEWER)}",),
                            f"{' + '.join(FEWER)} alone"))
    more = [name for name in MORE if name not in trained + evaluated]
    for name in more:
        plan.append(Variant(name, "sources", (f"data.corpus={'+'.join(trained + [name])}",), MORE[name]))
    if len(more) > 1:
        plan.append(Variant("all_more", "sources", (f"data.corpus={'+'.join(trained + more)}",),
                            f"+ {', '.join(more[:-1])} and {more[-1]}"))
    plan += [Variant("inception", "augmentation", ("data.crop=inception",), "random-resized crop (area >= 0.08)"),
             Variant("inception35", "augmentation", ("data.crop=inception", "data.crop_min_area=0.35"),
                     "random-resized crop (area >= 0.35)"),
             Variant(f"px{side}", "resolution",
                     (f"model.vision.image_size={side}",
                      f"model.vision.resize_size={round(v.resize_size * side / v.image_size)}"),
                     f"{side} px images"),
             Variant("text_tower", "text tower", _wider_text(t), f"text tower {t.num_layers + 2} x "
                                                                 f"{_width(t.hidden_size, t.num_heads)}"),
             Variant("vocab2x", "vocabulary", (f"model.text.vocab_size={2 * t.vocab_size}",),
                     f"{2 * t.vocab_size:,} word pieces"),
             Variant("sentences", "captions", (f"data.text_templates={','.join(SENTENCES)}",),
                     "texts in sentence templates half of the time"),
             Variant("steps2x", "steps", (f"train.steps={2 * base.train.steps}",), f"{2 * base.train.steps} steps")]
    return plan


def _width(hidden: int, heads: int) -> int:
    """1.5x `hidden`, rounded to a multiple of the heads' count times 8 (each head's width a multiple of 8)."""
    step = heads * 8
    return max(step, round(hidden * 1.5 / step) * step)


def _wider_text(t) -> tuple[str, ...]:
    width = _width(t.hidden_size, t.num_heads)
    return (f"model.text.num_layers={t.num_layers + 2}", f"model.text.hidden_size={width}",
            f"model.text.intermediate_size={4 * width}")


def _data(out, variant: str) -> dict | None:
    """The data section of a variant's first run's config.json (None before it ran)."""
    import json

    runs = sorted((out / "runs" / variant).glob("seed*/config.json"))
    return json.loads(runs[0].read_text())["data"] if runs else None


def trained_sources(out, variant: str = "baseline") -> list[str]:
    """The sources a variant's runs trained on."""
    data = _data(out, variant)
    return sources(data["corpus"]) if data else []


def left_out(out) -> list[str]:
    """The sources the baseline was evaluated on but not trained on."""
    data = _data(out, "baseline")
    if not data:
        return []
    trained = set(sources(data["corpus"]))
    return [s for s in sources(data["eval_corpus"] or data["corpus"]) if s not in trained]


def _weaker(row: dict, names: list[str]) -> float | None:
    """The weaker R@10 direction's multiple of chance, averaged over `names` (those the row has)."""
    pairs = [(multiple(row, n, "i2t_r10"), multiple(row, n, "t2i_r10")) for n in names]
    weaker = [min(a[0], b[0]) for a, b in pairs if a and b]
    return sum(weaker) / len(weaker) if weaker else None


def table(results: dict, names: list[str], out) -> list[dict]:
    """One row per variant: each left-out source's figures (multiples of chance), the weaker R@10 direction's mean
    over them, the same over the sources the variant trained on (from `out`'s runs: the in-source contrast), and
    the run's minutes."""
    rows = []
    for variant, row in results.items():
        figures = {name: {key: multiple(row, name, key) for key, _ in METRICS} for name in names}
        own = [n for n in trained_sources(out, variant) if n not in names]
        rows.append({"variant": variant, "label": row["label"], "seeds": len(row["runs"]), "figures": figures,
                     "weaker": _weaker(row, names), "in_source": _weaker(row, own), "trained": own,
                     "minutes": row["mean"].get("minutes")})
    return rows


def extra_report(results: dict, out) -> list[str]:
    """The levers' table on the left-out sources, the best lever named, and levers.png."""
    names = left_out(out) if "baseline" in results else []
    rows = table(results, names, out) if names else []
    if not rows:
        return []
    seeds = rows[0]["seeds"]

    def cell(pair) -> str:
        return "—" if pair is None else mean_std(pair[0], pair[1], seeds, ".1f") + "x"

    head = ["lever", *(f"{name} {label}" for name in names for _, label in METRICS),
            "in source: weaker R@10, mean over the trained sources", "minutes a run"]
    lines = ["## Levers on the left-out sources", "",
             f"Trained without {' and '.join(names)}; multiples of chance on the left-out held-out split"
             f"{'s' if len(names) > 1 else ''}, "
             f"{'mean ± std over ' + str(seeds) + ' seeds' if seeds > 1 else '1 seed'}.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        minutes = f"{row['minutes']:.1f}" if row["minutes"] is not None else "—"
        own = f"{row['in_source']:.1f}x" if row["in_source"] is not None else "—"
        lines.append("| " + " | ".join([row["label"], *(cell(row["figures"][n][k]) for n in names for k, _ in METRICS),
                                        own, minutes]) + " |")
    base = next(r for r in rows if r["variant"] == "baseline")
    others = [r for r in rows if r["variant"] != "baseline" and r["weaker"] is not None]
    if base["weaker"] and others:
        best = max(others, key=lambda r: r["weaker"])
        lines += ["", f"In the weaker R@10 direction, averaged over the left-out sources, the baseline reads "
                  f"{base['weaker']:.1f}x chance; the best lever is {best['label']} at {best['weaker']:.1f}x "
                  f"({best['weaker'] / base['weaker']:.2f}x the baseline"
                  + (f", at {best['minutes'] / base['minutes']:.2f}x its minutes)." if best["minutes"] and
                     base["minutes"] else ").")]
    if base["weaker"] and base["in_source"]:
        same = [r for r in others if r["in_source"] and r["trained"] == base["trained"]]  # comparable in source
        most = max(same, key=lambda r: r["in_source"], default=None)
        if most:  # does what buys recall in source buy it where it was never trained?
            lines += ["", f"In source the baseline reads {base['in_source']:.1f}x; the lever that buys most there is "
                      f"{most['label']} ({most['in_source'] / base['in_source']:.2f}x the baseline), which on the "
                      f"left-out sources gives {most['weaker'] / base['weaker']:.2f}x the baseline."]
    _plot(rows, names, out / "levers.png")
    return lines + ["", "![each lever on the left-out sources](levers.png)", ""]


def _plot(rows: list[dict], names: list[str], path) -> None:
    """The left-out figures per lever, one panel a metric, and the in-source contrast in a last panel."""
    import matplotlib.pyplot as plt

    labels = [row["label"] for row in rows]
    fig, axes = plt.subplots(1, len(METRICS) + 1, figsize=(5 * (len(METRICS) + 1), 4))
    for ax, (key, label) in zip(axes, METRICS):
        series = []
        for name in names:
            pairs = [row["figures"][name][key] or (0.0, 0.0) for row in rows]
            series.append((name, [p[0] for p in pairs], [p[1] for p in pairs]))
        grouped_bars(ax, series, labels, rotation=30, ha="right", fontsize=7)
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.set(title=f"left out: {label}", ylabel="multiple of chance")
    contrast = [("in source", [row["in_source"] or 0.0 for row in rows], [0.0] * len(rows)),
                ("left out", [row["weaker"] or 0.0 for row in rows], [0.0] * len(rows))]
    grouped_bars(axes[-1], contrast, labels, rotation=30, ha="right", fontsize=7)
    axes[-1].axhline(1.0, color="gray", ls=":", lw=1)
    axes[-1].set(title="weaker R@10 direction: in source vs left out", ylabel="multiple of chance")
    save_figure(fig, path, legend_axes=[axes[0], axes[-1]])


STUDY = Study("transfer_levers", variants, INTRO, extra_report=extra_report, tasks=("retrieval", "zeroshot"),
              metric=("mean_recall", "mean recall (every source's held-out split)"))


def flags(p) -> None:
    transfer.flags(p)
    p.add_argument("--left-out", default="tuxpaint", help="the source(s) left out of training, joined by + "
                                                          "(default: tuxpaint)")


def extra(args) -> tuple[str, ...]:
    names, left = sources(args.sources), sources(args.left_out)
    if any(n not in names for n in left) or len(left) >= len(names):
        raise ConfigError(f"--left-out {args.left_out} must name some, not all, of --sources {args.sources}")
    trained = [n for n in names if n not in left]
    return (f"data.corpus={'+'.join(trained)}", f"data.eval_corpus={'+'.join(names)}",
            *transfer.shared(names, args.quick))


def main(argv: list[str] | None = None) -> int:
    return command.main(STUDY, argv, flags, extra)


if __name__ == "__main__":
    sys.exit(main())
