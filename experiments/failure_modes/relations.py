"""`relations`: word order and relations.

Models trained with openalign's towers on the shapes corpus's relation scenes ("a red circle left of a blue
square"), with the paper's loss and with FILIP's; each held-out scene's caption against the same words with the
objects swapped, by the pooled score and by late interaction (each token's best patch). Nothing in a pooled score
compares roles, and late interaction does not either (each token picks its patch alone): the teaching expects both
near chance (50%).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

import openalign
from openalign.loss import late_interaction_pairs
from openalign.model.encode import encode_image_tokens, encode_text_tokens
from experiments.failure_modes.options import FailureOptions
from experiments.failure_modes.scenes import held_out_scenes, scene_model
from experiments.lab.report import mean_std_of, paired_bars, seeds_phrase

NAME = "relations"
LOSSES = ("softmax", "filip")
NEAR_CHANCE = 0.05  # within this of 50% (or two seed spreads, if wider) reads as chance


def run(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Caption against swapped caption, pooled and late interaction, for the paper's loss and FILIP's."""
    rows: dict = {}
    jobs = [(loss, seed) for loss in LOSSES for seed in range(seeds)]
    for loss, seed in tqdm(jobs, desc="relations", unit="run", disable=not progress):
        model = openalign.load(scene_model(options, "relation", loss, seed, out / "runs"))
        scenes = held_out_scenes(model, "relation", options.scene_per_combo)
        texts = [t for sc in scenes for t in (sc["meta"]["texts"][0], sc["meta"]["swapped"])]
        pooled, patches = [], []
        for start in range(0, len(scenes), 64):
            batch = torch.stack([sc["pixels"] for sc in scenes[start:start + 64]])
            embeds, cells = encode_image_tokens(model.model, batch)
            pooled.append(embeds)
            patches.append(cells)
        images, cells = torch.cat(pooled), torch.cat(patches)
        captions = model.encode_texts(texts).view(len(scenes), 2, -1)
        by_pool = (torch.einsum("nd,ncd->nc", images, captions)).numpy()
        tokens, mask = encode_text_tokens(model.model, model.tokenizer, texts,
                                          max_length=model.cfg.model.text.max_length)
        tokens, mask = tokens.view(len(scenes), 2, *tokens.shape[1:]), mask.view(len(scenes), 2, -1)
        late = late_interaction_pairs(cells[:, None], torch.ones(cells.shape[:2], dtype=torch.bool)[:, None], tokens,
                                      mask)[1][:, 0, :].numpy()  # [n, 2]: text-to-image of own and swapped
        relation = [sc["meta"]["relation"] for sc in scenes]
        rows.setdefault(loss, []).append({
            "pooled": float((by_pool[:, 0] > by_pool[:, 1]).mean()), "late": float((late[:, 0] > late[:, 1]).mean()),
            "pooled_ties": float((abs(by_pool[:, 0] - by_pool[:, 1]) < 1e-6).mean()), "scenes": len(scenes),
            "by_relation": {r: float((by_pool[[i for i, x in enumerate(relation) if x == r], 0] >
                                     by_pool[[i for i, x in enumerate(relation) if x == r], 1]).mean())
                            for r in sorted(set(relation))}})
    return {"losses": {loss: mean_std_of(runs, ("pooled", "late", "pooled_ties"))
                       | {"by_relation": runs[0]["by_relation"], "scenes": runs[0]["scenes"]}
                       for loss, runs in rows.items()}}


def reading(result: dict) -> list[str]:
    """Each score's distance from chance, against the seeds' spread: near 50% as the teaching expects, or carried
    by something (the text tower's word order) that tells the roles apart."""
    lines = []
    for loss, row in result["losses"].items():
        for key, label in (("pooled", "the pooled score"), ("late", "late interaction")):
            mean, std = row["mean"][key], row["std"][key]
            near = abs(mean - 0.5) <= max(NEAR_CHANCE, 2 * std)
            lines.append(f"- Trained with {loss}, {label} puts the own caption first for {mean:.1%} of the scenes: "
                         + ("near chance, as the teaching expects: it does not tell the roles apart." if near else
                            f"{'above' if mean > 0.5 else 'below'} chance by more than the seeds' spread, so "
                            "something in it (the text tower's word order) tells the roles apart."))
    return lines


def section(result: dict, options: FailureOptions, seeds: int, out: Path) -> list[str]:
    rows = result["losses"]
    paired_bars(rows, (("pooled", "pooled score"), ("late", "late interaction")), [f"trained with {x}" for x in rows],
                0.5, out / "relations.png", ylim=(0, 1), ylabel="own caption above the swapped one",
                title="relations: who is left of whom")
    lines = ["## Relations and word order: a caption against its objects swapped", "",
             f"Models of the `{options.scene_preset}` preset trained on the shapes corpus's relation scenes "
             f"({options.scene_per_combo} per seen combination; {', '.join(options.scene_overrides)}); each held-out "
             f"scene's caption against the same words with the two objects swapped; {seeds_phrase(seeds)}. "
             "Chance: 50%.", "",
             "| loss | scenes | own caption scored above the swapped: pooled | ... late interaction |",
             "|---|---|---|---|"]
    for loss, row in rows.items():
        m, sd = row["mean"], row["std"]
        lines.append(f"| {loss} | {row['scenes']} | {m['pooled']:.1%} ± {sd['pooled']:.1%} | "
                     f"{m['late']:.1%} ± {sd['late']:.1%} |")
    return lines + ["", *reading(result), "", "![own against swapped caption](relations.png)", ""]
