"""`several-objects`: scenes of two or three shapes captioned by one of them.

Held out: for each scene, how many of the shapes it shows its top captions name (among the 56 single-shape
captions), and how the zero-shot probability splits between the shapes shown, by the softmax's scale: the teaching
says that at scale 100 a cosine gap of 0.16 becomes a logit gap of 16 and the probability goes almost all to one
class, although the image shows both.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from tqdm import tqdm

import openalign
from openalign.corpora import shapes
from openalign.model.encode import encode_images
from experiments.failure_modes.options import FailureOptions
from experiments.failure_modes.scenes import held_out_scenes, scene_model
from experiments.lab.report import seeds_phrase

NAME = "several-objects"


def run(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Objects shown against the top captions, and the softmax's split of probability between them by scale."""
    singles = [f"{c} {s}" for c in shapes.COLOURS for s in shapes.SHAPES if (c, s) not in shapes.heldout_combos()]
    runs = []
    for seed in tqdm(range(seeds), desc="several objects", unit="run", disable=not progress):
        model = openalign.load(scene_model(options, "objects", "softmax", seed, out / "runs"))
        scenes = held_out_scenes(model, "objects", options.scene_per_combo)
        images = torch.cat([encode_images(model.model, torch.stack([sc["pixels"] for sc in scenes[i:i + 64]]))
                            for i in range(0, len(scenes), 64)])
        prompts = model.encode_texts([f"a {name}" for name in singles])
        cosine = images @ prompts.T  # [n, 56]
        shown = [[singles.index(o) for o in sc["meta"]["objects"]] for sc in scenes]
        found = [len(set(cosine[i].topk(len(objs)).indices.tolist()) & set(objs)) / len(objs)
                 for i, objs in enumerate(shown)]
        temperature = model.model.temperature_and_bias()[0]
        split = {}
        for scale in [*options.scene_scales, round(1 / temperature, 1)]:
            p = torch.softmax(cosine * scale, dim=1)
            on_shown = [p[i, objs] for i, objs in enumerate(shown)]
            split[str(scale)] = {"top_share": statistics.fmean(float(v.max() / v.sum()) for v in on_shown),
                                 "shown_mass": statistics.fmean(float(v.sum()) for v in on_shown)}
        gaps = [float(cosine[i, objs].max() - cosine[i, objs].min()) for i, objs in enumerate(shown)]
        runs.append({"objects_found": statistics.fmean(found), "split": split, "learned_scale": 1 / temperature,
                     "cosine_gap": statistics.fmean(gaps), "scenes": len(scenes),
                     "chance": statistics.fmean(len(o) / len(singles) for o in shown),
                     "two": statistics.fmean(f for f, o in zip(found, shown) if len(o) == 2),
                     "three": statistics.fmean(f for f, o in zip(found, shown) if len(o) == 3)})
    first = runs[0]
    return {"objects_found": statistics.fmean(r["objects_found"] for r in runs),
            "objects_found_std": statistics.pstdev(r["objects_found"] for r in runs),
            "two": statistics.fmean(r["two"] for r in runs), "three": statistics.fmean(r["three"] for r in runs),
            "cosine_gap": statistics.fmean(r["cosine_gap"] for r in runs),
            "learned_scale": statistics.fmean(r["learned_scale"] for r in runs), "scenes": first["scenes"],
            "split": {scale: {k: statistics.fmean(r["split"][scale][k] for r in runs if scale in r["split"])
                              for k in ("top_share", "shown_mass")}
                      for scale in first["split"]}, "chance_found": first["chance"]}


def reading(result: dict) -> str:
    """Whether the probability on the shapes shown goes to one of them as the scale grows (the teaching's claim)."""
    scales = sorted(result["split"], key=float)
    low, high = result["split"][scales[0]], result["split"][scales[-1]]
    if high["top_share"] > low["top_share"]:
        return (f"From scale {scales[0]} to {scales[-1]} the top shape's share of the probability on the shapes shown "
                f"grows from {low['top_share']:.1%} to {high['top_share']:.1%}: it concentrates on one of them, though "
                "the image shows all, as a softmax over prompts answers one class.")
    return (f"From scale {scales[0]} to {scales[-1]} the top shape's share does not grow ({low['top_share']:.1%} to "
            f"{high['top_share']:.1%}): the probability does not concentrate on one shape here.")


def section(result: dict, options: FailureOptions, seeds: int, out: Path) -> list[str]:
    lines = ["## Several objects: what the top captions name, and the softmax's split", "",
             f"A model of the `{options.scene_preset}` preset trained on scenes of two or three shapes, each captioned "
             f"by one of them; {result['scenes']} held-out scenes; {seeds_phrase(seeds, spread=False)}.", "",
             f"- Of the shapes a scene shows, its top-n captions (n shapes) name {result['objects_found']:.1%} "
             f"(chance {result['chance_found']:.1%}; two shapes {result['two']:.1%}, three {result['three']:.1%}).",
             f"- The cosine gap between the best- and worst-scored shape shown: {result['cosine_gap']:.3f} (the "
             f"teaching's example: 0.16); the model learned a scale of {result['learned_scale']:.1f}.", "",
             "| softmax scale | the top shape's share of the shapes' probability | probability on the shapes shown |",
             "|---|---|---|"]
    lines += [f"| {scale} | {row['top_share']:.1%} | {row['shown_mass']:.1%} |"
              for scale, row in result["split"].items()]
    return lines + ["", reading(result), ""]
