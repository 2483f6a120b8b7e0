"""Classifiers trained on frozen features: CLIP's linear probe (multinomial logistic regression by L-BFGS, its
regularization found by CLIP's search over C) and the paper's SGD probe (Table 5's recipe)."""

from __future__ import annotations

import math

import torch

from openalign.config import ConfigError
from openalign.eval.metrics import topk_accuracy
from openalign.eval.options import SgdProbe

__all__ = ["CLIP_START_C", "clip_c_search", "fit_logistic", "linear_probe", "probe_lr", "sgd_probe"]

CLIP_START_C = (1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6)  # CLIP's first sweep of C, the inverse L2 strength


def clip_c_search(score, start=CLIP_START_C, steps_per_decade: int = 8) -> tuple[float, float]:
    """(best C, its score): CLIP's parametric binary search over the inverse regularization strength C. `score(C)`
    is evaluated at `start`, then at the log-midpoints either side of the best so far, the step halving each round
    until it is 1/`steps_per_decade` of a decade. Ties go to the smaller C (the stronger penalty); a `score` of
    None (a fit that diverged) is never chosen. Each C is scored once."""
    scores: dict[float, float | None] = {}

    def best() -> float | None:
        tried = [(s, -math.log10(c), c) for c, s in scores.items() if s is not None]
        return max(tried)[2] if tried else None

    for c in start:
        scores[c] = score(c)
    step = math.log10(start[1] / start[0]) / 2 if len(start) > 1 else 0.0
    while step >= 1 / steps_per_decade - 1e-9 and best() is not None:
        centre = math.log10(best())
        for exponent in (centre - step, centre + step):
            c = float(f"{10 ** exponent:.6g}")
            if c not in scores:
                scores[c] = score(c)
        step /= 2
    chosen = best()
    return (chosen, scores[chosen]) if chosen is not None else (None, None)


def fit_logistic(x: torch.Tensor, y: torch.Tensor, n_classes: int, c: float, max_iter: int = 1000,
                 tolerance: float = 1e-4, init: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(weights [dim, n_classes], bias) of multinomial logistic regression with scikit-learn's objective, C x the
    summed cross-entropy + half the squared norm of the weights (the bias is not penalized), minimized by full-batch
    L-BFGS (strong Wolfe line search) from zeros or from `init` until the largest |gradient| of the objective divided
    by C x the row count is at most `tolerance` (scikit-learn's `tol`), or `max_iter` iterations; None when the loss
    or the weights go non-finite."""
    w = (init[0].clone() if init else x.new_zeros(x.shape[1], n_classes)).requires_grad_()
    b = (init[1].clone() if init else x.new_zeros(n_classes)).requires_grad_()
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=tolerance,
                            line_search_fn="strong_wolfe")
    l2 = 1.0 / (2.0 * c * len(x))  # the objective divided by C x the row count: the same minimum, a mean loss

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    finite = bool(torch.isfinite(loss)) and bool(w.isfinite().all()) and bool(b.isfinite().all())
    return (w.detach(), b.detach()) if finite else None


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                 val_fraction: float = 0.2, seed: int = 0, max_iter: int = 1000,
                 start_c=CLIP_START_C, steps_per_decade: int = 8) -> dict[str, float]:
    """CLIP's linear probe: multinomial logistic regression on frozen features, fit by full-batch L-BFGS, with its
    regularization chosen on a validation split (Radford et al. 2021, appendix A.3).

    The objective is scikit-learn's: C x the summed cross-entropy + half the squared norm of the weights (the bias
    not penalized), here divided by the row count (the same minimum). C is chosen by `clip_c_search` on a seeded
    `val_fraction` of the training set, each candidate fit from zeros on the rest to scikit-learn's default
    tolerance (max |gradient| <= 1e-4) or `max_iter` (1000, scikit-learn's default as CLIP ran it); the probe is then
    refit with that C on all training rows, starting from the chosen fit, and scored on the test set. A fit whose
    loss or weights go non-finite is not a candidate; when every fit does, it is an error. In float32: float64
    doubled the time for the same accuracy (docs/evaluation.md)."""
    bad = int((~train_x.isfinite().all(dim=1)).sum())
    if bad:
        raise ConfigError(f"{bad} of {len(train_x)} training embeddings are not finite (NaN or inf): the model has "
                          "diverged, so no probe can be fit on it")
    train_x, test_x = train_x.float(), test_x.float()
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(len(train_x) * val_fraction)) if len(train_x) > 1 else 0
    fit_idx, val_idx = perm[n_val:], perm[:n_val]

    fits: dict[float, tuple[torch.Tensor, torch.Tensor] | None] = {}

    def val_score(c: float) -> float | None:
        fits[c] = fitted = fit_logistic(train_x[fit_idx], train_y[fit_idx], n_classes, c, max_iter)
        if fitted is None:
            return None  # diverged: not a candidate
        return topk_accuracy(train_x[val_idx] @ fitted[0] + fitted[1], train_y[val_idx], ks=(1,))["top1"]

    if n_val:
        c, val_top1 = clip_c_search(val_score, start_c, steps_per_decade)
    else:  # one training row: nothing to validate on; scikit-learn's default C
        c, val_top1 = 1.0, 0.0
    fitted = fit_logistic(train_x, train_y, n_classes, c, max_iter, init=fits.get(c)) if c is not None else None
    if fitted is None:
        raise ConfigError("the linear probe's loss went non-finite for every regularization strength tried; the "
                          "features are too large or degenerate to fit")
    w, b = fitted
    return topk_accuracy(test_x @ w + b, test_y) | {"C": c, "val_top1": val_top1, "searched": len(fits)}


def probe_lr(epoch: int, recipe: SgdProbe = SgdProbe()) -> float:
    """The SGD probe's learning rate during `epoch` (0-based): lr x decay^(epoch // decay_every)."""
    return recipe.lr * recipe.decay ** (epoch // recipe.decay_every)


def sgd_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
              recipe: SgdProbe = SgdProbe(), seed: int = 0) -> dict[str, float]:
    """A linear classifier (zero-initialized weights and bias) trained on frozen features by minibatch SGD as
    `recipe` says, each epoch a seeded permutation of the training rows; top-1/top-5 on the test features. The
    features are read from memory each epoch: 100 epochs cost 100 passes over a matrix, not over the images."""
    bad = int((~train_x.isfinite().all(dim=1)).sum())
    if bad:
        raise ConfigError(f"{bad} of {len(train_x)} training embeddings are not finite (NaN or inf): the model has "
                          "diverged, so no probe can be fit on it")
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    w = train_x.new_zeros(train_x.shape[1], n_classes, requires_grad=True)
    b = train_x.new_zeros(n_classes, requires_grad=True)
    optimizer = torch.optim.SGD([w, b], lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    order = torch.Generator().manual_seed(seed)
    for epoch in range(recipe.epochs):
        for group in optimizer.param_groups:
            group["lr"] = probe_lr(epoch, recipe)
        perm = torch.randperm(len(train_x), generator=order)
        for start in range(0, len(perm), recipe.batch_size):
            rows = perm[start:start + recipe.batch_size]
            loss = torch.nn.functional.cross_entropy(train_x[rows] @ w + b, train_y[rows])
            if not torch.isfinite(loss):
                raise ConfigError(f"the SGD probe's loss went non-finite in epoch {epoch + 1} (lr "
                                  f"{probe_lr(epoch, recipe):g}); lower linear-probe.lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        train_top1 = topk_accuracy(train_x @ w + b, train_y, ks=(1,))["top1"]
        return topk_accuracy(test_x @ w + b, test_y) | {"train_top1": train_top1}
