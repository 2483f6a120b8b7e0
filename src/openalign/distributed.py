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


def _exchange(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`x` sent to rank + 1 while rank - 1's arrives into `out` (both posted at once: no rank waits on another's
    send)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = x.contiguous()
    out = torch.empty_like(x) if out is None else out
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return out


class _RingSoftplusSum(torch.autograd.Function):
    """sum over every rank's texts b of sum_ij softplus(a_i . b_j / t + bias), / len(a): the sigmoid loss's negative
    part of this rank's images against all texts, the texts passed around the ring instead of gathered.

    Forward: W steps, each scoring the block held (in row chunks) and passing it on; no block is kept. Backward:
    the ring again, each block travelling with its gradient so far; each rank adds its images' part
    (d Z.T @ a / t) and passes both on, and after W hops the gradient is back with the block's owner. Every step
    reuses the same buffers (one text block and its gradient, in flight and arriving, and [chunk, n] logits), so a
    rank's memory is the same whatever the world size."""

    @staticmethod
    def forward(ctx, a, b, t, bias, chunk: int):
        world = dist.get_world_size()
        rows = min(chunk, len(a))
        z, spare = a.new_empty(rows, len(b)), a.new_empty(rows, len(b))
        held, arriving = b.clone(), torch.empty_like(b)
        scaled = a / t  # the same every step
        total = a.new_zeros(())
        for step in range(world):
            total += loss_lib.softplus_rows(scaled, held, bias, chunk, z, spare)
            if step < world - 1:
                held, arriving = _exchange(held, arriving), held
        ctx.save_for_backward(a, b, t, bias)
        ctx.chunk = chunk
        return total / len(a)

    @staticmethod
    def backward(ctx, grad):
        a, b, t, bias = ctx.saved_tensors
        n, world, chunk = a.shape[0], dist.get_world_size(), ctx.chunk
        g_sum, grad_bias = torch.zeros_like(a), a.new_zeros(())  # g_sum: sum over blocks of dL/dZ @ block
        rows = min(chunk, n)
        d_buffer = a.new_empty(rows, len(b))
        scaled = a / t
        held, arriving = torch.cat([b, torch.zeros_like(b)]), torch.empty(2 * len(b), b.shape[1], dtype=b.dtype)
        for step in range(world):
            block, block_grad = held[:len(b)], held[len(b):]
            for s in range(0, n, chunk):
                c = min(chunk, n - s)
                d = torch.mm(scaled[s:s + chunk], block.T, out=d_buffer[:c]).add_(bias).sigmoid_().mul_(grad / n)
                grad_bias += d.sum()
                g_sum[s:s + chunk].addmm_(d, block)
                block_grad.addmm_(d.T, scaled[s:s + chunk])
            # the block and its gradient so far, on to the next rank; after the last step, the gradient goes home
            held, arriving = _exchange(held, arriving), held
        grad_t = -(scaled.reshape(-1) @ g_sum.reshape(-1)) / t  # sum_ij G_ij (Z_ij - bias) = sum(a / t * (G @ b))
        return g_sum.div_(t), held[len(b):].clone(), grad_t.to(t.dtype), grad_bias.to(bias.dtype), None


def ring_sigmoid_loss(img: torch.Tensor, txt: torch.Tensor, temperature: torch.Tensor, bias: torch.Tensor,
                      implementation: str = "auto") -> torch.Tensor:
    """The same share as `gathered_sigmoid_loss`, with the texts passed around a ring of neighbours instead of
    gathered (big_vision's and OpenCLIP's "neighbour exchange"), forward and again in the backward
    (`_RingSoftplusSum`): per-rank memory stays flat in the number of ranks. The positives, all in the rank's own
    block, are one dot product."""
    img, txt = loss_lib.at_least_fp32(img), loss_lib.at_least_fp32(txt)
    t, b = temperature.to(img.dtype), bias.to(img.dtype)
    n = img.shape[0]
    chunked = loss_lib.chunked(implementation, n * dist.get_world_size())
    chunk = loss_lib._chunk_rows(n, img.element_size(), None) if chunked else n  # rows per [chunk, n] block
    positive = (img * txt).sum(dim=1).mean() / t + b  # this rank's own pairs
    return _RingSoftplusSum.apply(img, txt, t, b, chunk) - positive


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
    return loss_lib.naive_sigmoid_loss(img, txt_all, temperature, bias, offset=offset)


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
