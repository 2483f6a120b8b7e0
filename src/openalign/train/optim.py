"""Optimizer construction: LAMB (pytorch-optimizer) or AdamW, with the paper's weight-decay rule.

Weight decay (1e-5) applies to weight matrices, convolution kernels and embeddings only: never to
biases, normalization parameters or the temperature. The temperature has its own group so that its
learning rate can be scaled (`loss.temperature.lr_scale`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from pytorch_optimizer import Lamb
from torch.distributed.tensor import DTensor, Shard

from openalign.config import OptimConfig
from openalign.model.dual_encoder import DualEncoder
from openalign.train import fsdp


def param_groups(model: DualEncoder, cfg: OptimConfig, temperature_lr_scale: float = 1.0) -> list[dict]:
    """Decayed weight matrices, undecayed biases and norms, and the temperature with the logit bias when one is
    learned (`model.learned_scalars()`: no decay, their learning rate times loss.temperature.lr_scale)."""
    decay, no_decay = [], []
    temperature = list(model.learned_scalars().values())
    scalars = {id(p) for p in temperature}
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in scalars:
            continue
        elif p.ndim < 2:  # biases, BatchNorm/LayerNorm scales and shifts
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0, "name": "no_decay"},
    ]
    if temperature:
        groups.append({"params": temperature, "weight_decay": 0.0, "lr_scale": temperature_lr_scale,
                       "name": "temperature"})
    return groups


class FsdpLamb(torch.optim.Optimizer):
    """pytorch-optimizer's `Lamb` as we configure it (coupled weight decay, no rectification, weight norm
    clamped at 10), for parameters sharded by FSDP2 (DTensors).

    `Lamb` cannot step DTensors: its trust ratio takes the norm of a sharded tensor, a partial result that
    DTensor refuses to clamp in place. Here each rank updates the moments of its own shards, and the
    per-tensor norms of the weights and updates come from the shards' squared sums, added over ranks in
    one all_reduce per group and step. The update equals `Lamb`'s (tests/train/test_optim.py, and under
    two FSDP processes tests/test_distributed.py). Plain tensors (the temperature, kept out of FSDP) are
    stepped whole."""

    clamp = Lamb.clamp

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            weights, grads, means, squares = [], [], [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float64)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                weights.append(fsdp.local(p))
                grads.append(fsdp.local(p.grad))
                means.append(fsdp.local(state["exp_avg"]))
                squares.append(fsdp.local(state["exp_avg_sq"]))
            torch._foreach_mul_(means, beta1)
            torch._foreach_add_(means, grads, alpha=1.0 - beta1)
            torch._foreach_mul_(squares, beta2)
            torch._foreach_addcmul_(squares, grads, grads, value=1.0 - beta2)
            updates = torch._foreach_sqrt(squares)
            torch._foreach_add_(updates, group["eps"])
            torch._foreach_reciprocal_(updates)
            torch._foreach_mul_(updates, means)  # exp_avg / (sqrt(exp_avg_sq) + eps)
            if group["weight_decay"] > 0:
                torch._foreach_add_(updates, weights, alpha=group["weight_decay"])
            weight_norms, update_norms = _tensor_norms(params, weights, updates)
            weight_norms.clamp_(max=self.clamp)
            ratios = torch.where((weight_norms > 0) & (update_norms > 0),
                                 weight_norms / (update_norms + group["eps"]), 1.0)
            for p, update, ratio in zip(params, updates, ratios.tolist()):
                step_size = group["lr"] / (1.0 - beta1 ** self.state[p]["step"].item())
                fsdp.local(p).add_(update, alpha=-step_size * ratio)
        return loss


def _tensor_norms(params, weights, updates) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole-tensor norms of each weight and update, in float64, from the local shards: the squared
    sums of sharded tensors are added over their ranks (one all_reduce per mesh)."""
    sums = torch.stack([torch.stack([w.double().square().sum(), u.double().square().sum()])
                        for w, u in zip(weights, updates)])  # [n, 2]
    groups = {}
    for i, p in enumerate(params):
        if isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements):
            groups.setdefault(p.device_mesh, []).append(i)
    for mesh, rows in groups.items():
        index = torch.tensor(rows, device=sums.device)
        part = sums.index_select(0, index)
        dist.all_reduce(part, group=mesh.get_group())
        sums.index_copy_(0, index, part)
    norms = sums.sqrt()
    return norms[:, 0], norms[:, 1]


def build_optimizer(model: DualEncoder, cfg: OptimConfig, shard_optimizer: bool = False, fsdp: bool = False,
                    temperature_lr_scale: float = 1.0) -> torch.optim.Optimizer:
    """LAMB (or AdamW) over the paper's parameter groups.

    With `shard_optimizer` (under torchrun), ZeRO-1: each rank keeps the optimizer state of its share of whole
    parameters, updates them, and broadcasts them, so LAMB's per-tensor trust ratio is exact while its
    two moments take 1/world of the memory. With `fsdp`, the model's parameters are already sharded
    (train/fsdp.py): LAMB is `FsdpLamb`, AdamW steps the shards as they are."""
    groups = param_groups(model, cfg, temperature_lr_scale)
    if cfg.name == "lamb" and fsdp:
        return FsdpLamb(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "lamb":
        # LAMB proper: decay enters the update before the trust ratio (not decoupled as in AdamW).
        kind, options = Lamb, {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay,
                               "weight_decouple": False}
    elif cfg.name == "adamw":
        kind, options = torch.optim.AdamW, {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps,
                                            "weight_decay": cfg.weight_decay}
    else:
        raise ValueError(f"optim.name must be lamb or adamw, not {cfg.name!r}")
    if shard_optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=kind, **options)
    return kind(groups, **options)


def full_state_dict(optimizer: torch.optim.Optimizer, main: bool) -> dict | None:
    """The whole optimizer state on the main rank (every rank must call: ZeRO gathers the shards)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if main else None


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
