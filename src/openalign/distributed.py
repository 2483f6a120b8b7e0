"""Multi-process training: the torchrun environment, the process group, and the exact contrastive loss
over the global batch.

Each rank encodes its own B/W pairs, gathers both modalities' embeddings once (an autograd-aware
all_gather, whose backward sums every rank's gradient into the owner's slice), and computes the
cross-entropy of its *local rows* against *all* gathered columns, in both directions:

    L_r = CE(img_r @ txt_all.T / t, positives at r*n + i) + CE(txt_r @ img_all.T / t, same)

The mean of L_r over ranks is the single-process loss of the whole batch, and DDP's gradient averaging
makes every parameter gradient equal to the single-process one (tests/test_distributed.py checks both
in fp64 on 2 gloo processes). BatchNorm statistics are per device batch, as in the paper (16 pairs per
TPU core); the running statistics are averaged over ranks before each checkpoint and evaluation.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from openalign import loss as loss_lib


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1  # processes on this machine

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def from_env() -> Dist:
    """The rank layout torchrun (or SLURM via torchrun) exports; a single process without it."""
    return Dist(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto`: this rank's GPU when there is one, else the CPU; `cuda`: this rank's GPU; else as named."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(f"cuda:{local_rank}") if name == "cuda" else torch.device(name)


def init(device_type: str) -> Dist:
    """Join the process group when launched by torchrun: NCCL on GPUs, gloo on CPUs."""
    layout = from_env()
    if layout.active and not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(layout.local_rank)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return layout


def gather(x: torch.Tensor) -> torch.Tensor:
    """[W * n, ...] every rank's `x` in rank order, with gradients flowing back to each owner."""
    import torch.distributed.nn.functional as dist_fn

    with warnings.catch_warnings():  # deprecated in favour of a private API; public and correct meanwhile
        warnings.filterwarnings("ignore", message=".*all_gather is deprecated", category=FutureWarning)
        out = torch.cat(dist_fn.all_gather(x.contiguous()))
    if out.requires_grad:
        # its backward exchanges the gradient's slices as raw memory (gloo: all-to-all): a strided gradient
        # (einsum's, for token vectors) would arrive scrambled, so it is made contiguous first
        out.register_hook(lambda grad: grad.contiguous())
    return out


def gathered_softmax_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor,
                          label_smoothing: float = 0.1, implementation: str = "auto",
                          direction: str = "both") -> torch.Tensor:
    """This rank's share of the global-batch loss (see the module docstring); equal rank batch sizes."""
    n = img.shape[0]
    img_all, txt_all = gather(img), gather(txt)  # one all_gather per modality
    offset = dist.get_rank() * n
    chunked = loss_lib.chunked(implementation, len(img_all))
    targets = torch.arange(offset, offset + n, device=img.device)

    def term(queries, candidates):  # this rank's rows of queries @ candidates.T, positives at offset + i
        if chunked:
            return loss_lib.chunked_cross_entropy(queries, candidates, temperature, label_smoothing, offset=offset)
        logits = loss_lib.at_least_fp32(queries) @ loss_lib.at_least_fp32(candidates).T / temperature
        return F.cross_entropy(logits, targets, label_smoothing=label_smoothing)

    rows, columns = loss_lib.DIRECTIONS[direction]
    return sum(term(*pair) for pair, kept in (((img, txt_all), rows), ((txt, img_all), columns)) if kept)


class _NeighbourExchange(torch.autograd.Function):
    """`x` sent to rank + 1 while rank - 1's arrives (both at once: no rank waits on another's send); backward
    sends the gradient the other way, so each block's gradient travels back the ring to where it came from."""

    @staticmethod
    def forward(ctx, x):
        return _exchange(x, +1)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, -1)


def _exchange(x: torch.Tensor, step: int) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    x = x.contiguous()
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, (rank + step) % world), dist.P2POp(dist.irecv, out, (rank - step) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return out


def ring_sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                      implementation: str = "auto") -> torch.Tensor:
    """The same share as `gathered_sigmoid_loss`, with the texts passed around a ring instead of gathered (big_vision's
    and OpenCLIP's "neighbour exchange"): W steps, each scoring this rank's images against the block it holds
    (every pair as a negative) and passing the block on; the positives, all in the rank's own block, are one dot
    product. A rank holds one other block at a time."""
    img, block = loss_lib.at_least_fp32(img), loss_lib.at_least_fp32(txt)
    t, b = temperature.to(img.dtype), bias.to(img.dtype)
    n, world = img.shape[0], dist.get_world_size()
    chunk = None if loss_lib.chunked(implementation, n * world) else n  # naive: one block of this rank's rows
    loss = -((img * block).sum(dim=1).mean() / t + b)  # the positives: this rank's own pairs
    for step in range(world):
        loss = loss + loss_lib.softplus_sum(img, block, t, b, chunk)
        if step < world - 1:
            block = _NeighbourExchange.apply(block)
    return loss


