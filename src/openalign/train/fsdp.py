"""FSDP for the largest towers (`train.fsdp=true`, under torchrun): PyTorch's FSDP2 (`fully_shard`).

Every EfficientNet block and every BERT layer is its own FSDP unit, and the root takes the rest. So
parameters, gradients and optimizer state each take 1/world of their memory on a device, and only one
unit's parameters are whole at a time, in forward and in backward. The loss is unchanged: rows are
gathered exactly as under DDP, gradients are averaged over ranks (reduce-scatter).

Three details:
- Scalars (the temperature, SigLIP's bias) cannot be sharded. They stay plain tensors, replicated on
  every rank, and their gradients are averaged here with one all_reduce.
- FSDP2 shards contiguous parameters only, so the image tower's weights stay in the default memory
  format. Its inputs are still channels_last (`DualEncoder.encode_image`), and that is where the depthwise
  convolutions' speed comes from (the weights' layout adds little).
- LAMB's trust ratio needs whole-tensor norms: `optim.FsdpLamb` adds the shards' squared sums over ranks.

Checkpoints hold the whole model and optimizer state (gathered to rank 0's CPU), in the same format as
the unsharded runs for the model; evaluation and the saved model run on a whole copy on rank 0.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from openalign.config import LossConfig
from openalign.model.dual_encoder import DualEncoder

WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)

# Our towers return [CLS] as a view of the last hidden state; nothing changes it in place.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def wrap(model: DualEncoder) -> None:
    """`model` in place as FSDP units over the default process group: its parameters split across the ranks."""
    model.vision_tower.to(memory_format=torch.contiguous_format)
    for block in model.tower_blocks():
        fully_shard(block)
    fully_shard(model, ignored_params={p for p in model.parameters() if p.ndim == 0})


def is_wrapped(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def average_replicated_grads(model: torch.nn.Module) -> None:
    """The mean over ranks of the gradients FSDP does not reduce: those of the unsharded scalars."""
    for p in model.parameters():
        if p.grad is not None and not isinstance(p, DTensor):
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def clip_grad_norm_(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` over sharded and replicated gradients together: the shards'
    squared sums are added over ranks, the replicated ones counted once."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    sharded = [g.to_local() for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    squares = torch.zeros((), dtype=torch.float64, device=grads[0].device)
    for g in sharded:
        squares += g.double().square().sum()
    dist.all_reduce(squares)
    for g in plain:
        squares += g.double().square().sum()
    total = squares.sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in sharded + plain:
        g.mul_(scale.to(g.dtype))
    return total


def model_state(model: torch.nn.Module) -> dict:
    """The whole state dict (plain tensors on CPU) on rank 0, {} on the others; every rank must call."""
    return get_model_state_dict(model, options=WHOLE)


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole optimizer state on rank 0 (keyed by parameter name), {} on the others; every rank must call."""
    return get_optimizer_state_dict(model, optimizer, options=WHOLE)


def load_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optimizer_sd: dict) -> None:
    """Shard a whole checkpoint (as written by `model_state` / `optimizer_state`) into every rank."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_sd, options=options)


def whole_copy(model: torch.nn.Module, loss: LossConfig) -> DualEncoder | None:
    """An unsharded copy of the model on rank 0's CPU (None on the others); every rank must call."""
    state = model_state(model)
    if dist.get_rank() != 0:
        return None
    copy = DualEncoder(model.cfg, loss)
    copy.load_state_dict(state, assign=True)  # the gathered tensors themselves (and their dtype)
    return copy.train(model.training)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor; a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t
