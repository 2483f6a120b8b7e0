"""Blocked exact search equals brute-force numpy top-k, across blocks, for one query and many."""

import numpy as np
import pytest

from openalign.index import exact


@pytest.mark.parametrize("n_queries", [1, 3, 17, 200])  # whole, whole, blocked, FAISS
def test_exact_search_equals_numpy_top_k(tmp_path, monkeypatch, n_queries):
    monkeypatch.setattr(exact, "MIN_ROWS", 1000)  # several blocks, and a short last one
    monkeypatch.setattr(exact, "BLOCKED_UP_TO", 100)  # 200 queries go to FAISS
    monkeypatch.setattr(exact, "BLOCK_BYTES", 4 * 1000)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((4_321, 24)).astype(np.float32)
    np.save(tmp_path / "v.npy", vectors)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")  # read-only memory map, as an index is loaded
    queries = rng.standard_normal((n_queries, 24)).astype(np.float32)
    scores, ids = exact.search(mapped, queries, k=10)
    full = queries @ vectors.T
    want = np.argsort(-full, axis=1, kind="stable")[:, :10]
    assert scores.shape == ids.shape == (n_queries, 10)
    np.testing.assert_array_equal(ids, want)  # continuous random scores: no ties
    np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), rtol=1e-5)


def test_fewer_rows_than_k_and_tied_scores():
    vectors = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    scores, ids = exact.search(vectors, np.array([1.0, 0.0], dtype=np.float32), k=10)
    assert scores.shape == (1, 3)
    assert set(ids[0, :2]) == {0, 1} and ids[0, 2] == 2  # ties in either order, then the rest
    np.testing.assert_allclose(scores[0], [1.0, 1.0, 0.0])
