"""Learning-rate schedule as a pure function of the step (paper: 10k warmup to 1e-3, linear decay to 0 at 1.2M)."""

from __future__ import annotations


def lr_at(step: int, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup from 0 to `peak` over `warmup_steps`, then linear decay to 0 at `total_steps`."""
    if step < warmup_steps:
        return peak * step / warmup_steps
    if step >= total_steps:
        return 0.0
    return peak * (total_steps - step) / max(1, total_steps - warmup_steps)
