"""SigLIP's pairwise sigmoid loss (Zhai et al. 2023; loss.kind=sigmoid): every (image, text) pair of the batch is
a binary problem, positive on the diagonal, Z = img @ txt.T / t + b; the loss is the mean over images of the summed
pair losses, -(1/n) sum_ij log sigmoid(l_ij Z_ij), l = +1 on the positives and -1 elsewhere.

Its forms, all exact (tests/test_loss.py, tests/test_distributed.py):
- `naive_sigmoid_loss`: the [n, m] logits, kept for the backward;
- `chunked_sigmoid_loss`: the row blocks streamed and recomputed in the backward (`_SoftplusSum`), O(rows x m);
- `gathered_sigmoid_loss` (torchrun): each rank's images against every rank's texts, gathered once;
- `ring_sigmoid_loss` (torchrun): the texts passed around a ring of neighbours instead (`_SoftplusSum` over W ranks),
  per-rank memory flat in the number of ranks.
Each pair is scored once, so no second direction is needed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from openalign import distributed
from openalign.loss.base import Loss, at_least_fp32, chunk_rows, chunked, register


def sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                 implementation: str = "naive") -> torch.Tensor:
    """SigLIP: every pair is a binary problem; mean over images of the summed pair losses. `implementation`:
    naive (the [B, B] logits, kept for the backward), chunked (`chunked_sigmoid_loss`) or auto (chunked from
    AUTO_CHUNKED_FROM pairs on)."""
    if chunked(implementation, len(img)):
        return chunked_sigmoid_loss(img, txt, temperature, bias)
    return naive_sigmoid_loss(img, txt, temperature, bias)


def naive_sigmoid_loss(a: torch.Tensor, b: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                       offset: int = 0) -> torch.Tensor:
    """The rows of `a` against every row of `b`, row i's positive at column offset + i, from the materialized
    [n, m] logits (kept for the backward)."""
    logits = at_least_fp32(a) @ at_least_fp32(b).T / temperature + bias  # [n, m]
    labels = -torch.ones_like(logits)  # +1 on the positives, -1 elsewhere
    labels[torch.arange(len(a)), torch.arange(offset, offset + len(a))] = 1.0
    return -F.logsigmoid(labels * logits).sum() / len(a)


def softplus_rows(scaled: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, chunk: int, z: torch.Tensor,
                  spare: torch.Tensor) -> torch.Tensor:
    """sum_ij softplus(scaled_i . b_j + bias) in row chunks, in the two [chunk, len(b)] buffers given:
    softplus(z) = max(z, 0) + log1p(exp(-|z|)), every step in place."""
    total = scaled.new_zeros(())
    for s in range(0, len(scaled), chunk):
        c = min(chunk, len(scaled) - s)
        logits = torch.mm(scaled[s:s + chunk], b.T, out=z[:c]).add_(bias)
        tail = torch.abs(logits, out=spare[:c]).neg_().exp_().log1p_()
        total += logits.clamp_(min=0).add_(tail).sum()
    return total


class _SoftplusSum(torch.autograd.Function):
    """sum_ij softplus(Z_ij) / n, Z = a @ b.T / t + bias, in row blocks of `chunk`, over the texts of `world` ranks
    passed around a ring (world 1: `b` alone): the sigmoid loss's negative part, every pair scored as a negative (the
    positives' correction is a dot product: `chunked_sigmoid_loss`).

    Forward: W steps, each scoring the block held (`softplus_rows`, in two reused buffers) and passing it on to the
    next rank (big_vision's and OpenCLIP's "neighbour exchange"); no block is kept. Backward: the ring again, each
    block of Z recomputed (its gradient is sigmoid(Z) / n, in one reused buffer) and each text block travelling with
    its gradient so far: each rank adds its images' part (dZ.T @ a / t) and passes both on, and after W hops the
    gradient is back with the block's owner. Every step reuses the same buffers, so a rank's memory is the same
    whatever the world size. The temperature divides each [c, d] slice of `a`, and its gradient needs no block:
    sum_ij G_ij (Z_ij - bias) = sum(a / t * (G @ b)); the bias's is sum_ij G_ij."""

    @staticmethod
    def forward(ctx, a, b, t, bias, chunk: int, world: int):
        rows = min(chunk, len(a))
        z, spare = a.new_empty(rows, len(b)), a.new_empty(rows, len(b))
        held, arriving = b, torch.empty_like(b) if world > 1 else None
        scaled = a / t  # the same every step
        total = a.new_zeros(())
        for step in range(world):
            total += softplus_rows(scaled, held, bias, chunk, z, spare)
            if step < world - 1:
                held, arriving = distributed.exchange(held, arriving), (held if step else torch.empty_like(b))
        ctx.save_for_backward(a, b, t, bias)
        ctx.chunk, ctx.world = chunk, world
        return total / len(a)

    @staticmethod
    def backward(ctx, grad):
        a, b, t, bias = ctx.saved_tensors
        n, m, world, chunk = a.shape[0], b.shape[0], ctx.world, ctx.chunk
        g_sum, grad_bias = torch.zeros_like(a), a.new_zeros(())  # g_sum: sum over blocks of dL/dZ @ block
        d_buffer = a.new_empty(min(chunk, n), m)
        scaled = a / t
        # the block and its gradient so far travel as one message
        held = torch.cat([b, torch.zeros_like(b)]) if world > 1 else None
        arriving = torch.empty_like(held) if world > 1 else None
        block, block_grad = (held[:m], held[m:]) if world > 1 else (b, torch.zeros_like(b))
        for _ in range(world):
            for s in range(0, n, chunk):
                c = min(chunk, n - s)
                d = torch.mm(scaled[s:s + c], block.T, out=d_buffer[:c]).add_(bias).sigmoid_().mul_(grad / n)
                grad_bias += d.sum()
                torch.addmm(g_sum[s:s + c], d, block, out=g_sum[s:s + c])  # (not addmm_: FLOP counters miss it)
                torch.addmm(block_grad, d.T, scaled[s:s + c], out=block_grad)
            if world > 1:  # on to the next rank; after the last step, the gradient goes home
                held, arriving = distributed.exchange(held, arriving), held
                block, block_grad = held[:m], held[m:]
        grad_t = -(scaled.reshape(-1) @ g_sum.reshape(-1)) / t  # sum_ij G_ij (Z_ij - bias) = sum(a / t * (G @ b))
        return (g_sum.div_(t), block_grad.clone() if world > 1 else block_grad, grad_t.to(t.dtype),
                grad_bias.to(bias.dtype), None, None)


