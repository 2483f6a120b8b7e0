"""Exact top-k by inner product over a (memory-mapped) float32 matrix, by the fastest path per batch.

Measured on 1M x 640 vectors with 2 threads (bench/search.py, P7):
- up to `SCAN_UP_TO` queries: one parallel scan (numba) that reads each row once from memory and takes
  its dot products with every query in register tiles (4 rows x 4 queries; 4 x 2 for one or two): at
  one query at 85% of the speed of a streaming sum over the matrix (the memory-bandwidth bound), at 64
  queries at ~250 GFLOP/s, 1.5x the GEMM rate of torch's MKL here and 69% of the kernel's own rate on
  cached rows; BLAS GEMV/GEMM with thin query matrices reached 23-56% of the read
  at 1 query and ~35% at 16-64 (torch GEMMs over row blocks, this module's previous middle path, were
  1.3-3x slower than the scan at every batch up to 256), and FAISS's flat search does not use BLAS
  below 20 queries (3-10x slower here);
- larger batches: FAISS's blocked GEMM and heaps (`faiss.knn`), the fastest here from ~256 queries
  (its GEMM ran at 1.3x torch's MKL on this AMD CPU), with database tiles of 4,096 rows instead of
  FAISS's default 1,024 (~10% faster here).
Memory: each scan task's scores (queries x SCAN_ROWS), never a whole [queries x rows] matrix.
"""

from __future__ import annotations

import threading

import faiss
import numba
import numpy as np

SCAN_UP_TO = 128  # queries: one parallel scan over the matrix (numba); FAISS beyond
SCAN_ROWS = 2_048  # rows per scan task: its scores of 64 queries (512 KiB) stay in L2
SCAN_STRIDE = 32  # a scan tile's 4 rows lie this far apart (blocks of 128 rows)

# FAISS's brute-force tile (a process-wide setting, set once when this module is imported): 4,096 database rows
# measured ~10% faster than its default 1,024 for the batches that reach faiss.knn (more than SCAN_UP_TO).
faiss.cvar.distance_compute_blas_database_bs = 4_096


def search(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top `k` rows of `vectors` [n, d] for each query [q, d] by inner product: scores and
    row ids, [q, k] each, best first (fewer than k columns when n < k)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, vectors.shape[1])
    k = min(k, vectors.shape[0])
    if len(queries) <= SCAN_UP_TO or k == 0:
        return _scan(vectors, queries, k)
    scores, ids = faiss.knn(queries, np.ascontiguousarray(vectors), k, metric=faiss.METRIC_INNER_PRODUCT)
    return scores, ids.astype(np.int64)


