"""Image-text retrieval: R@1/5/10 both ways, the modality gap and the chance levels; with `rerank`, the pooled
shortlist re-ranked by late interaction (mean over patches of the best token, FILIP's)."""

from __future__ import annotations

import time

import torch

from openalign.config import ConfigError
from openalign.eval import metrics as M
from openalign.eval import panels
from openalign.eval.features import Context
from openalign.eval.options import RetrievalOptions
from openalign.loss import late_interaction_pairs

__all__ = ["clip_benchmark", "reranked", "retrieval"]


def retrieval(ctx: Context, options: RetrievalOptions = RetrievalOptions()) -> tuple[dict, dict]:
    data = ctx.data
    if not data.captions:
        raise ConfigError("the evaluation data has no captions (a classification set?): use --task zeroshot")
    txt = ctx.encode(data.captions)
    start = time.perf_counter()
    i2t, t2i = M.retrieval_ranks(data.image_embeds, txt, data.text_to_image)
    pooled_s = time.perf_counter() - start
    metrics = M.ranks_to_metrics(i2t, t2i) | M.modality_gap(data.image_embeds, txt) | {
        "shared_captions": M.shared_caption_share(data.captions, data.text_to_image)} | \
        M.threshold_spread(data.image_embeds, txt, data.text_to_image)
    if options.rerank:
        metrics |= reranked(ctx, txt, i2t, t2i, options.rerank, pooled_s)
    chance = M.retrieval_chance(data.text_to_image, len(data.labels))
    per_image = torch.bincount(data.text_to_image, minlength=len(data.labels))
    figure = {"draw": panels.retrieval, "i2t": i2t, "t2i": t2i, "captions_per_image": per_image, "n_texts": len(txt)}
    return metrics | {f"chance_{k}": v for k, v in chance.items()}, {"retrieval": figure}


def reranked(ctx: Context, txt: torch.Tensor, i2t: torch.Tensor, t2i: torch.Tensor, k: int, pooled_s: float
              ) -> dict:
    """R@K after re-ranking each query's pooled top k by late interaction, and the time per query of the
    pooled ranking and of the re-rank (scoring only: the encoders' time is the same for both)."""
    data = ctx.data
    if data.image_patches is None:
        raise ConfigError("retrieval.rerank needs the images' patch vectors; evaluate through eval/tasks.run_tasks")
    tokens, mask = ctx.encode_tokens(data.captions)
    patches = data.image_patches
    patch_mask = torch.ones(patches.shape[:2], dtype=torch.bool)
    start = time.perf_counter()

    def image_queries(rows, top):  # each image against its shortlisted texts: mean over patches of max over tokens
        scores = late_interaction_pairs(patches[rows][:, None], patch_mask[rows][:, None], tokens[top], mask[top])
        return scores[0][:, 0]

    def text_queries(rows, top):  # each text against its shortlisted images: mean over tokens of max over patches
        scores = late_interaction_pairs(patches[top], patch_mask[top], tokens[rows][:, None], mask[rows][:, None])
        return scores[1][..., 0]

    img = data.image_embeds
    i2t_late = M.reranked_ranks(img, txt, M.captions_by_image(data.text_to_image, len(img)), i2t, image_queries, k)
    t2i_late = M.reranked_ranks(txt, img, data.text_to_image[:, None], t2i, text_queries, k)
    late_s = time.perf_counter() - start
    queries = len(img) + len(txt)
    reranked = {f"{key}_rerank": value for key, value in M.ranks_to_metrics(i2t_late, t2i_late).items()
                if not key.startswith("n_")}
    return reranked | {"rerank_k": k, "ms_per_query": 1000 * pooled_s / queries,
                       "rerank_ms_per_query": 1000 * (pooled_s + late_s) / queries,
                       "patches_per_image": patches.shape[1]}


def clip_benchmark(metrics: dict) -> dict:
    """CLIP_benchmark's retrieval keys: image_retrieval_recall@K is text -> image (t2i), text_retrieval_recall@K
    image -> text (i2t: a hit when any of the image's captions is in the top K, as ours)."""
    return {f"{name}_retrieval_recall@{k}": metrics[f"{way}_r{k}"]
            for name, way in (("image", "t2i"), ("text", "i2t")) for k in M.KS}