def chunked_sigmoid_loss(a: torch.Tensor, b: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                         offset: int = 0, chunk: int | None = None) -> torch.Tensor:
    """The sigmoid loss of the rows of `a` against every row of `b`, row i's positive at column offset + i:
    -(1/n) sum_ij log sigmoid(l_ij Z_ij), l = +1 on the positives, -1 elsewhere. Since
    -log sigmoid(-z) = softplus(z) and log sigmoid(z) - log sigmoid(-z) = z, it is
    (1/n) sum_ij softplus(Z_ij) - (1/n) sum_i Z_{i, offset+i}: the blocks stream (`_SoftplusSum`), the positives
    are dot products. Exact: the naive form's value and gradients, in O(rows_per_chunk x len(b)) memory."""
    a, b = at_least_fp32(a), at_least_fp32(b)
    t, bias = temperature.to(a.dtype), bias.to(a.dtype)
    n = a.shape[0]
    positive = (a * b[offset:offset + n]).sum(dim=1).mean() / t + bias  # mean_i Z[i, offset + i]
    return softplus_sum(a, b, t, bias, chunk) - positive


def softplus_sum(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor, bias: torch.Tensor, chunk: int | None = None
                 ) -> torch.Tensor:
    """sum_ij softplus(a_i . b_j / t + bias) / len(a): every pair scored as a negative, in row blocks recomputed in
    the backward (`chunk` rows; default: blocks of CHUNK_BYTES)."""
    return _SoftplusSum.apply(a, b, t, bias, chunk_rows(b.shape[0], a.element_size(), chunk), 1)


def ring_sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                      implementation: str = "auto") -> torch.Tensor:
    """The same share as `gathered_sigmoid_loss`, with the texts passed around a ring of neighbours instead of
    gathered (big_vision's and OpenCLIP's "neighbour exchange"), forward and again in the backward
    (`_SoftplusSum` over the world): per-rank memory stays flat in the number of ranks. The positives, all in the
    rank's own block, are one dot product."""
    img, txt = at_least_fp32(img), at_least_fp32(txt)
    t, b = temperature.to(img.dtype), bias.to(img.dtype)
    n = img.shape[0]
    streamed = chunked(implementation, n * dist.get_world_size())
    chunk = chunk_rows(n, img.element_size(), None) if streamed else n  # rows per [chunk, n] block
    positive = (img * txt).sum(dim=1).mean() / t + b  # this rank's own pairs
    return _SoftplusSum.apply(img, txt, t, b, chunk, dist.get_world_size()) - positive


def gathered_sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                          implementation: str = "auto") -> torch.Tensor:
    """This rank's share of the global-batch sigmoid loss: its images against every rank's texts (one all_gather;
    the texts' gradients flow back to their owners), its positives at rank * n + i. The mean over ranks is the
    single-process loss of the whole batch (each pair is scored once, so no second direction is needed); chunked,
    no [n, B] block is kept for the backward."""
    n = img.shape[0]
    txt_all = distributed.gather(txt)
    offset = dist.get_rank() * n
    if chunked(implementation, len(txt_all)):
        return chunked_sigmoid_loss(img, txt_all, temperature, bias, offset=offset)
    return naive_sigmoid_loss(img, txt_all, temperature, bias, offset=offset)


@register
class Sigmoid(Loss):
    """SigLIP's sigmoid loss with its learned bias: one process (naive or chunked) or under torchrun (a ring of
    text blocks, or one all_gather: loss.exchange)."""

    name = "sigmoid"
    scalars = ("temperature", "bias")
    temperature_init = 0.1  # SigLIP: the logits' scale starts at 10 (t' = log 10), the bias at -10
    parameterization = "log"  # SigLIP learns t', the scale being exp(t')
    options = frozenset({"exchange"})

    def __call__(self, img, txt, scales, generator=None):
        t, bias = self.temperature(scales), scales["bias"]
        if self.world > 1:
            share = gathered_sigmoid_loss if self.cfg.exchange == "gather" else ring_sigmoid_loss
            return share(img.embeds, txt.embeds, t, bias, self.cfg.implementation)
        return sigmoid_loss(img.embeds, txt.embeds, t, bias, self.cfg.implementation)
