"""Optimizer construction: LAMB (pytorch-optimizer) or AdamW, with the paper's weight-decay rule.

Weight decay (1e-5) applies to weight matrices, convolution kernels and embeddings only: never to
biases, normalization parameters or the temperature. The temperature has its own group so that its
learning rate can be scaled (`optim.temperature_lr_scale`).
"""

from __future__ import annotations

import torch
from pytorch_optimizer import Lamb

from openalign.config import OptimConfig
from openalign.model.dual_encoder import DualEncoder


def param_groups(model: DualEncoder, cfg: OptimConfig) -> list[dict]:
    decay, no_decay, temperature = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name in ("align.temperature", "logit_bias"):
            temperature.append(p)
        elif p.ndim < 2:  # biases, BatchNorm/LayerNorm scales and shifts
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0, "name": "no_decay"},
    ]
    if temperature:
        groups.append({"params": temperature, "weight_decay": 0.0, "lr_scale": cfg.temperature_lr_scale,
                       "name": "temperature"})
    return groups


def build_optimizer(model: DualEncoder, cfg: OptimConfig, shard: bool = False) -> torch.optim.Optimizer:
    """LAMB (or AdamW) over the paper's parameter groups; with `shard` (under torchrun), ZeRO-1: each rank
    keeps the optimizer state of its share of whole parameters, updates them, and broadcasts them, so
    LAMB's per-tensor trust ratio is exact while its two moments take 1/world of the memory."""
    groups = param_groups(model, cfg)
    if cfg.name == "lamb":
        # LAMB proper: decay enters the update before the trust ratio (not decoupled as in AdamW).
        kind, options = Lamb, {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps, "weight_decay": cfg.weight_decay,
                               "weight_decouple": False}
    elif cfg.name == "adamw":
        kind, options = torch.optim.AdamW, {"lr": cfg.lr, "betas": cfg.betas, "eps": cfg.eps,
                                            "weight_decay": cfg.weight_decay}
    else:
        raise ValueError(f"optim.name must be lamb or adamw, not {cfg.name!r}")
    if shard:
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
