import dataclasses

import pytest
import torch
from pytorch_optimizer import Lamb

from openalign import presets
from openalign.config import LossConfig, TemperatureConfig
from openalign.model.dual_encoder import DualEncoder
from openalign.train.optim import build_optimizer, param_groups


def test_weight_decay_only_on_weight_tensors_never_on_temperature():
    cfg = presets.get("tiny")
    model = DualEncoder(cfg.model)
    groups = {g["name"]: g for g in param_groups(model, cfg.optim)}
    names = {id(p): n for n, p in model.named_parameters()}
    assert groups["decay"]["weight_decay"] == cfg.optim.weight_decay
    assert all(p.ndim >= 2 for p in groups["decay"]["params"])
    no_decay = [names[id(p)] for p in groups["no_decay"]["params"]]
    assert any(n.endswith(".bias") for n in no_decay) and any("LayerNorm" in n or "batchnorm" in n.lower()
                                                                for n in no_decay)
    assert [names[id(p)] for p in groups["temperature"]["params"]] == ["align.temperature"]
    assert groups["temperature"]["weight_decay"] == 0.0
    n_total = sum(len(g["params"]) for g in groups.values())
    assert n_total == len([p for p in model.parameters() if p.requires_grad])


def one_step(model, optimizer, seed: int = 0) -> dict:
    """Fixed random gradients on every parameter, one step (lr 1e-2); the parameters after it."""
    g = torch.Generator().manual_seed(seed)
    for group in optimizer.param_groups:
        group["lr"] = 1e-2
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_the_optimizer_steps_as_the_library_optimizer_on_the_paper_groups(name):
    """One step of build_optimizer equals the library's optimizer built by hand on the same groups: LAMB with
    coupled weight decay (decay enters before the trust ratio) or AdamW, decay only on weight matrices."""
    cfg = presets.get("tiny")
    optim = dataclasses.replace(cfg.optim, name=name, weight_decay=0.1)
    torch.manual_seed(0)
    ours, reference = DualEncoder(cfg.model), DualEncoder(cfg.model)
    reference.load_state_dict(ours.state_dict())
    groups = param_groups(reference, optim)
    options = {"lr": optim.lr, "betas": optim.betas, "eps": optim.eps, "weight_decay": optim.weight_decay}
    kind = {"lamb": lambda: Lamb(groups, weight_decouple=False, **options),
            "adamw": lambda: torch.optim.AdamW(groups, **options)}[name]
    after, expected = one_step(ours, build_optimizer(ours, optim)), one_step(reference, kind())
    for key in expected:
        torch.testing.assert_close(after[key], expected[key], rtol=0, atol=0, msg=key)
    # ... and the check is sharp: decoupled decay (AdamW's rule inside LAMB), or decay on every tensor, differs
    torch.manual_seed(0)
    fresh = DualEncoder(cfg.model)
    wrong = Lamb(fresh.parameters(), weight_decouple=True, **options) if name == "lamb" else \
        torch.optim.AdamW(fresh.parameters(), **options)
    moved = one_step(fresh, wrong)
    assert any(not torch.equal(moved[k], expected[k]) for k in expected)


def test_temperature_starts_at_one_and_is_learned():
    cfg = presets.get("tiny")
    paper_init = presets.get("align-b7-base").loss.temperature.init
    model = DualEncoder(cfg.model, LossConfig(temperature=TemperatureConfig(init=paper_init)))
    assert model.temperature.item() == 1.0 and model.temperature.requires_grad
    opt = build_optimizer(model, cfg.optim)
    for g in opt.param_groups:
        g["lr"] = 1e-2
    img = torch.nn.functional.normalize(torch.randn(4, 80), dim=-1)
    (img @ img.T / model.temperature).logsumexp(1).mean().backward()
    opt.step()
    assert model.temperature.item() != 1.0


def test_fixed_temperature_is_not_a_parameter_to_optimize():
    cfg = presets.get("tiny")
    model = DualEncoder(cfg.model, LossConfig(temperature=TemperatureConfig(fixed=1 / 64)))
    assert model.temperature.item() == 1 / 64 and not model.temperature.requires_grad
    assert "temperature" not in {g["name"] for g in param_groups(model, cfg.optim)}


def test_fsdp_lamb_steps_equal_pytorch_optimizer_lamb():
    """On whole tensors FsdpLamb is Lamb: moments, coupled decay, trust ratio with the weight norm
    clamped at 10, a zero weight (trust ratio 1), a parameter without gradient, several steps."""
    from openalign.train.optim import FsdpLamb

    g = torch.Generator().manual_seed(0)
    shapes = [(6, 5), (7,), (3, 4, 2), (40, 40)]
    start = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    start[1].zero_()  # a zero weight: trust ratio 1
    start[3].mul_(2.0)  # norm ~80: the clamp at 10 matters
    ours = [torch.nn.Parameter(t.clone()) for t in start] + [torch.nn.Parameter(torch.ones(3, dtype=torch.float64))]
    theirs = [torch.nn.Parameter(t.clone()) for t in start] + [torch.nn.Parameter(torch.ones(3, dtype=torch.float64))]

    def groups(params):
        return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]

    a = FsdpLamb(groups(ours), lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)
    b = Lamb(groups(theirs), lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1, weight_decouple=False)
    for _step in range(4):
        grads = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        for params in (ours, theirs):
            for p, grad in zip(params, grads):
                p.grad = grad.clone()
            params[-1].grad = None  # never gets a gradient: untouched, no state
        a.step()
        b.step()
        for x, y in zip(ours, theirs):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)
    assert torch.equal(ours[-1], torch.ones(3, dtype=torch.float64)) and ours[-1] not in a.state
