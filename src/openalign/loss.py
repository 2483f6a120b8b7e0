"""ALIGN's contrastive losses, as pure functions of embeddings and temperature.

Normalized softmax (the paper):  L = L_i2t + L_t2i, each the mean over rows of a label-smoothed
cross-entropy over `img @ txt.T / t`. Label smoothing follows torch's convention: the target
distribution is (1 - s) on the positive plus s / K spread over all K candidates of the row.
SigLIP's pairwise sigmoid loss is the alternative (Zhai et al. 2023).

Three exact forms of the softmax loss, all the same function of the embeddings:
- `softmax_loss` materializes the [B, B] logits (small batches; the negatives-fraction ablation);
- `chunked_cross_entropy` streams the log-sum-exp over row blocks and recomputes the blocks in
  backward, so memory is O(B x chunk) instead of O(B^2), at 8*B^2*d FLOPs (one extra GEMM);
- `distributed.gathered_softmax_loss` (distributed.py): each rank's rows against the gathered columns.
The sigmoid loss has the same three forms (`sigmoid_loss`, `chunked_sigmoid_loss`, `distributed.gathered_sigmoid_loss`).
Expanding the smoothed cross-entropy of row i over K candidates:
    CE_i = lse_i - (1 - s) * S_ii - (s / K) * sum_j S_ij
only the log-sum-exp needs the whole row; the other two terms are dot products of embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_BYTES = 32 * 2**20  # chunked loss: bytes of one [rows, B] block of logits (a few are alive at once)
AUTO_CHUNKED_FROM = 4_096  # `implementation="auto"`: batches at least this large use the chunked loss


def chunked(implementation: str, rows: int) -> bool:
    """Whether the loss streams its logits (loss.implementation: chunked; auto from AUTO_CHUNKED_FROM rows on)."""
    return implementation == "chunked" or (implementation == "auto" and rows >= AUTO_CHUNKED_FROM)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
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
    logp = at_least_fp32(logits).log_softmax(dim=1)  # [n, m], log-sum-exp: stable for any temperature
    positive = logp.diagonal()  # [n]
    if label_smoothing == 0.0:
        return -positive.mean()
    if mask is None:
        uniform = logp.mean(dim=1)  # [n] mean over all m candidates
    else:
        uniform = logp.masked_fill(~mask, 0.0).sum(dim=1) / mask.sum(dim=1)
    return -((1.0 - label_smoothing) * positive + label_smoothing * uniform).mean()


DIRECTIONS = {"both": (True, True), "image_to_text": (True, False), "text_to_image": (False, True)}


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
    """sum_ij softplus(Z_ij) / n, Z = a @ b.T / t + bias, in row blocks of `chunk`: the sigmoid loss's negative
    part, every pair scored as a negative (the positives' correction is a dot product: `chunked_sigmoid_loss`).

    Forward keeps no block (`softplus_rows`, in two reused buffers); backward recomputes each block of Z, whose
    gradient is sigmoid(Z) / n, in one reused buffer. The temperature divides each [c, d] slice of `a`, and its gradient needs no block:
    sum_ij G_ij (Z_ij - bias) = sum(a / t * (G @ b)); the bias's is sum_ij G_ij."""

    @staticmethod
    def forward(ctx, a, b, t, bias, chunk: int):
        rows = min(chunk, len(a))
        total = softplus_rows(a / t, b, bias, chunk, a.new_empty(rows, len(b)), a.new_empty(rows, len(b)))
        ctx.save_for_backward(a, b, t, bias)
        ctx.chunk = chunk
        return total / len(a)

    @staticmethod
    def backward(ctx, grad):
        a, b, t, bias = ctx.saved_tensors
        n, m = a.shape[0], b.shape[0]
        need_a, need_b, need_t, need_bias = ctx.needs_input_grad[:4]
        grad_a = torch.empty_like(a) if need_a else None
        grad_b = torch.zeros_like(b) if need_b else None
        grad_t = torch.zeros((), dtype=a.dtype, device=a.device)
        grad_bias = torch.zeros((), dtype=a.dtype, device=a.device)
        rows = min(ctx.chunk, n)
        buffer = a.new_empty(rows, m)
        for s in range(0, n, ctx.chunk):
            c = min(ctx.chunk, n - s)
            scaled = a[s:s + c] / t  # [c, d]
            d = torch.mm(scaled, b.T, out=buffer[:c]).add_(bias).sigmoid_().mul_(grad / n)  # d loss / d Z
            if need_bias:
                grad_bias += d.sum()
            _block_gradients(d, b, scaled, t, grad_a, grad_b, grad_t, slice(s, s + c), need_a, need_t)
        return (grad_a, grad_b, grad_t.to(t.dtype) if need_t else None, grad_bias.to(bias.dtype) if need_bias else None,
                None)


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
    return _SoftplusSum.apply(a, b, t, bias, _chunk_rows(b.shape[0], a.element_size(), chunk))


def _chunk_rows(columns: int, itemsize: int, chunk: int | None) -> int:
    return chunk or max(1, CHUNK_BYTES // (itemsize * max(columns, 1)))


def _block_gradients(d: torch.Tensor, b: torch.Tensor, scaled: torch.Tensor, t: torch.Tensor, grad_a, grad_b,
                     grad_t: torch.Tensor, rows: slice, need_a: bool, need_t: bool) -> None:
    """Accumulate one row block's gradients, given d = d loss / d Z of the block Z = scaled @ b.T (scaled = a / t):
    grad_a[rows] = d @ b / t, grad_b += d.T @ scaled, grad_t -= sum(scaled * (d @ b)) / t (no [c, m] product
    needed for the temperature: sum_ij d_ij Z_ij = sum(scaled * (d @ b)))."""
    if need_a or need_t:
        g_b = d @ b  # [c, d]
        if need_t:
            grad_t -= (scaled * g_b).sum() / t
        if need_a:
            torch.div(g_b, t, out=grad_a[rows])
    if grad_b is not None:
        torch.addmm(grad_b, d.T, scaled, out=grad_b)  # (not addmm_: FLOP counters miss it)


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
            _block_gradients(d, b, scaled, t, grad_a, grad_b, grad_t, slice(s, s + c), need_a, need_t)
        return grad_a, grad_b, grad_t.to(t.dtype) if need_t else None, None, None


def chunked_cross_entropy(a: torch.Tensor, b: torch.Tensor, temperature: torch.Tensor, label_smoothing: float,
                          offset: int = 0, columns: bool = False, chunk: int | None = None) -> torch.Tensor:
    """Mean label-smoothed cross-entropy of the rows of `a @ b.T / t`, row i's positive at column offset + i;
    with `columns` (a and b aligned, offset 0) plus the same over the columns (both directions).

    Exact: the same value and gradients as the materialized form, in O(rows_per_chunk x len(b)) memory."""
    a, b = at_least_fp32(a), at_least_fp32(b)
    t = temperature.to(a.dtype)
    n, m = a.shape[0], b.shape[0]
    rows = _chunk_rows(m, a.element_size(), chunk)
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


# ---------------------------------------------------------------------------------------------- late interaction
# FILIP (Yao et al. 2022): one vector per image patch (or feature-map cell) and per text token, all in the
# joint space and L2-normalized. The similarity of image i and text j is token-wise:
#     i2t[i, j] = mean over i's patches p of  max over j's tokens k of <x_p, y_k>
#     t2i[i, j] = mean over j's tokens k  of  max over i's patches p of <x_p, y_k>
# A pooled dual encoder's score matrix has rank <= D; these have no such bound (tests/test_loss.py).
# Memory: the [images, texts, P, L] block of token similarities, against [images, texts] for pooled scores;
# `chunk` bounds it to [chunk, texts, P, L] when no gradient is needed (re-ranking), while the loss keeps every
# block for its backward: O(B_local x B_global x P x L) floats.

def late_interaction_pairs(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(i2t, t2i), both [Q, A, C]: for each of Q groups, its A images [Q, A, P, D] against its C texts
    [Q, C, L, D], masks [Q, A, P] / [Q, C, L] (a re-rank: one query against its K candidates, A or C = 1)."""
    sim = torch.einsum("qapd,qcld->qacpl", img, txt)  # [Q, A, C, P, L]
    txt_valid, img_valid = txt_mask.to(sim.dtype), img_mask.to(sim.dtype)
    best_token = sim.masked_fill(~txt_mask[:, None, :, None, :], float("-inf")).amax(dim=4)  # [Q, A, C, P]
    i2t = (best_token * img_valid[:, :, None, :]).sum(dim=3) / img_valid.sum(dim=2)[:, :, None]
    best_patch = sim.masked_fill(~img_mask[:, :, None, :, None], float("-inf")).amax(dim=3)  # [Q, A, C, L]
    t2i = (best_patch * txt_valid[:, None, :, :]).sum(dim=3) / txt_valid.sum(dim=2)[:, None, :]
    return i2t, t2i


def late_interaction(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
                     chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(i2t, t2i), both [Ni, Nt], of images `img` [Ni, P, D] and texts `txt` [Nt, L, D] (unit vectors) with
    bool masks [Ni, P] / [Nt, L] of their real patches and tokens (text padding is False); `chunk` images at
    a time."""
    rows = chunk or len(img)
    parts = [late_interaction_pairs(img[None, s:s + rows], img_mask[None, s:s + rows], txt[None], txt_mask[None])
             for s in range(0, len(img), rows)]
    return torch.cat([i2t[0] for i2t, _ in parts]), torch.cat([t2i[0] for _, t2i in parts])


def filip_loss(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
               temperature: torch.Tensor, label_smoothing: float = 0.1, direction: str = "both") -> torch.Tensor:
    """The contrastive loss over late-interaction scores (one process): rows of i2t / T (each image picks its
    text) plus rows of t2i.T / T (each text picks its image), label-smoothed as the pooled loss."""
    i2t, t2i = late_interaction(at_least_fp32(img), img_mask, at_least_fp32(txt), txt_mask)
    rows, columns = DIRECTIONS[direction]
    loss = i2t.new_zeros(())
    if rows:
        loss = loss + smoothed_cross_entropy(i2t / temperature, label_smoothing)
    if columns:
        loss = loss + smoothed_cross_entropy(t2i.T / temperature, label_smoothing)
    return loss
