"""FILIP's late interaction (Yao et al. 2022; loss.kind=filip): the paper's softmax loss over the pooled embeddings
plus the same loss over token-wise scores of patch (feature-map cell) and token vectors, so that the pooled
embeddings a two-stage search shortlists with are trained too.

One vector per image patch and per text token, all in the joint space and L2-normalized. The similarity of image i
and text j is token-wise:
    i2t[i, j] = mean over i's patches p of  max over j's tokens k of <x_p, y_k>
    t2i[i, j] = mean over j's tokens k  of  max over i's patches p of <x_p, y_k>
A pooled dual encoder's score matrix has rank <= D; these have no such bound (tests/test_loss.py).
Memory: the [images, texts, P, L] block of token similarities, against [images, texts] for pooled scores; `chunk`
bounds it to [chunk, texts, P, L] when no gradient is needed (re-ranking), while the loss keeps every block for its
backward: O(B_local x B_global x P x L) floats.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from openalign import distributed
from openalign.loss.base import DIRECTIONS, at_least_fp32, register, smoothed_cross_entropy
from openalign.loss.softmax import Softmax

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


def gathered_filip_loss(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
                        temperature: torch.Tensor, label_smoothing: float = 0.1,
                        direction: str = "both") -> torch.Tensor:
    """This rank's share of the global-batch late-interaction loss: its images' token-wise scores against every
    rank's texts, and its texts' against every rank's images (filip_loss; equal rank batch sizes). Texts
    are padded to the longest over ranks (masked) so that they gather."""
    n = img.shape[0]
    longest = torch.tensor([txt.shape[1]], device=txt.device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    pad = int(longest.item()) - txt.shape[1]
    if pad:
        txt, txt_mask = F.pad(txt, (0, 0, 0, pad)), F.pad(txt_mask, (0, pad))
    img, txt = at_least_fp32(img), at_least_fp32(txt)
    offset = dist.get_rank() * n
    rows, columns = DIRECTIONS[direction]
    loss = img.new_zeros(())
    if rows:
        txt_all, txt_mask_all = distributed.gather(txt), distributed.gather(txt_mask.to(torch.uint8)).bool()
        i2t = late_interaction(img, img_mask, txt_all, txt_mask_all)[0]  # [n, B]
        loss = loss + smoothed_cross_entropy(i2t / temperature, label_smoothing, offset=offset)
    if columns:
        img_all, img_mask_all = distributed.gather(img), distributed.gather(img_mask.to(torch.uint8)).bool()
        t2i = late_interaction(img_all, img_mask_all, txt, txt_mask)[1]  # [B, n]
        loss = loss + smoothed_cross_entropy(t2i.T / temperature, label_smoothing, offset=offset)
    return loss


@register
class Filip(Softmax):
    """The pooled softmax (as loss.kind=softmax, without fewer negatives) plus the late-interaction term; it reads
    the towers' token vectors, which gradient caching does not keep."""

    name = "filip"
    tokens = True
    options = frozenset({"label_smoothing", "direction"})

    def __call__(self, img, txt, scales, generator=None):
        pooled = super().__call__(img, txt, scales, generator)
        c = self.cfg
        args = (img.tokens, img.mask, txt.tokens, txt.mask, self.temperature(scales), c.label_smoothing, c.direction)
        return pooled + (gathered_filip_loss(*args) if self.world > 1 else filip_loss(*args))
