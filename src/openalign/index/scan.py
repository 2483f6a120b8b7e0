"""The scan kernels that exact search (exact.py) and the batched cell search (cells.py) share: register tiles of
inner products over a block of rows (`tile_scores`), a running top k (`keep_best`), the query padding the tiles
take (`padded_queries`), and the one right to run numba's parallel region (`parallel_region`).

numba's default thread pool (workqueue) runs one parallel region at a time and is not reentrant: two scans on
two threads at once (serve answers requests on a thread pool) would fail or deadlock. Every caller of a
`parallel=True` kernel holds `parallel_region()` around it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numba
import numpy as np

SCAN_STRIDE = 32  # a scan tile's 4 rows lie this far apart (blocks of 128 rows)

_PARALLEL = threading.Lock()


@contextmanager
def parallel_region():
    """Held around every call of a `parallel=True` kernel: one scan at a time, each on every thread (numba's
    threads: NUMBA_NUM_THREADS, set at process start, default every core)."""
    with _PARALLEL:
        yield


@numba.njit(fastmath={"reassoc", "contract"}, cache=True)
def tile_scores(vectors, queries, lo, hi, scores):
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
    """One 4 rows (i + 0..3 s) x 2 queries (j, j+1) tile of `tile_scores`, written at column r."""
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
    """One 4 rows (i + 0..3 s) x 4 queries (j..j+3) tile of `tile_scores`, written at column r."""
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
