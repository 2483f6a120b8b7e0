"""Multi-process training: the torchrun environment, the process group, and the collectives the losses and the
trainer use (`gather`: an autograd-aware all_gather whose backward sums every rank's gradient into the owner's
slice; `exchange`: a block passed to the next rank of a ring). The losses over the global batch are each loss kind's
own (openalign/loss/).

BatchNorm statistics are per device batch, as in the paper (16 pairs per TPU core); the running statistics are
averaged over ranks before each checkpoint and evaluation.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Dist", "all_objects", "average_batchnorm_statistics", "barrier", "exchange", "from_env", "gather", "init",
           "main_first", "mean_over_ranks", "resolve_device", "shutdown"]


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


def exchange(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`x` sent to rank + 1 while rank - 1's arrives into `out` (both posted at once: no rank waits on another's
    send)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = x.contiguous()
    out = torch.empty_like(x) if out is None else out
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return out


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
