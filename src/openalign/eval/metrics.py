"""Retrieval and classification metrics as pure functions of embeddings (numpy-free torch math).

Ranks are 0-based and ties count against the query: the rank of a target is the number of *wrong*
candidates scoring at least as high as it (so a constant model gets chance-or-worse, never luck).
Image->text: an image's hit is its best-scoring caption (any of its captions counts).
"""

from __future__ import annotations

import torch

KS = (1, 5, 10)


def chance_key(key: str) -> str:
    """Where the chance level of a metric is stored: `chance_i2t_r10`, `zeroshot_chance_top1`."""
    return key.replace("zeroshot_", "zeroshot_chance_") if key.startswith("zeroshot_") else f"chance_{key}"


def i2t_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """[N] rank of each image's best caption among all M texts. img [N, D], txt [M, D], text_to_image [M]."""
    n = img.shape[0]
    ranks = torch.empty(n, dtype=torch.long)
    for start in range(0, n, chunk):
        sims = img[start:start + chunk] @ txt.T  # [b, M], one block: memory b x M
        own = text_to_image[None, :] == torch.arange(start, start + len(sims))[:, None]  # [b, M]
        best = sims.masked_fill(~own, float("-inf")).max(dim=1, keepdim=True).values  # [b, 1]
        ranks[start:start + chunk] = ((sims >= best) & ~own).sum(dim=1)
    return ranks


def t2i_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """[M] rank of each text's image among all N images."""
    m = txt.shape[0]
    ranks = torch.empty(m, dtype=torch.long)
    for start in range(0, m, chunk):
        sims = txt[start:start + chunk] @ img.T  # [b, N]
        target = text_to_image[start:start + chunk]  # [b]
        score = sims.gather(1, target[:, None])  # [b, 1], from the same matrix: ties are exact
        ranks[start:start + chunk] = (sims >= score).sum(dim=1) - 1
    return ranks


def recalls(ranks: torch.Tensor, prefix: str, ks=KS) -> dict[str, float]:
    out = {f"{prefix}_r{k}": float((ranks < k).float().mean()) for k in ks}
    out[f"{prefix}_median_rank"] = float(ranks.float().median() + 1)  # 1-based, as papers report it
    return out


def retrieval_metrics(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor) -> dict[str, float]:
    """The DESIGN.md keys: i2t_r1/5/10, t2i_r1/5/10, mean_recall, plus median ranks and counts."""
    metrics = recalls(i2t_ranks(img, txt, text_to_image), "i2t") | recalls(t2i_ranks(img, txt, text_to_image), "t2i")
    metrics["mean_recall"] = sum(metrics[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in KS) / (2 * len(KS))
    return metrics | {"n_images": img.shape[0], "n_texts": txt.shape[0]}


def retrieval_chance(text_to_image: torch.Tensor, n_images: int, ks=KS) -> dict[str, float]:
    """Expected recalls of a random ranking (image->text: P(any of its c captions in the top K of M))."""
    m = len(text_to_image)
    captions = torch.bincount(text_to_image, minlength=n_images).double()  # [N] c per image
    out = {}
    for k in ks:
        miss = torch.ones_like(captions)
        for i in range(k):  # P(top K holds none of its c captions) = prod_i (M - c - i) / (M - i)
            miss *= ((m - captions - i) / (m - i)).clamp(min=0)
        out[f"i2t_r{k}"] = float((1 - miss).mean())
        out[f"t2i_r{k}"] = min(1.0, k / n_images)
    out["mean_recall"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in ks) / (2 * len(ks))
    return out


def class_weights(text_embeds: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Prompt ensemble: [C*T, D] template embeddings (class-major) -> [C, D] classifier.

    Each template embedding is normalized, the T of a class are averaged, the mean is renormalized.
    """
    per_class = torch.nn.functional.normalize(text_embeds, dim=-1).reshape(n_classes, -1, text_embeds.shape[-1])
    return torch.nn.functional.normalize(per_class.mean(dim=1), dim=-1)  # [C, D]


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> dict[str, float]:
    """logits [N, C], labels [N]; ties count against (rank = wrong classes scoring >= the true one)."""
    true = logits.gather(1, labels[:, None])  # [N, 1]
    ranks = (logits >= true).sum(dim=1) - 1  # [N]
    return {f"top{k}": float((ranks < k).float().mean()) for k in ks}
