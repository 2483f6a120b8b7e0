"""Exact top-k by inner product over a (memory-mapped) float32 matrix, by the fastest path per batch.

Measured on 1M x 640 vectors with 2 threads (bench/search.py, P7):
- up to `SCAN_UP_TO` queries: one parallel scan (numba) that reads each row once and takes its dot
  products with every query: at one query it runs at the speed of a streaming sum over the matrix
  (the memory-bandwidth bound), where BLAS GEMV (numpy's OpenBLAS) reached 56% of it and torch's 23%;
- up to `BLOCKED_UP_TO` queries: torch GEMMs over blocks of rows, each block's own top k merged into
  the running top k (FAISS's flat search does not use BLAS below 20 queries and was 3-5x slower here);
- larger batches: FAISS's blocked GEMM and heaps (`faiss.knn`), the fastest here at 1,024 queries
  (its GEMM ran at 1.3x torch's MKL on this AMD CPU), with database tiles of 4,096 rows instead of
  FAISS's default 1,024 (~10% faster here).
Memory: the scores of up to `SCAN_UP_TO` queries, or one block of scores; never a whole
[queries x rows] matrix beyond that.
"""

from __future__ import annotations

import threading
import warnings

import faiss
import numba
import numpy as np
import torch

SCAN_UP_TO = 16  # queries: one parallel scan over the matrix (numba)
SCAN_ROWS = 4_096  # rows per scan task
BLOCKED_UP_TO = 256  # queries: torch GEMMs over row blocks; FAISS beyond
BLOCK_BYTES = 8 * 2**20  # one block of scores (queries x rows x 4 bytes): stays in cache
MIN_ROWS = 2_048  # the smallest block of rows: per-block overhead stays small against its GEMM

# FAISS's brute-force tile (a process-wide setting, set once when this module is imported): 4,096 database rows
# measured ~10% faster than its default 1,024 for the batches that reach faiss.knn (more than BLOCKED_UP_TO).
faiss.cvar.distance_compute_blas_database_bs = 4_096


def as_tensor(vectors: np.ndarray) -> torch.Tensor:
    """A zero-copy float32 tensor over `vectors` (read-only memory maps included: we never write)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))


def search(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top `k` rows of `vectors` [n, d] for each query [q, d] by inner product: scores and
    row ids, [q, k] each, best first (fewer than k columns when n < k)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, vectors.shape[1])
    k = min(k, vectors.shape[0])
    if len(queries) <= SCAN_UP_TO or k == 0:
        return _scan(vectors, queries, k)
    if len(queries) <= BLOCKED_UP_TO:
        return _blocked(vectors, queries, k)
    scores, ids = faiss.knn(queries, np.ascontiguousarray(vectors), k, metric=faiss.METRIC_INNER_PRODUCT)
    return scores, ids.astype(np.int64)


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _scan_top(vectors, queries, top_scores, top_ids):
    """Each task's own top k ([queries, tasks, k], best first) of its SCAN_ROWS rows: every row is read
    once and dotted with every query into a small buffer; a score then enters the task's list only
    when it beats the list's last."""
    n, d = vectors.shape
    k = top_scores.shape[2]
    n_queries = queries.shape[0]
    for task in numba.prange(top_scores.shape[1]):
        top_scores[:, task, :] = -np.inf
        top_ids[:, task, :] = -1
        lo, hi = task * SCAN_ROWS, min(n, (task + 1) * SCAN_ROWS)
        scores = np.empty((n_queries, hi - lo), np.float32)
        for i in range(lo, hi):  # the streaming part: no branches
            for j in range(n_queries):
                acc = np.float32(0.0)
                for t in range(d):
                    acc += vectors[i, t] * queries[j, t]
                scores[j, i - lo] = acc
        for j in range(n_queries):  # insert, keeping the list sorted (earlier rows win ties)
            last = top_scores[j, task, k - 1]
            for r in range(hi - lo):
                score = scores[j, r]
                if score > last:
                    s = k - 1
                    while s > 0 and top_scores[j, task, s - 1] < score:
                        top_scores[j, task, s] = top_scores[j, task, s - 1]
                        top_ids[j, task, s] = top_ids[j, task, s - 1]
                        s -= 1
                    top_scores[j, task, s] = score
                    top_ids[j, task, s] = lo + r
                    last = top_scores[j, task, k - 1]


_SCAN_LOCK = threading.Lock()  # one scan at a time, each on every thread (numba's default pool is not reentrant)


def _scan(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    tasks = -(-len(vectors) // SCAN_ROWS)
    top_scores = np.empty((len(queries), tasks, max(k, 1)), np.float32)
    top_ids = np.empty((len(queries), tasks, max(k, 1)), np.int64)
    if not vectors.flags.c_contiguous:
        vectors = np.ascontiguousarray(vectors)
    with _SCAN_LOCK:  # numba's threads: NUMBA_NUM_THREADS, set at process start (default: every core)
        _scan_top(vectors, queries, top_scores, top_ids)
    scores, ids = top_scores.reshape(len(queries), -1), top_ids.reshape(len(queries), -1)
    # every row is in some task, so the k best of the tasks' lists are the k best; ties: lower row first
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


def _blocked(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    base, q = as_tensor(vectors), torch.from_numpy(queries)
    n = len(base)
    rows = max(MIN_ROWS, BLOCK_BYTES // (4 * len(q)))
    out = torch.empty(len(q), min(rows, n))
    best_scores = torch.full((len(q), 0), -torch.inf)
    best_ids = torch.zeros((len(q), 0), dtype=torch.long)
    with torch.inference_mode():
        for start in range(0, n, rows):
            block = base[start:start + rows]
            scores = torch.mm(q, block.T, out=out[:, :len(block)])
            top_scores, top_ids = scores.topk(min(k, len(block)), dim=1)
            merged_scores = torch.cat([best_scores, top_scores], dim=1)
            merged_ids = torch.cat([best_ids, top_ids + start], dim=1)
            best_scores, order = merged_scores.topk(min(k, merged_scores.shape[1]), dim=1)
            best_ids = merged_ids.gather(1, order)
    return best_scores.numpy(), best_ids.numpy()
