"""Gradient caching equals the direct step (BatchNorm per micro-batch, dropout replayed), in fp64."""

import dataclasses
from contextlib import nullcontext

import pytest
import torch

from openalign import presets
from openalign.config import LossConfig
from openalign.distributed import Dist
from openalign.model.dual_encoder import DualEncoder, Encoding
from openalign.train.step import batch_loss, forward_backward


def make_model(dropout: float = 0.0, loss: LossConfig = LossConfig()) -> DualEncoder:
    """The tiny model in fp64; with the late-interaction loss, tiny-vit (16 patches per image, not one cell)."""
    cfg = presets.get("tiny-vit" if loss.kind == "filip" else "tiny").model
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, dropout=dropout))
    torch.manual_seed(0)
    return DualEncoder(cfg, loss).double().train()


def make_batch(n: int = 8, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g)
    mask = (torch.arange(8)[None, :] < lengths[:, None]).long()
    return {"pixel_values": torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64),
            "input_ids": torch.randint(5, 300, (n, 8), generator=g) * mask, "attention_mask": mask}


def direct_reference(model: DualEncoder, batch: dict, parts: int, loss_cfg: LossConfig) -> torch.Tensor:
    """The big-batch step with BatchNorm per part: each part forward with a graph, one loss, one backward."""
    img, txt = [], []
    for chunk in zip(*(batch[k].chunk(parts) for k in ("pixel_values", "input_ids", "attention_mask"))):
        i, t = model(*chunk)
        img.append(i)
        txt.append(t)

    def joined(parts: list[Encoding]) -> Encoding:
        tokens = parts[0].tokens is not None
        return Encoding(torch.cat([p.embeds for p in parts]), torch.cat([p.features for p in parts]),
                        torch.cat([p.tokens for p in parts]) if tokens else None,
                        torch.cat([p.mask for p in parts]) if tokens else None)

    loss = batch_loss(model, joined(img), joined(txt), loss_cfg)
    loss.backward()
    return loss.detach()


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind,direction", [("softmax", "both"), ("sigmoid", "both"), ("softmax", "text_to_image")])
def test_gradient_caching_equals_the_direct_step(kind, direction):
    loss_cfg = LossConfig(kind=kind, label_smoothing=0.1, direction=direction)
    batch = make_batch()
    ref_model = make_model(dropout=0.3, loss=loss_cfg)
    torch.manual_seed(7)
    ref_loss = direct_reference(ref_model, batch, parts=4, loss_cfg=loss_cfg)
    ref_rng = torch.get_rng_state()
    model = make_model(dropout=0.3, loss=loss_cfg)
    torch.manual_seed(7)
    loss = forward_backward(model, model, batch, loss_cfg, 2, Dist(), torch.device("cpu"), nullcontext)
    assert torch.equal(torch.get_rng_state(), ref_rng)  # the stream continues as after the direct step
    assert abs(loss.item() - ref_loss.item()) <= 1e-10
    ours, ref = grads(model), grads(ref_model)
    assert ours.keys() == ref.keys() and ("logit_scale" if kind == "sigmoid" else "align.temperature") in ours
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-8, atol=1e-12, msg=name)
    # BatchNorm running statistics were updated once per micro-batch, as in the direct step
    for (name, a), (_, b) in zip(model.named_buffers(), ref_model.named_buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)


def test_a_micro_batch_as_large_as_the_batch_is_the_direct_step():
    batch, loss_cfg = make_batch(), LossConfig()
    a, b = make_model(), make_model()
    forward_backward(a, a, batch, loss_cfg, 8, Dist(), torch.device("cpu"), nullcontext)
    direct_reference(b, batch, parts=1, loss_cfg=loss_cfg)
    ours, ref = grads(a), grads(b)
    # every trainable tensor has a gradient on both sides (a step that computed none would pass a loop over none)
    assert ours.keys() == ref.keys() == {n for n, p in a.named_parameters() if p.requires_grad}
    assert sum(float(g.abs().sum()) for g in ref.values()) > 0
    for name, g in ref.items():
        torch.testing.assert_close(ours[name], g, rtol=1e-10, atol=1e-14, msg=name)


def test_gradient_caching_is_not_a_step_with_one_batchnorm_over_the_whole_batch():
    # docs/scale.md's claim, with its limit: equal to the direct step whose BatchNorm groups are the micro-batches
    # (above), but not to a direct step normalizing all pairs together.
    batch, loss_cfg = make_batch(), LossConfig()
    cached, whole = make_model(), make_model()
    loss = forward_backward(cached, cached, batch, loss_cfg, 2, Dist(), torch.device("cpu"), nullcontext)
    assert abs(loss.item() - direct_reference(whole, batch, parts=1, loss_cfg=loss_cfg).item()) > 1e-3
