"""The paper's loss: the normalized softmax (loss.kind=softmax).

L = L_i2t + L_t2i, each the mean over rows of a label-smoothed cross-entropy over `img @ txt.T / t`
(base.smoothed_cross_entropy: torch's convention, (1 - s) on the positive plus s / K over all K candidates).

Three exact forms, all the same function of the embeddings:
- `softmax_loss` materializes the [B, B] logits (small batches; the negatives-fraction ablation);
- `chunked_cross_entropy` streams the log-sum-exp over row blocks and recomputes the blocks in backward, so
  memory is O(B x chunk) instead of O(B^2), at 8*B^2*d FLOPs (one extra GEMM);
- `gathered_softmax_loss`: under torchrun each rank encodes its own B/W pairs, gathers both modalities' embeddings
  once (distributed.gather: its backward sums every rank's gradient into the owner's slice) and computes the
  cross-entropy of its *local rows* against *all* gathered columns, in both directions:
      L_r = CE(img_r @ txt_all.T / t, positives at r*n + i) + CE(txt_r @ img_all.T / t, same)
  The mean of L_r over ranks is the single-process loss of the whole batch, and DDP's gradient averaging makes
  every parameter gradient equal to the single-process one (tests/test_distributed.py, fp64, gloo).
Expanding the smoothed cross-entropy of row i over K candidates:
    CE_i = lse_i - (1 - s) * S_ii - (s / K) * sum_j S_ij
only the log-sum-exp needs the whole row; the other two terms are dot products of embeddings.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from openalign import distributed
from openalign.config import Config
from openalign.loss.base import (DIRECTIONS, Loss, at_least_fp32, block_gradients, chunk_rows, chunked,
                                 register, smoothed_cross_entropy)


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


def softmax_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, label_smoothing: float = 0.1,
                 negatives: torch.Tensor | None = None, direction: str = "both") -> torch.Tensor:
    """The paper's loss for aligned rows `img[i] <-> txt[i]`, both [B, D] and L2-normalized; `direction`
    keeps one of its two terms (image_to_text: the rows of the logits, text_to_image: the columns)."""
    rows, columns = DIRECTIONS[direction]
    logits = at_least_fp32(img) @ at_least_fp32(txt).T / temperature  # [B, B], fp32 even under autocast
    loss = logits.new_zeros(())
    if rows:
        loss = loss + smoothed_cross_entropy(logits, label_smoothing, negatives)
    if columns:
        loss = loss + smoothed_cross_entropy(logits.T, label_smoothing, None if negatives is None else negatives.T)
    return loss


class _LogSumExp(torch.autograd.Function):
    """sum_i lse(S[i, :]) / n (+ sum_j lse(S[:, j]) / m with `columns`), S = a @ b.T / t, in row blocks.

    Forward keeps only the per-row (and per-column) log-sum-exps; backward recomputes each block of S
    and forms its gradient G = row softmax / n + column softmax / m block by block, in two reused block
    buffers (fresh [c, m] tensors cost page faults on every block). The temperature divides each [c, d]
    slice of `a` rather than each [c, m] block, and its gradient needs no block either:
    sum_ij G_ij S_ij = sum(a / t * (G @ b)), a [c, d] product (G @ b is grad_a's GEMM anyway)."""

    @staticmethod
    def forward(ctx, a, b, t, columns: bool, chunk: int):
        n, m = a.shape[0], b.shape[0]
        row_lse = a.new_empty(n)
        col_max = col_sum = None
        buffer = a.new_empty(min(chunk, n), m)  # one block's memory, reused: no fresh pages per block
        for s in range(0, n, chunk):
            block = torch.mm(a[s:s + chunk] / t, b.T, out=buffer[:min(chunk, n - s)])  # [c, m]
            row_lse[s:s + chunk] = torch.logsumexp(block, dim=1)
            if columns:  # streaming column log-sum-exp: running max and rescaled running sum
                top = block.amax(dim=0)
                if col_max is None:
                    col_max, col_sum = top, block.sub_(top).exp_().sum(dim=0)
                else:
                    new = torch.maximum(col_max, top)
                    col_sum = col_sum.mul_((col_max - new).exp_()).add_(block.sub_(new).exp_().sum(dim=0))
                    col_max = new
        col_lse = col_max + col_sum.log() if columns else a.new_empty(0)
        ctx.save_for_backward(a, b, t, row_lse, col_lse)
        ctx.columns, ctx.chunk = columns, chunk
        out = row_lse.sum() / n
        return out + col_lse.sum() / m if columns else out

    @staticmethod
    def backward(ctx, grad):
        a, b, t, row_lse, col_lse = ctx.saved_tensors
        n, m = a.shape[0], b.shape[0]
        need_a, need_b, need_t = ctx.needs_input_grad[:3]
        grad_a = torch.empty_like(a) if need_a else None
        grad_b = torch.zeros_like(b) if need_b else None
        grad_t = torch.zeros((), dtype=a.dtype, device=a.device)
        rows = min(ctx.chunk, n)
        buffer, softmax = a.new_empty(rows, m), a.new_empty(rows, m)
        for s in range(0, n, ctx.chunk):
            c = min(ctx.chunk, n - s)
            scaled = a[s:s + c] / t  # [c, d]
            block = torch.mm(scaled, b.T, out=buffer[:c])  # [c, m]: recomputed
            d = torch.sub(block, row_lse[s:s + c, None], out=softmax[:c]).exp_()  # row softmax
            if ctx.columns:  # + (n / m) x column softmax, in the block's own memory
                d.add_(block.sub_(col_lse[None, :]).exp_(), alpha=n / m)
            d.mul_(grad / n)  # d loss / d S
            block_gradients(d, b, scaled, t, grad_a, grad_b, grad_t, slice(s, s + c), need_a, need_t)
        return grad_a, grad_b, grad_t.to(t.dtype) if need_t else None, None, None


def chunked_cross_entropy(a: torch.Tensor, b: torch.Tensor, temperature: torch.Tensor, label_smoothing: float,
                          offset: int = 0, columns: bool = False, chunk: int | None = None) -> torch.Tensor:
    """Mean label-smoothed cross-entropy of the rows of `a @ b.T / t`, row i's positive at column offset + i;
    with `columns` (a and b aligned, offset 0) plus the same over the columns (both directions).

    Exact: the same value and gradients as the materialized form, in O(rows_per_chunk x len(b)) memory."""
    a, b = at_least_fp32(a), at_least_fp32(b)
    t = temperature.to(a.dtype)
    n, m = a.shape[0], b.shape[0]
    rows = chunk_rows(m, a.element_size(), chunk)
    lse = _LogSumExp.apply(a, b, t, columns, rows)
    positive = (a * b[offset:offset + n]).sum(dim=1).mean() / t  # mean_i S[i, offset + i]
    spread = (a.sum(dim=0) @ b.sum(dim=0)) / (n * m * t)  # mean_i (1/m) sum_j S_ij
    directions = 2 if columns else 1
    return lse - directions * ((1.0 - label_smoothing) * positive + label_smoothing * spread)


def contrastive_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, label_smoothing: float = 0.1,
                     negatives: torch.Tensor | None = None, implementation: str = "auto",
                     direction: str = "both") -> torch.Tensor:
    """The paper's loss, materialized or chunked: `implementation` is naive | chunked | auto (chunked from
    AUTO_CHUNKED_FROM pairs on; the negatives-fraction ablation always materializes its mask)."""
    if negatives is not None or not chunked(implementation, len(img)):
        return softmax_loss(img, txt, temperature, label_smoothing, negatives, direction)
    if direction == "both":
        return chunked_cross_entropy(img, txt, temperature, label_smoothing, columns=True)
    a, b = (img, txt) if direction == "image_to_text" else (txt, img)
    return chunked_cross_entropy(a, b, temperature, label_smoothing)


