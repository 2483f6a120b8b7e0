"""Classifiers trained on frozen features (eval/probes.py): CLIP's L-BFGS probe and its search over C, the SGD probe."""

import math

import pytest
import torch

from openalign.config import ConfigError
from openalign.eval import probes
from openalign.eval.metrics import topk_accuracy
from openalign.eval.options import SgdProbe

NAN = float("nan")


def test_linear_probe_separates_separable_features():
    g = torch.Generator().manual_seed(0)
    centers = torch.eye(4, 16, dtype=torch.float64) * 3
    y = torch.arange(4).repeat(30)
    x = centers[y] + 0.3 * torch.randn(len(y), 16, generator=g, dtype=torch.float64)
    out = probes.linear_probe(x[:80], y[:80], x[80:], y[80:])
    assert out["top1"] == 1.0 and 1e-6 <= out["C"] and out["searched"] == 15  # 7 starts + 2 in each of 4 rounds


def test_logistic_fit_is_scikit_learns_objective_at_its_minimum():
    # Oracle: the minimum of C x sum(cross-entropy) + |W|^2 / 2 (bias unpenalized) has W = C X^T (Y - P) and
    # sum(Y - P) = 0 over the rows (its gradient is zero); a penalty off by any factor of C or of n breaks it.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    for c in (0.05, 0.5, 3.0):
        w, b = probes.fit_logistic(x, y, 3, c, max_iter=500, tolerance=1e-9)
        residual = torch.nn.functional.one_hot(y, 3).double() - torch.softmax(x @ w + b, dim=1)
        assert (w - c * x.T @ residual).abs().max() < 1e-2 * w.abs().max()  # L-BFGS stops at its tolerance
        assert residual.sum(dim=0).abs().max() < 1e-3
        assert w.abs().max() > 0.1  # not the trivial zero solution


def test_clip_c_search_halves_its_step_around_the_peak_to_an_eighth_of_a_decade():
    calls = []

    def peaked(c):  # best at C = 10^1.3
        calls.append(c)
        return -abs(math.log10(c) - 1.3)

    c, score = probes.clip_c_search(peaked)
    # starts 1e-6 .. 1e6 (best 1e2), then 10^1 (best), 10^1.5 (best), 10^1.25 (best), 10^1.125 and 10^1.375
    assert c == pytest.approx(10 ** 1.25, rel=1e-5) and score == pytest.approx(-0.05, abs=1e-5)
    assert len(calls) == len(set(calls)) == 15 and calls[:7] == list(probes.CLIP_START_C)


def test_clip_c_search_ties_go_to_the_stronger_penalty_and_a_diverged_fit_is_never_chosen():
    assert probes.clip_c_search(lambda c: 1.0 if 1e2 <= c <= 1e4 else 0.0)[0] == 100.0
    # larger C scores higher, but every C above 1e3 diverged (None)
    c, score = probes.clip_c_search(lambda c: None if c > 1e3 else math.log10(c))
    assert c == pytest.approx(1e3) and score == pytest.approx(3.0)
    assert probes.clip_c_search(lambda c: None) == (None, None)


def test_sgd_probe_lr_steps_down_by_a_fifth_every_30_epochs():
    assert [probes.probe_lr(e) for e in (0, 29, 30, 59, 60, 90, 99)] == pytest.approx(
        [0.1, 0.1, 0.02, 0.02, 0.004, 0.0008, 0.0008])


def test_sgd_probe_equals_plain_sgd_with_a_multistep_schedule():
    # Oracle: torch's SGD and MultiStepLR (milestones 30, 60, 90; gamma 0.2), stepped once per epoch, over the
    # same seeded permutations; the lr each epoch ran at is recorded and must be the paper's.
    g = torch.Generator().manual_seed(0)
    y = torch.arange(3).repeat(40)
    x = torch.nn.functional.normalize(torch.eye(3, 8)[y] + 0.2 * torch.randn(len(y), 8, generator=g), dim=1)
    recipe = SgdProbe(batch_size=32)  # 4 steps an epoch over 100 rows
    out = probes.sgd_probe(x[:100], y[:100], x[100:], y[100:], recipe, seed=5)
    w = torch.zeros(8, 3, requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[30, 60, 90], gamma=0.2)
    order, seen = torch.Generator().manual_seed(5), {}
    for epoch in range(100):
        seen[epoch] = opt.param_groups[0]["lr"]
        perm = torch.randperm(100, generator=order)
        for start in range(0, 100, 32):
            rows = perm[start:start + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(x[rows] @ w + b, y[rows]).backward()
            opt.step()
        schedule.step()
    assert [seen[e] for e in (0, 30, 60, 90)] == pytest.approx([0.1, 0.02, 0.004, 0.0008])
    assert out == topk_accuracy(x[100:] @ w.detach() + b.detach(), y[100:]) | {
        "train_top1": topk_accuracy(x[:100] @ w.detach() + b.detach(), y[:100], ks=(1,))["top1"]}
    assert out["top1"] == 1.0  # separable clusters


def test_linear_probe_refuses_non_finite_features():
    x = torch.randn(10, 4, dtype=torch.float64)
    x[3, 0] = NAN
    y = torch.arange(10) % 2
    with pytest.raises(ConfigError, match="not finite"):
        probes.linear_probe(x, y, x, y)
