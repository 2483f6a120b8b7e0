"""Exact search equals brute-force numpy top-k: the scan (its strided 4-row tiles, a short last block, the last
rows outside any tile, an odd query count) and FAISS beyond it."""

import numpy as np
import pytest

from openalign.index import exact, scan


@pytest.mark.parametrize("n_queries", [1, 2, 3, 17, 64, 200])  # the scan up to 64, FAISS at 200
def test_exact_search_equals_numpy_top_k(tmp_path, monkeypatch, n_queries):
    monkeypatch.setattr(exact, "SCAN_UP_TO", 100)  # 200 queries go to FAISS
    # 4,321 rows: scan tasks of 2,048, 2,048 and 225 rows; the last has one 128-row block (tile stride 32),
    # one of 96 (stride 24) and 1 row outside any tile
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((4_321, 24)).astype(np.float32)
    queries = rng.standard_normal((n_queries, 24)).astype(np.float32)
    vectors[-1] = 3 * queries[-1]  # the row outside any tile is the last query's best
    np.save(tmp_path / "v.npy", vectors)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")  # read-only memory map, as an index is loaded
    scores, ids = exact.search(mapped, queries, k=10)
    full = queries @ vectors.T
    want = np.argsort(-full, axis=1, kind="stable")[:, :10]
    assert scores.shape == ids.shape == (n_queries, 10)
    assert ids[-1, 0] == 4_320
    np.testing.assert_array_equal(ids, want)  # continuous random scores: no ties
    np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), rtol=1e-5)


def test_fewer_rows_than_k_and_tied_scores():
    vectors = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    scores, ids = exact.search(vectors, np.array([1.0, 0.0], dtype=np.float32), k=10)
    assert scores.shape == (1, 3)
    assert set(ids[0, :2]) == {0, 1} and ids[0, 2] == 2  # ties in either order, then the rest
    np.testing.assert_allclose(scores[0], [1.0, 1.0, 0.0])


@pytest.mark.parametrize("n_queries", [2, 4, 6, 8])  # 4 x 4 tiles for multiples of 4, 4 x 2 otherwise
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 127, 128, 129, 225, 300])
def test_scan_tiles_score_every_row_once(rows, n_queries):
    """The scan's tiles (4 rows `stride` apart, in blocks; then the last rows one by one) fill every score."""
    rng = np.random.default_rng(rows)
    vectors = rng.standard_normal((rows + 7, 16)).astype(np.float32)
    queries = rng.standard_normal((n_queries, 16)).astype(np.float32)
    scores = np.full((n_queries, rows), np.nan, np.float32)
    scan.tile_scores(vectors, queries, 7, rows + 7, scores)  # rows 7.. : tiles start where a task starts
    np.testing.assert_allclose(scores, queries @ vectors[7:].T, rtol=1e-5, atol=1e-5)


def test_faiss_settings_wait_for_a_command_that_searches():
    # Before: importing index/exact.py changed FAISS's process-wide brute-force tile, for whoever imported it.
    import subprocess
    import sys

    code = """
import faiss
before = faiss.cvar.distance_compute_blas_database_bs
import openalign.index.build, openalign.index.search, openalign.serve.app
from openalign.index import exact
assert faiss.cvar.distance_compute_blas_database_bs == before != exact.FAISS_DATABASE_TILE, "set at import"
from openalign import cli
assert cli.main(["search", "/nonexistent-index", "--text", "x"]) == 2
assert faiss.cvar.distance_compute_blas_database_bs == exact.FAISS_DATABASE_TILE, "not set by the command"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("n_queries", [1, 3])
def test_a_large_k_equals_numpy_top_k_with_ties_to_the_lower_row(monkeypatch, n_queries):
    """k beyond the scan's insertion lists (a service's 10,000 results): blocks selected by partition, merged."""
    monkeypatch.setattr(exact, "LARGE_K_BYTES", 4 * 3 * 1_000)  # blocks of 1,000 rows: the merge runs many times
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((5_000, 16)).astype(np.float32)
    vectors[4_000:4_100] = vectors[10]  # 101 tied rows across blocks: the lower rows win
    queries = rng.standard_normal((n_queries, 16)).astype(np.float32)
    queries[0] = vectors[10]
    scores, ids = exact.search(vectors, queries, k=1_200)
    full = queries @ vectors.T
    want = np.lexsort((np.broadcast_to(np.arange(5_000), full.shape), -full), axis=1)[:, :1_200]
    assert ids.shape == (n_queries, 1_200)
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(scores, np.take_along_axis(full, want, 1), rtol=1e-5)
    assert exact.search(vectors, queries, k=9_000)[1].shape == (n_queries, 5_000)  # k past the rows: all of them