@numba.njit(fastmath={"reassoc", "contract"}, cache=True)
def _tile_scores(vectors, queries, lo, hi, scores):
    """scores[j, i - lo] = vectors[i] . queries[j] for rows lo..hi and an even number of queries.

    Register tiles of 4 rows x 4 queries (4 x 2 when the count is not a multiple of 4): 16 accumulators
    that the t loop vectorizes, so each loaded row element serves 4 queries and each query element 4 rows
    (measured on 64 queries over 1M x 640: 4 x 4 ran the scores at 275 GFLOP/s, 4 x 2 at 228, the loads
    of the narrower tile being its limit). The 4 rows of a tile are `s` apart (i, i+s, i+2s, i+3s in a
    block of 4s rows), so that each is the continuation of a sequential stream through the block that the
    hardware prefetcher follows; adjacent rows (i..i+3) would start 4 new streams every tile and stall on
    memory (measured: 16 queries 0.35 s against 0.27 s)."""
    d, nq = vectors.shape[1], queries.shape[0]
    step = 4 if nq % 4 == 0 else 2
    b = lo
    while hi - b >= 4:
        s = min(SCAN_STRIDE, (hi - b) // 4)
        for i in range(b, b + s):
            r = i - lo
            for j in range(0, nq, step):
                if step == 4:
                    _tile_4x4(vectors, queries, i, s, j, d, r, scores)
                else:
                    _tile_4x2(vectors, queries, i, s, j, d, r, scores)
        b += 4 * s
    for i in range(b, hi):  # the last 0-3 rows
        for j in range(0, nq, 2):
            a0 = a1 = np.float32(0.0)
            for t in range(d):
                a0 += vectors[i, t] * queries[j, t]
                a1 += vectors[i, t] * queries[j + 1, t]
            scores[j, i - lo], scores[j + 1, i - lo] = a0, a1


@numba.njit(fastmath={"reassoc", "contract"}, cache=True, inline="always")
def _tile_4x2(vectors, queries, i, s, j, d, r, scores):
    """One 4 rows (i + 0..3 s) x 2 queries (j, j+1) tile of `_tile_scores`, written at column r."""
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = np.float32(0.0)
    for t in range(d):
        q0, q1 = queries[j, t], queries[j + 1, t]
        v0, v1, v2, v3 = vectors[i, t], vectors[i + s, t], vectors[i + 2 * s, t], vectors[i + 3 * s, t]
        a00 += v0 * q0
        a01 += v0 * q1
        a10 += v1 * q0
        a11 += v1 * q1
        a20 += v2 * q0
        a21 += v2 * q1
        a30 += v3 * q0
        a31 += v3 * q1
    for row, (x0, x1) in enumerate(((a00, a01), (a10, a11), (a20, a21), (a30, a31))):
        scores[j, r + row * s], scores[j + 1, r + row * s] = x0, x1


@numba.njit(fastmath={"reassoc", "contract"}, cache=True, inline="always")
def _tile_4x4(vectors, queries, i, s, j, d, r, scores):
    """One 4 rows (i + 0..3 s) x 4 queries (j..j+3) tile of `_tile_scores`, written at column r."""
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
    for t in range(d):
        q0, q1, q2, q3 = queries[j, t], queries[j + 1, t], queries[j + 2, t], queries[j + 3, t]
        v0, v1, v2, v3 = vectors[i, t], vectors[i + s, t], vectors[i + 2 * s, t], vectors[i + 3 * s, t]
        a00 += v0 * q0
        a01 += v0 * q1
        a02 += v0 * q2
        a03 += v0 * q3
        a10 += v1 * q0
        a11 += v1 * q1
        a12 += v1 * q2
        a13 += v1 * q3
        a20 += v2 * q0
        a21 += v2 * q1
        a22 += v2 * q2
        a23 += v2 * q3
        a30 += v3 * q0
        a31 += v3 * q1
        a32 += v3 * q2
        a33 += v3 * q3
    for row, (x0, x1, x2, x3) in enumerate(((a00, a01, a02, a03), (a10, a11, a12, a13), (a20, a21, a22, a23),
                                             (a30, a31, a32, a33))):
        c = r + row * s
        scores[j, c], scores[j + 1, c], scores[j + 2, c], scores[j + 3, c] = x0, x1, x2, x3


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _scan_top(vectors, queries, top_scores, top_ids):
    """Each task's own top k ([queries, tasks, k], best first) of its SCAN_ROWS rows: the task's scores
    for every query (`_tile_scores`, each row read once from memory), then a score enters the task's
    list only when it beats the list's last. `queries` may carry zero rows of padding (a count the
    tiles take); only the first top_scores.shape[0] are ranked."""
    n, n_padded = vectors.shape[0], queries.shape[0]
    for task in numba.prange(top_scores.shape[1]):
        top_scores[:, task, :] = -np.inf
        top_ids[:, task, :] = -1
        lo, hi = task * SCAN_ROWS, min(n, (task + 1) * SCAN_ROWS)
        scores = np.empty((n_padded, hi - lo), np.float32)
        _tile_scores(vectors, queries, lo, hi, scores)
        rows = np.arange(lo, hi)
        for j in range(top_scores.shape[0]):
            keep_best(scores[j], rows, top_scores[j, task], top_ids[j, task])


@numba.njit(cache=True)
def keep_best(scores, ids, best, best_ids):
    """Merge `scores` (of rows `ids`) into the sorted list `best` / `best_ids` (best first, full length k):
    a score enters only when it beats the list's last, by insertion (earlier rows win ties)."""
    k = len(best)
    last = best[k - 1]
    for r in range(len(ids)):
        score = scores[r]
        if score > last:
            s = k - 1
            while s > 0 and best[s - 1] < score:
                best[s], best_ids[s] = best[s - 1], best_ids[s - 1]
                s -= 1
            best[s], best_ids[s] = score, ids[r]
            last = best[k - 1]


@numba.njit(cache=True)
def padded_queries(n: int) -> int:
    """How many query rows the tiles take for n queries: a multiple of 4 (of 2 for one or two)."""
    width = 2 if n <= 2 else 4
    return -(-n // width) * width


_SCAN_LOCK = threading.Lock()  # one scan at a time, each on every thread (numba's default pool is not reentrant)


def _scan(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    tasks = -(-len(vectors) // SCAN_ROWS)
    top_scores = np.empty((len(queries), tasks, max(k, 1)), np.float32)
    top_ids = np.empty((len(queries), tasks, max(k, 1)), np.int64)
    if not vectors.flags.c_contiguous:
        vectors = np.ascontiguousarray(vectors)
    padded = np.zeros((padded_queries(len(queries)), queries.shape[1]), np.float32)
    padded[:len(queries)] = queries
    with _SCAN_LOCK:  # numba's threads: NUMBA_NUM_THREADS, set at process start (default: every core)
        _scan_top(vectors, padded, top_scores, top_ids)
    scores, ids = top_scores.reshape(len(queries), -1), top_ids.reshape(len(queries), -1)
    # every row is in some task, so the k best of the tasks' lists are the k best; ties: lower row first
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
