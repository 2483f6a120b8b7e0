"""The PMI study: its measures against hand cases, and the pipeline through main(argv)."""

import json
import math

import numpy as np
import pytest

from experiments import pmi


def test_pmi_of_a_hand_table():
    counts = np.array([[3.0, 1.0], [1.0, 3.0]])  # p(x, y) = 3/8 on the diagonal, marginals 1/2
    expected = np.array([[math.log(1.5), math.log(0.5)], [math.log(0.5), math.log(1.5)]])
    np.testing.assert_allclose(pmi.pmi_matrix(counts), expected, rtol=1e-12)
    independent = np.outer([1.0, 2.0, 5.0], [3.0, 1.0])  # p(x, y) = p(x) p(y): PMI 0 everywhere
    np.testing.assert_allclose(pmi.pmi_matrix(independent), 0.0, atol=1e-12)


def test_truncated_svd_is_the_best_rank_d_approximation():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((7, 5))
    s = np.linalg.svd(m, compute_uv=False)
    for rank in (1, 3, 5):
        approx = pmi.truncated_svd(m, rank)
        assert np.linalg.matrix_rank(approx) == rank
        # Eckart-Young: the error is the norm of the dropped singular values
        assert np.linalg.norm(m - approx) == pytest.approx(np.sqrt((s[rank:] ** 2).sum()), abs=1e-10)


def test_compare_tells_one_constant_from_one_per_row():
    rng = np.random.default_rng(1)
    target = rng.standard_normal((6, 5))
    shifted = pmi.compare(target + 3.0, target)  # PMI + one constant: the loss's optimum
    assert shifted["residual"] == pytest.approx(0.0, abs=1e-12)
    assert shifted["row_spread"] == pytest.approx(0.0, abs=1e-12) and shifted["correlation"] == pytest.approx(1.0)
    assert shifted["top1_rows"] == shifted["top1_columns"] == 1.0
    per_row = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])[:, None]  # PMI + c(x): the row loss's optimum
    rows = pmi.compare(target + per_row, target)
    assert rows["top1_rows"] == 1.0  # each image's best caption is unchanged by its own constant
    assert rows["row_spread"] == pytest.approx(per_row.std() / target.std())
    assert rows["column_spread"] == pytest.approx(0.0, abs=1e-12)
    assert rows["residual"] == pytest.approx(per_row.std() / target.std())  # the rows' spread is all that is off


def test_study_pmi_pipeline(tmp_path, capsys):
    out = tmp_path / "pmi"
    assert pmi.main(["--out", str(out), "--quiet", "widths=2,8", "steps=150", "batch_size=64", "image_types=12",
                     "caption_types=10"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["learned"]) == {"both", "image_to_text", "text_to_image"}
    assert set(results["svd"]) == {"2", "8"}
    assert results["svd"]["8"]["residual"] < results["svd"]["2"]["residual"]  # more rank, closer
    assert (out / "pmi.png").stat().st_size > 10_000 and "rank-d SVD" in (out / "report.md").read_text()
    assert "d=8" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert "The symmetric loss has the smallest residual" in report and "per-caption ones" in report
    with pytest.raises(SystemExit):  # a flag of the studies of variants: argparse's one line
        pmi.main(["--out", str(out), "--data", "x"])
    capsys.readouterr()
    assert pmi.main(["--out", str(out), "widths=0"]) == 2
    assert pmi.main(["--out", str(out), "width=4"]) == 2
    err = capsys.readouterr().err
    assert "widths=0 must be positive integers" in err and "did you mean widths" in err
