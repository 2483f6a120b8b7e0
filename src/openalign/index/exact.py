"""Exact top-k by inner product over a (memory-mapped) float32 matrix, by the fastest path per batch.

The path per batch, chosen by measurement (docs/benchmarks.md, P7):
- up to `SCAN_UP_TO` queries: one parallel numba scan that reads each row once and takes its dot products with
  every query in register tiles (4 rows x 4 queries; 4 x 2 for one or two): memory-bound search stays memory-bound;
- larger batches: FAISS's blocked GEMM and heaps (`faiss.knn`), with database tiles of 4,096 rows;
- a large k (more than `SCAN_K_UP_TO`): blocks of rows scored by BLAS, each block's k best selected by partition,
  then merged (`_large_k`), as insertion into a k-list would cost O(rows x k).
Memory: each scan task's scores (queries x SCAN_ROWS), never a whole [queries x rows] matrix.
"""

from __future__ import annotations

import faiss
import numba
import numpy as np

from openalign.index.scan import keep_best, padded_queries, parallel_region, tile_scores

SCAN_UP_TO = 128  # queries: one parallel scan over the matrix (numba); FAISS beyond
SCAN_ROWS = 2_048  # rows per scan task: its scores of 64 queries (512 KiB) stay in L2
SCAN_K_UP_TO = 256  # the scan's sorted lists by insertion up to this k; selection by partition beyond
LARGE_K_BYTES = 2**26  # a large k's block of scores (queries x rows, float32)

# FAISS's brute-force tile: 4,096 database rows measured ~10% faster than its default 1,024 for the batches that
# reach faiss.knn (more than SCAN_UP_TO). A process-wide setting: `configure_faiss` applies it once when a command
# that searches starts (cli: index, search, serve), never at import and never from a request thread.
FAISS_DATABASE_TILE = 4_096


def configure_faiss() -> None:
    """FAISS's process-wide settings for this module's searches; call once, before any thread searches."""
    faiss.cvar.distance_compute_blas_database_bs = FAISS_DATABASE_TILE


def search(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top `k` rows of `vectors` [n, d] for each query [q, d] by inner product: scores and
    row ids, [q, k] each, best first (fewer than k columns when n < k)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, vectors.shape[1])
    k = min(k, vectors.shape[0])
    if k > SCAN_K_UP_TO:
        return _large_k(vectors, queries, k)
    if len(queries) <= SCAN_UP_TO or k == 0:
        return _scan(vectors, queries, k)
    scores, ids = faiss.knn(queries, np.ascontiguousarray(vectors), k, metric=faiss.METRIC_INNER_PRODUCT)
    return scores, ids.astype(np.int64)


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _scan_top(vectors, queries, top_scores, top_ids):
    """Each task's own top k ([queries, tasks, k], best first) of its SCAN_ROWS rows: the task's scores
    for every query (`scan.tile_scores`, each row read once from memory), then a score enters the task's
    list only when it beats the list's last. `queries` may carry zero rows of padding (a count the
    tiles take); only the first top_scores.shape[0] are ranked."""
    n, n_padded = vectors.shape[0], queries.shape[0]
    for task in numba.prange(top_scores.shape[1]):
        top_scores[:, task, :] = -np.inf
        top_ids[:, task, :] = -1
        lo, hi = task * SCAN_ROWS, min(n, (task + 1) * SCAN_ROWS)
        scores = np.empty((n_padded, hi - lo), np.float32)
        tile_scores(vectors, queries, lo, hi, scores)
        rows = np.arange(lo, hi)
        for j in range(top_scores.shape[0]):
            keep_best(scores[j], rows, top_scores[j, task], top_ids[j, task])


def _scan(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    tasks = -(-len(vectors) // SCAN_ROWS)
    top_scores = np.empty((len(queries), tasks, max(k, 1)), np.float32)
    top_ids = np.empty((len(queries), tasks, max(k, 1)), np.int64)
    if not vectors.flags.c_contiguous:
        vectors = np.ascontiguousarray(vectors)
    padded = np.zeros((padded_queries(len(queries)), queries.shape[1]), np.float32)
    padded[:len(queries)] = queries
    with parallel_region():
        _scan_top(vectors, padded, top_scores, top_ids)
    scores, ids = top_scores.reshape(len(queries), -1), top_ids.reshape(len(queries), -1)
    # every row is in some task, so the k best of the tasks' lists are the k best; ties: lower row first
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


def _large_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top k for a large k: blocks of rows scored by BLAS, each query's k best of the running list and
    the block selected by partition (every score tied with the k-th kept, so that ties go to the lower row as in
    the scan), then sorted."""
    rows = max(k, LARGE_K_BYTES // (4 * max(1, len(queries))))
    best_scores = np.full((len(queries), 0), -np.inf, np.float32)
    best_ids = np.zeros((len(queries), 0), np.int64)
    for first in range(0, len(vectors), rows):
        block = np.ascontiguousarray(vectors[first:first + rows], dtype=np.float32)
        scores = np.concatenate([best_scores, queries @ block.T], axis=1)
        ids = np.concatenate([best_ids, np.broadcast_to(np.arange(first, first + len(block)),
                                                         (len(queries), len(block)))], axis=1)
        best_scores, best_ids = _k_best(scores, ids, k)
    return best_scores, best_ids


def _k_best(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k best (scores, ids) best first, ties to the lower id."""
    if scores.shape[1] > k:
        kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]  # each row's k-th best score
        out_s, out_i = np.empty((len(scores), k), np.float32), np.empty((len(scores), k), np.int64)
        for q in range(len(scores)):
            keep = np.nonzero(scores[q] >= kth[q])[0]  # the k best and any tied with the k-th
            order = np.lexsort((ids[q, keep], -scores[q, keep]))[:k]
            out_s[q], out_i[q] = scores[q, keep[order]], ids[q, keep[order]]
        return out_s, out_i
    order = np.lexsort((ids, -scores), axis=1)
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
