"""Image +/- text query arithmetic (the paper's Section 7), measured: `openalign eval --task arithmetic`.

On data whose images carry CLDR-style names (the built-in emoji corpus), each name of the form
"X: M" where an image named "X" exists ("waving hand: medium skin tone", "man: red hair"), and each
"man X" / "woman X" where "person X" exists, gives one query: the image of X plus the text M (or
"man" / "woman") should retrieve the named variant. The query is the service's
(`index.search.combine`): normalize(w_image * image + w_text * text); the source image itself is left
out of the ranking, as in composed image retrieval benchmarks.

Reported: recall@1/5/10 at the paper's weights (text 2, image 1), recall@1 and @10 for each text
weight in `WEIGHTS` (0: the image alone; "text": the text alone) and the best of them (by recall@10,
then @1), and recall@10 by modifier kind (skin tone, hair, gender, other). Chance is K / (gallery - 1).
"""

from __future__ import annotations

import re

import numpy as np
import torch

from openalign.eval import metrics as M
from openalign.eval.features import Context

WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, "text")  # text weight against image weight 1
PAPER_WEIGHT = 2.0
KS = (1, 5, 10)
NO_BASE = ("flag", "keycap")  # "flag: Germany" is not the image "flag" modified
GENDER = re.compile(r"^(man|woman) (.+)$")


def kind_of(modifier: str) -> str:
    if "skin tone" in modifier:
        return "skin_tone"
    if "hair" in modifier or "bald" in modifier:
        return "hair"
    if modifier in ("man", "woman"):
        return "gender"
    return "other"


def triplets(names: list[str]) -> list[tuple[int, str, int]]:
    """(source image, modifier text, target image) for every variant whose base is also an image."""
    index = {}
    for i, name in enumerate(names):
        index.setdefault(name, i)
    out = []
    for target, name in enumerate(names):
        head, sep, modifier = name.partition(": ")
        if sep and head not in NO_BASE and head in index and modifier:
            out.append((index[head], modifier, target))
            continue
        match = GENDER.match(name)
        if match and f"person {match.group(2)}" in index:
            out.append((index[f"person {match.group(2)}"], match.group(1), target))
    return out


def arithmetic(ctx: Context, _=None) -> tuple[dict, dict]:
    """Image + text queries (the paper's Section 7) over the split's emoji variants, at several text weights."""
    from openalign.index.search import IMAGE_WEIGHT, combine

    data = ctx.data
    found = triplets(data.labels)
    n = len(data.labels)
    if not found:
        return {"n_queries": 0}, {}
    sources = torch.tensor([s for s, _, _ in found])
    targets = torch.tensor([t for _, _, t in found])
    modifiers = [m for _, m, _ in found]
    unique = sorted(set(modifiers))
    text = ctx.encode(unique).float()
    texts = text[torch.tensor([unique.index(m) for m in modifiers])]  # [Q, D]
    images = data.image_embeds.float()
    kinds = np.array([kind_of(m) for m in modifiers])
    out: dict = {}
    curve = {}
    for weight in WEIGHTS:
        if weight == "text":
            queries = texts
        else:
            queries = combine(images[sources].numpy(), texts.numpy()[:, None, :], np.ones((len(found), 1)),
                              IMAGE_WEIGHT, weight)
            queries = torch.from_numpy(queries)
        ranks = M.positive_ranks(queries, images, targets[:, None], exclude=sources)  # the source left out
        name = "text_only" if weight == "text" else f"w{weight:g}"
        curve[name] = ranks
        out[f"{name}_r1"] = float((ranks < 1).float().mean())
        out[f"{name}_r10"] = float((ranks < 10).float().mean())
        if weight == PAPER_WEIGHT:
            out |= {f"r{k}": float((ranks < k).float().mean()) for k in KS}
            for kind in ("skin_tone", "hair", "gender", "other"):
                mask = torch.from_numpy(kinds == kind)
                if mask.any():
                    out[f"{kind}_r10"] = float((ranks[mask] < 10).float().mean())
                    out[f"{kind}_n"] = int(mask.sum())
    best = max((w for w in WEIGHTS if w != "text"), key=lambda w: (out[f"w{w:g}_r10"], out[f"w{w:g}_r1"]))
    out |= {"best_weight": best, "n_queries": len(found), "n_images": n}
    out |= {f"chance_r{k}": min(1.0, k / max(1, n - 1)) for k in KS}
    weights = [w for w in WEIGHTS if w != "text"]
    figure = {"draw": draw, "weights": weights,
              "recall": {kind: [float((curve[f"w{w:g}"][torch.from_numpy(kinds == kind)] < 10).float().mean())
                                for w in weights] for kind in sorted(set(kinds))},
              "counts": {kind: int((kinds == kind).sum()) for kind in sorted(set(kinds))},
              "all": [out[f"w{w:g}_r10"] for w in weights], "text_only": out["text_only_r10"],
              "chance": out["chance_r10"]}
    return out, {"arithmetic": figure}


def draw(ax, data: dict) -> None:
    """Recall@10 of the image + text queries against the text's weight, per kind of edit, with the text alone,
    chance and the paper's weight marked (the report's panel: eval/panels.py)."""
    weights = data["weights"]
    for kind, recall in data["recall"].items():
        ax.plot(weights, recall, marker="o", alpha=0.6, label=f"{kind.replace('_', ' ')} ({data['counts'][kind]:,})")
    ax.plot(weights, data["all"], marker="o", color="black", lw=2,
            label=f"all queries ({sum(data['counts'].values()):,})")
    ax.axhline(data["text_only"], color="gray", ls="--", label="text alone")
    ax.axhline(data["chance"], color="gray", ls=":", label="chance")
    ax.axvline(PAPER_WEIGHT, color="tab:red", alpha=0.3, lw=6, label=f"paper: text {PAPER_WEIGHT:g}, image 1")
    ax.set(xscale="symlog", xlabel="text weight (image weight 1)", ylabel="recall@10", ylim=(0, 1.02),
           title="image + text query arithmetic")
    ax.set_xticks(weights, [f"{w:g}" for w in weights])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
