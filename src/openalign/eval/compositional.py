"""Compositional zero-shot: colour-shape pairs never seen in training (`openalign eval --task compositional`).

On data whose images carry `attributes` {colour, shape, seen} (the built-in `shapes` corpus's held-out
split), two measurements:

- classification: a prompt-ensemble classifier over every colour x shape pair; top-1 on images of the
  unseen pairs and of the seen ones, their harmonic mean (the usual compositional zero-shot summary), and on
  unseen pairs how often the colour alone and the shape alone come out right;
- arithmetic (the paper's image +/- text queries): an image of a seen pair (c1, s) minus the text "c1" plus
  the text "c2" should retrieve images of the unseen pair (c2, s). Recall@K over all held-out images (the
  source left out), at the paper's weights (text 2, image 1) and for each text weight in
  `arithmetic.WEIGHTS`; the image alone and the text "c2 s" alone are the references.
"""

from __future__ import annotations

import numpy as np
import torch

from openalign.config import ConfigError
from openalign.eval import metrics as M
from openalign.eval.arithmetic import KS, PAPER_WEIGHT, WEIGHTS
from openalign.eval.features import Context, EvalData
from openalign.eval.options import CompositionalOptions


META = "attributes"  # the per-image metadata this task reads: {colour, shape, seen in training} (shapes corpus)


def _pairs(data: EvalData) -> tuple[list[str], list[str], list[tuple[str, str, bool]]]:
    attributes = [m.get(META) or {} for m in data.meta]
    if not attributes or not all({"colour", "shape", "seen"} <= set(a) for a in attributes):
        raise ConfigError("--task compositional needs images with colour, shape and seen attributes: the held-out "
                          "split of the built-in shapes corpus (openalign corpus shapes --out DIR)")
    rows = [(a["colour"], a["shape"], bool(a["seen"])) for a in attributes]
    return sorted({c for c, _, _ in rows}), sorted({s for _, s, _ in rows}), rows


def classification(ctx: Context, templates: tuple[str, ...], colours, shapes, rows) -> dict:
    classes = [(c, s) for c in colours for s in shapes]
    prompts = [t.format(f"{c} {s}") for c, s in classes for t in templates]
    weights = M.class_weights(ctx.encode(prompts), len(classes))
    predicted = (ctx.data.image_embeds.float() @ weights.T).argmax(dim=1).tolist()
    out = {"n_classes": len(classes), "chance_unseen_top1": 1 / len(classes), "chance_seen_top1": 1 / len(classes)}
    for name, want in (("unseen", False), ("seen", True)):
        idx = [i for i, (_, _, seen) in enumerate(rows) if seen == want]
        if not idx:
            continue
        hits = [classes[predicted[i]] for i in idx]
        out[f"{name}_top1"] = sum(h == rows[i][:2] for h, i in zip(hits, idx)) / len(idx)
        out[f"{name}_colour_top1"] = sum(h[0] == rows[i][0] for h, i in zip(hits, idx)) / len(idx)
        out[f"{name}_shape_top1"] = sum(h[1] == rows[i][1] for h, i in zip(hits, idx)) / len(idx)
        out[f"n_{name}_images"] = len(idx)
    if "unseen_top1" in out and "seen_top1" in out:
        a, b = out["unseen_top1"], out["seen_top1"]
        out["harmonic_top1"] = 2 * a * b / (a + b) if a + b else 0.0
    return out


def swap_colour(ctx: Context, colours, rows) -> dict:
    from openalign.index.search import IMAGE_WEIGHT, combine

    images = ctx.data.image_embeds.float()
    members: dict[tuple[str, str], list[int]] = {}
    for i, (c, s, _) in enumerate(rows):
        members.setdefault((c, s), []).append(i)
    # every seen-pair image of shape s, towards each unseen pair (c2, s) of another colour
    queries = [(i, c1, c2, s) for (c2, s), targets in members.items() if not rows[targets[0]][2]
               for i, (c1, s1, seen) in enumerate(rows) if seen and s1 == s and c1 != c2]
    if not queries:
        return {"arithmetic_n_queries": 0}
    width = max(len(v) for v in members.values())
    positives = torch.full((len(queries), width), -1, dtype=torch.long)
    for q, (_, _, c2, s) in enumerate(queries):
        positives[q, :len(members[c2, s])] = torch.tensor(members[c2, s])
    sources = torch.tensor([i for i, _, _, _ in queries])
    words = ctx.encode(colours).float().numpy()
    word = {c: words[k] for k, c in enumerate(colours)}
    terms = np.stack([np.stack([word[c1], word[c2]]) for _, c1, c2, _ in queries])  # [Q, 2, D]
    signs = np.tile(np.array([[-1.0, 1.0]], dtype=np.float32), (len(queries), 1))
    names = sorted({f"{c2} {s}" for _, _, c2, s in queries})
    named = ctx.encode(names).float()
    out: dict = {"arithmetic_n_queries": len(queries)}
    for weight in WEIGHTS:
        if weight == "text":
            q = named[torch.tensor([names.index(f"{c2} {s}") for _, _, c2, s in queries])]
        else:
            q = torch.from_numpy(combine(images[sources].numpy(), terms, signs, IMAGE_WEIGHT, weight))
        ranks = M.positive_ranks(q, images, positives, exclude=sources)
        name = "text_only" if weight == "text" else f"w{weight:g}"
        out[f"arithmetic_{name}_r1"] = float((ranks < 1).float().mean())
        out[f"arithmetic_{name}_r10"] = float((ranks < 10).float().mean())
        if weight == PAPER_WEIGHT:
            out |= {f"arithmetic_r{k}": float((ranks < k).float().mean()) for k in KS}
    targets = torch.tensor([len(members[c2, s]) for _, _, c2, s in queries])
    chance = M.positive_chance(targets, len(rows) - 1)  # the gallery without the source
    return out | {f"chance_arithmetic_r{k}": chance[k] for k in KS}


def compositional(ctx: Context, options: CompositionalOptions = CompositionalOptions()) -> tuple[dict, dict]:
    colours, shapes, rows = _pairs(ctx.data)
    return classification(ctx, options.templates, colours, shapes, rows) | swap_colour(ctx, colours, rows), {}