def gathered_softmax_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor,
                          label_smoothing: float = 0.1, implementation: str = "auto",
                          direction: str = "both") -> torch.Tensor:
    """This rank's share of the global-batch loss (the module docstring); equal rank batch sizes."""
    n = img.shape[0]
    img_all, txt_all = distributed.gather(img), distributed.gather(txt)  # one all_gather per modality
    offset = dist.get_rank() * n
    streamed = chunked(implementation, len(img_all))

    def term(queries, candidates):  # this rank's rows of queries @ candidates.T, positives at offset + i
        if streamed:
            return chunked_cross_entropy(queries, candidates, temperature, label_smoothing, offset=offset)
        logits = at_least_fp32(queries) @ at_least_fp32(candidates).T / temperature
        return smoothed_cross_entropy(logits, label_smoothing, offset=offset)

    rows, columns = DIRECTIONS[direction]
    return sum(term(*pair) for pair, kept in (((img, txt_all), rows), ((txt, img_all), columns)) if kept)


@register
class Softmax(Loss):
    """The paper's normalized softmax: one process (materialized, chunked, with fewer negatives) or gathered."""

    name = "softmax"
    options = frozenset({"label_smoothing", "negatives_fraction", "direction"})

    @classmethod
    def rules(cls, cfg: Config, world: int) -> list[str]:
        problems = super().rules(cfg, world)
        if "negatives_fraction" in cls.options and world > 1 and cfg.loss.negatives_fraction < 1.0:
            problems.append("loss.negatives_fraction < 1 (the Table 8 ablation) runs in one process")
        return problems

    def __call__(self, img, txt, scales, generator=None):
        c, t = self.cfg, self.temperature(scales)
        if self.world > 1:
            return gathered_softmax_loss(img.embeds, txt.embeds, t, c.label_smoothing, c.implementation, c.direction)
        negatives = negatives_mask(len(img.embeds), c.negatives_fraction, generator, img.embeds.device)
        return contrastive_loss(img.embeds, txt.embeds, t, c.label_smoothing, negatives, c.implementation,
                                c.direction)
