"""`deeper-tower`: the composition toy's question with openalign's towers, on the built-in shapes corpus (8 of its
64 colour-shape pairs never trained on).

A shallower against a deeper EfficientNet (`model.vision.depth_coefficient`), each trained at the same budget and
recipe (`depth_overrides`: 1,000 steps at peak lr 2e-3 over 200 warmup steps; under the demo's 5e-3 over 50 the
deeper tower is still half-trained at 1,000 steps, and a trained model against an untrained one says nothing about
composition); zero-shot top-1 on the unseen pairs against the seen ones, and the final training loss.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tqdm import tqdm

from openalign import config as config_lib
from openalign import presets
from experiments.compositional import SHAPES_EVAL
from experiments.failure_modes.options import FailureOptions
from experiments.lab.report import mean_std_of, paired_bars, seeds_phrase
from experiments.lab.runner import run_one

NAME = "deeper-tower"
KEYS = ("compositional_unseen_top1", "compositional_seen_top1", "final_loss")


def run(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Shallower against deeper EfficientNets on the shapes corpus: unseen-pair and seen-pair zero-shot top-1."""
    rows: dict = {}
    jobs = [(depth, seed) for depth in options.depths for seed in range(seeds)]
    for depth, seed in tqdm(jobs, desc="deeper tower", unit="run", disable=not progress):
        cfg = config_lib.override(presets.get(options.scene_preset), [
            "data.corpus=shapes", *SHAPES_EVAL, f"model.vision.depth_coefficient={depth}",
            *options.scene_overrides, *options.depth_overrides])
        result = run_one(dataclasses.replace(cfg, seed=seed), out / "runs" / f"depth{depth:g}" / f"seed{seed}")
        rows.setdefault(f"{depth:g}", []).append(result)
    return {"depths": {depth: mean_std_of(runs, KEYS) | {"chance": runs[0].get("compositional_chance_unseen_top1")}
                       for depth, runs in rows.items()}}


def reading(result: dict) -> list[str]:
    """The toy's two halves on openalign's towers, the deepest EfficientNet against the shallowest: both must fit
    the seen pairs before the unseen ones say anything about composition."""
    rows = result["depths"]
    shallow, deep = (rows[k] for k in (min(rows, key=float), max(rows, key=float)))
    s, d = shallow["mean"], deep["mean"]
    spread = max(shallow["std"]["compositional_unseen_top1"], deep["std"]["compositional_unseen_top1"])
    trained = min(s["compositional_seen_top1"], d["compositional_seen_top1"]) >= 0.9
    gap = s["compositional_unseen_top1"] - d["compositional_unseen_top1"]
    fit = (f"Fit: the deeper tower reaches {d['compositional_seen_top1']:.1%} of the seen pairs against "
           f"{s['compositional_seen_top1']:.1%}, final training loss {d['final_loss']:.3f} against "
           f"{s['final_loss']:.3f}: ")
    if not trained:
        return [fit + "one of them has not fitted the seen pairs, so this budget compares a trained model with an "
                "untrained one and says nothing about composition yet."]
    return [fit + "both fit the seen pairs. " +
            f"Composition: the unseen pairs at {d['compositional_unseen_top1']:.1%} against "
            f"{s['compositional_unseen_top1']:.1%}: " +
            (f"the deeper tower composes worse, by more than the wider seed spread (± {spread:.1%})." if gap > spread
             else f"no difference outside the seeds' spread (± {spread:.1%}).")]


def section(result: dict, options: FailureOptions, seeds: int, out: Path) -> list[str]:
    rows = result["depths"]
    paired_bars(rows, (("compositional_unseen_top1", "unseen pairs"), ("compositional_seen_top1", "seen pairs")),
                [f"depth {d}" for d in rows], next(iter(rows.values()))["chance"], out / "deeper_tower.png",
                ylim=(0, 1.05), ylabel="zero-shot top-1 over the 64 pairs", title="composition by image-tower depth")
    recipe = f" changed by the deeper tower's recipe ({', '.join(options.depth_overrides)})" \
        if options.depth_overrides else ""
    lines = ["## Composition with openalign's towers: a shallower against a deeper EfficientNet on shapes", "",
             f"The `{options.scene_preset}` preset at depth coefficients {', '.join(f'{d:g}' for d in options.depths)}"
             f", trained on the shapes corpus at the scenes' budget ({', '.join(options.scene_overrides)}){recipe}; "
             f"zero-shot top-1 over the 64 pairs on fresh images; {seeds_phrase(seeds)}.", "",
             "| depth coefficient | unseen pairs top-1 | seen pairs top-1 | final training loss |", "|---|---|---|---|"]
    for depth, row in rows.items():
        lines.append(f"| {depth} | " + " | ".join(f"{row['mean'][k]:.3f} ± {row['std'][k]:.3f}" for k in KEYS) + " |")
    return lines + ["", *reading(result), "", "![unseen and seen pairs by depth](deeper_tower.png)", ""]
