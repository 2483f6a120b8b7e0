"""Worker processes for the data stages (ingest, dedup, shard)."""

from __future__ import annotations

import multiprocessing


def process_pool(workers: int):
    """A pool of `workers` processes forked from a fork server, not from the caller: the caller may
    already run threads (a Spark JVM gateway, tqdm's monitor, BLAS pools), and a plain fork can copy
    one of their locks mid-hold and deadlock the child."""
    return multiprocessing.get_context("forkserver").Pool(workers)
