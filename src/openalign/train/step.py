"""One optimization step's forward and backward: direct, or with gradient caching.

Direct: both towers on the rank's whole batch, the loss, backward.

Gradient caching (GradCache, Gao et al. 2021; `train.micro_batch` below the rank's batch): the towers run on
micro-batches without a graph; the loss of the whole batch gives the gradient of every embedding (and of the
temperature); each micro-batch is then run again with a graph, replaying its random state (dropout), and
back-propagated from its cached embedding gradients. Memory is that of one micro-batch, and the result equals the
direct step with BatchNorm statistics per micro-batch (not a direct step with one BatchNorm over the whole batch: its
losses differ, docs/scale.md) — the paper's setup, where each TPU core normalizes its own 16 pairs
(tests/train/test_step.py checks equality in fp64). The first pass leaves BatchNorm running statistics as they were,
so they are updated once per micro-batch, as in the direct step.

The loss is computed outside autocast: logits and loss are fp32 under bf16 training.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from openalign import distributed
from openalign import loss as loss_lib
from openalign.config import LossConfig
from openalign.data import transforms
from openalign.model.dual_encoder import DualEncoder, Encoding
from openalign.train import fsdp


def batch_loss(core: DualEncoder, img: Encoding, txt: Encoding, cfg: LossConfig,
               layout: distributed.Dist = distributed.Dist(), generator: torch.Generator | None = None,
               scales: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The configured loss (loss_lib.create) of one batch's encodings; `scales` replaces the model's learned scalars
    (gradient caching differentiates with respect to detached copies)."""
    loss = loss_lib.create(cfg, layout.world)
    return loss(img, txt, {**core.logit_scalars(), **(scales or {})}, generator)


def _rng_state(device: torch.device):
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _running_statistics(core: DualEncoder) -> dict[str, torch.Tensor]:
    return {name: buf for name, buf in core.named_buffers()
            if name.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def forward_backward(model: torch.nn.Module, core: DualEncoder, batch: dict, loss_cfg: LossConfig, micro_batch: int,
                     layout: distributed.Dist, device: torch.device, autocast, generator=None) -> torch.Tensor:
    """Accumulate the step's gradients into the parameters; returns the (detached) loss.

    `model` is what runs the towers (DDP-wrapped under torchrun; with FSDP, `core` itself), `core` the
    DualEncoder inside it; `autocast` a context factory for the towers' forward. Gradients are the mean
    over ranks."""
    loss = _forward_backward(model, core, batch, loss_cfg, micro_batch, layout, device, autocast, generator)
    if fsdp.is_wrapped(model):
        fsdp.average_replicated_grads(model)
    return loss


def _forward_backward(model, core, batch, loss_cfg, micro_batch, layout, device, autocast, generator):
    pixels = transforms.to_unit_range(batch["pixel_values"].to(device, non_blocking=True))  # uint8 -> [-1, 1]
    ids = batch["input_ids"].to(device, non_blocking=True)
    mask = batch["attention_mask"].to(device, non_blocking=True)
    n = pixels.shape[0]
    if not micro_batch or micro_batch >= n:
        with autocast():
            img, txt = model(pixels, ids, mask)
        loss = batch_loss(core, img, txt, loss_cfg, layout, generator)
        loss.backward()
        return loss.detach()

    parts = [slice(s, s + micro_batch) for s in range(0, n, micro_batch)]
    states, img_parts, txt_parts = [], [], []
    statistics = {k: v.clone() for k, v in _running_statistics(core).items()}
    with torch.no_grad():  # pass 1: embeddings only
        for part in parts:
            states.append(_rng_state(device))
            with autocast():
                img, txt = model(pixels[part], ids[part], mask[part])
            img_parts.append(loss_lib.at_least_fp32(img.embeds))  # fp32 under bf16 autocast
            txt_parts.append(loss_lib.at_least_fp32(txt.embeds))
        for name, buf in _running_statistics(core).items():
            buf.copy_(statistics[name])
    after = _rng_state(device)
    img = torch.cat(img_parts).requires_grad_()
    txt = torch.cat(txt_parts).requires_grad_()
    params = core.learned_scalars()
    scales = {k: p.detach().requires_grad_() for k, p in params.items()}
    loss = batch_loss(core, Encoding(img, None), Encoding(txt, None), loss_cfg, layout, generator, scales)
    loss.backward()  # d loss / d embeddings (and temperature), for the whole batch
    ddp = isinstance(model, DistributedDataParallel)
    for i, part in enumerate(parts):  # pass 2: each micro-batch again, with a graph and its cached gradients
        _set_rng_state(states[i], device)
        last = i == len(parts) - 1
        # DDP reduces once, with the last micro-batch. FSDP reduce-scatters each one: its gradients then
        # accumulate sharded (deferring would keep whole unsharded gradients on every rank).
        with model.no_sync() if ddp and not last else nullcontext():
            with autocast():
                img_part, txt_part = model(pixels[part], ids[part], mask[part])
            roots = [img_part.embeds, txt_part.embeds]
            grads = [img.grad[part].to(img_part.embeds.dtype), txt.grad[part].to(txt_part.embeds.dtype)]
            if last:  # the temperature's gradient joins the synchronized backward, so DDP averages it
                extra = [(p * scales[k].grad.to(p.dtype)).sum() for k, p in params.items()]
                roots, grads = roots + extra, grads + [torch.ones_like(r) for r in extra]
            torch.autograd.backward(roots, grads)
    _set_rng_state(after, device)
    return loss.detach()
