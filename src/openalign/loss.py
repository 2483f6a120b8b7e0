"""ALIGN's contrastive losses, as pure functions of embeddings and temperature.

Normalized softmax (the paper):  L = L_i2t + L_t2i, each the mean over rows of a label-smoothed
cross-entropy over `img @ txt.T / t`. Label smoothing follows torch's convention: the target
distribution is (1 - s) on the positive plus s / K spread over all K candidates of the row.
SigLIP's pairwise sigmoid loss is the alternative (Zhai et al. 2023).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    # Logits and the loss stay in fp32 under bf16 autocast; fp64 inputs stay fp64 (oracle tests).
    return x.to(torch.promote_types(x.dtype, torch.float32))


def clamp_temperature(temperature: torch.Tensor, floor: float) -> torch.Tensor:
    # The temperature is a learned divisor: bounded below, logits stay finite whatever the optimizer does.
    return temperature.clamp(min=floor)


def negatives_mask(n: int, fraction: float, generator: torch.Generator | None, device=None) -> torch.Tensor | None:
    """[n, n] bool mask of kept candidates: the diagonal plus round(fraction * (n - 1)) negatives per row.

    Table 8 of the paper ablates training with 50% and 25% of the in-batch negatives.
    """
    if fraction >= 1.0:
        return None
    k = int(round(fraction * (n - 1)))
    noise = torch.rand(n, n, generator=generator).to(device)  # [n, n]
    noise.fill_diagonal_(2.0)  # the positive is always kept (and sorts first)
    keep_idx = noise.topk(k + 1, dim=1).indices  # [n, k + 1]
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    return mask.scatter_(1, keep_idx.to(device), True)


def smoothed_cross_entropy(logits: torch.Tensor, label_smoothing: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over rows of the label-smoothed cross-entropy with the positive on the diagonal.

    `mask` ([n, m] bool, optional) removes candidates; smoothing spreads over the kept ones only.
    """
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    logp = _at_least_fp32(logits).log_softmax(dim=1)  # [n, m], log-sum-exp: stable for any temperature
    positive = logp.diagonal()  # [n]
    if label_smoothing == 0.0:
        return -positive.mean()
    if mask is None:
        uniform = logp.mean(dim=1)  # [n] mean over all m candidates
    else:
        uniform = logp.masked_fill(~mask, 0.0).sum(dim=1) / mask.sum(dim=1)
    return -((1.0 - label_smoothing) * positive + label_smoothing * uniform).mean()


def softmax_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, label_smoothing: float = 0.1,
                 negatives: torch.Tensor | None = None) -> torch.Tensor:
    """The paper's loss for aligned rows `img[i] <-> txt[i]`, both [B, D] and L2-normalized."""
    logits = _at_least_fp32(img) @ _at_least_fp32(txt).T / temperature  # [B, B], fp32 even under autocast
    i2t = smoothed_cross_entropy(logits, label_smoothing, negatives)
    t2i = smoothed_cross_entropy(logits.T, label_smoothing, None if negatives is None else negatives.T)
    return i2t + t2i


def sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SigLIP: every pair is a binary problem; mean over images of the summed pair losses."""
    logits = _at_least_fp32(img) @ _at_least_fp32(txt).T / temperature + bias  # [B, B]
    labels = 2.0 * torch.eye(len(img), device=img.device) - 1.0  # +1 on the diagonal, -1 elsewhere
    return -F.logsigmoid(labels * logits).sum() / len(img)
