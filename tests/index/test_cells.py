"""IVF with float32 cells searched cell-major in batches (index/cells.py): the same results as FAISS's own
search of the same index and nprobe, through the CLI and a loaded (memory-mapped) index."""

import faiss
import numpy as np
import pytest

from openalign import cli
from openalign.index import build as build_lib
from openalign.index import opened
from openalign.index.cells import CellScan
from tests.index.test_index import clustered, fake_embeddings


def ivf_flat(x: np.ndarray, nlist: int) -> faiss.Index:
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(x.shape[1]), x.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    return index


@pytest.mark.parametrize("n_queries", [2, 3, 17, 64])
@pytest.mark.parametrize("nprobe", [1, 5, 40])
def test_cell_major_search_equals_faiss_ivf_flat(n_queries, nprobe):
    x = clustered(6_000, 24, 30)
    queries = clustered(n_queries, 24, 30, seed=1)
    index = ivf_flat(x, 40)
    index.nprobe = nprobe
    want_scores, want_ids = index.search(queries, 10)
    scores, ids = CellScan(index).search(queries, 10)
    np.testing.assert_array_equal(ids, want_ids)  # continuous random scores: no ties
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)


def test_fewer_candidates_than_k_and_empty_cells():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((700, 8)).astype(np.float32)
    index = ivf_flat(x, 16)
    index.nprobe = 1
    queries = rng.standard_normal((5, 8)).astype(np.float32)
    k = 100  # more than one cell holds
    want_scores, want_ids = index.search(queries, k)
    scores, ids = CellScan(index).search(queries, k)
    found = want_ids >= 0
    assert (~found).any() and np.array_equal(ids >= 0, found)  # the same candidates, padded with -1
    np.testing.assert_array_equal(ids[found], want_ids[found])
    assert np.all(np.isneginf(scores[~found]))
    # a probed cell with no vectors: cell 0 emptied, queries at its centroid
    index.invlists.resize(0, 0)
    index.nprobe = 2
    at_cell0 = np.repeat(index.quantizer.reconstruct(0)[None], 3, axis=0)
    want_scores, want_ids = index.search(at_cell0, 5)
    scores, ids = CellScan(index).search(at_cell0, 5)
    np.testing.assert_array_equal(ids, want_ids)


def test_index_codes_flat_is_searched_cell_major_after_loading(tmp_path):
    x, queries = np.split(clustered(20_100, 32, 60, seed=3), [20_000])
    emb = fake_embeddings(tmp_path / "emb", x, part=7_000)
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "idx"), "--kind", "ivf", "--codes", "flat",
                     "--nlist", "64", "--train-per-cell", "39", "--recall", "0.95", "--quiet"]) == 0
    loaded = opened.load(tmp_path / "idx")
    assert isinstance(loaded.index, CellScan) and loaded.index.ntotal == 20_000
    nprobe = loaded.info["params"]["nprobe"]
    assert loaded.index.ivf.nprobe == nprobe
    scores, ids = loaded.search(queries, 10)
    plain = faiss.read_index(str(tmp_path / "idx" / "index.faiss"))
    plain.nprobe = nprobe
    np.testing.assert_array_equal(ids, plain.search(queries, 10)[1])
    truth = np.argsort(-(queries @ x.T), axis=1)[:, :10]
    assert build_lib.recall_at_10(ids, truth) >= 0.9
    np.testing.assert_allclose(loaded.vector(12_345), x[12_345])  # by id, the float32 vector
    one = loaded.search(queries[:1], 10)[1]  # a single query: FAISS's own search
    np.testing.assert_array_equal(one, ids[:1])