def gathered_sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                          implementation: str = "auto") -> torch.Tensor:
    """This rank's share of the global-batch sigmoid loss: its images against every rank's texts (one all_gather;
    the texts' gradients flow back to their owners), its positives at rank * n + i. The mean over ranks is the
    single-process loss of the whole batch (each pair is scored once, so no second direction is needed); chunked,
    no [n, B] block is kept for the backward."""
    n = img.shape[0]
    txt_all = gather(txt)
    offset = dist.get_rank() * n
    if loss_lib.chunked(implementation, len(txt_all)):
        return loss_lib.chunked_sigmoid_loss(img, txt_all, temperature, bias, offset=offset)
    logits = loss_lib.at_least_fp32(img) @ loss_lib.at_least_fp32(txt_all).T / temperature + bias  # [n, B]
    labels = -torch.ones_like(logits)
    labels[torch.arange(n), torch.arange(offset, offset + n)] = 1.0
    return -F.logsigmoid(labels * logits).sum() / n


def gathered_filip_loss(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
                        temperature: torch.Tensor, label_smoothing: float = 0.1, direction: str = "both") -> torch.Tensor:
    """This rank's share of the global-batch late-interaction loss: its images' token-wise scores against every
    rank's texts, and its texts' against every rank's images (loss.filip_loss; equal rank batch sizes). Texts
    are padded to the longest over ranks (masked) so that they gather."""
    n = img.shape[0]
    longest = torch.tensor([txt.shape[1]], device=txt.device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    pad = int(longest.item()) - txt.shape[1]
    if pad:
        txt, txt_mask = F.pad(txt, (0, 0, 0, pad)), F.pad(txt_mask, (0, pad))
    img, txt = loss_lib.at_least_fp32(img), loss_lib.at_least_fp32(txt)
    offset = dist.get_rank() * n
    targets = torch.arange(offset, offset + n, device=img.device)
    rows, columns = loss_lib.DIRECTIONS[direction]
    loss = img.new_zeros(())
    if rows:
        txt_all, txt_mask_all = gather(txt), gather(txt_mask.to(torch.uint8)).bool()
        i2t = loss_lib.late_interaction(img, img_mask, txt_all, txt_mask_all)[0]  # [n, B]
        loss = loss + F.cross_entropy(i2t / temperature, targets, label_smoothing=label_smoothing)
    if columns:
        img_all, img_mask_all = gather(img), gather(img_mask.to(torch.uint8)).bool()
        t2i = loss_lib.late_interaction(img_all, img_mask_all, txt, txt_mask)[1]  # [B, n]
        loss = loss + F.cross_entropy(t2i.T / temperature, targets, label_smoothing=label_smoothing)
    return loss


def mean_over_ranks(value: float, layout: Dist) -> float:
    """The mean of a per-rank number (logging only: one small all_reduce)."""
    if not layout.active:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item()) / layout.world


def average_batchnorm_statistics(model: torch.nn.Module, layout: Dist) -> None:
    """Make every rank's BatchNorm running statistics their mean over ranks (before checkpoints/eval)."""
    if not layout.active:
        return
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            for buffer in (module.running_mean, module.running_var):
                dist.all_reduce(buffer)
                buffer.div_(layout.world)


def all_objects(obj, layout: Dist) -> list:
    """Every rank's `obj` (picklable), in rank order; [obj] in a single process."""
    if not layout.active:
        return [obj]
    out = [None] * layout.world
    dist.all_gather_object(out, obj)
    return out


def main_first(layout: Dist, fn):
    """`fn(main)` on rank 0, then, once it is done, on the other ranks (rank 0 creates what they read)."""
    if layout.main:
        result = fn(True)
    barrier(layout)
    return result if layout.main else fn(False)


def shutdown() -> None:
    """Leave the process group together at the end of a command (every rank calls it). A rank that exits
    with the group alive while another still works can abort in gloo's teardown ("terminate called
    without an active exception", seen here under torchrun)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(layout: Dist) -> None:
    if layout.active:
        dist.barrier()
