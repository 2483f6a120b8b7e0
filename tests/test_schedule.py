import pytest

from openalign.schedule import lr_at


def test_warmup_then_linear_decay_to_zero():
    # paper: warm up to 1e-3 over 10k steps, then decay linearly to 0 at 1.2M
    assert lr_at(0, 1e-3, 10_000, 1_200_000) == 0.0
    assert lr_at(5_000, 1e-3, 10_000, 1_200_000) == pytest.approx(5e-4)
    assert lr_at(10_000, 1e-3, 10_000, 1_200_000) == pytest.approx(1e-3)
    assert lr_at(605_000, 1e-3, 10_000, 1_200_000) == pytest.approx(5e-4)
    assert lr_at(1_200_000, 1e-3, 10_000, 1_200_000) == 0.0
    assert lr_at(2_000_000, 1e-3, 10_000, 1_200_000) == 0.0


def test_no_warmup():
    assert lr_at(0, 1.0, 0, 10) == 1.0 and lr_at(5, 1.0, 0, 10) == 0.5
