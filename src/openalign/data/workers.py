"""Worker processes for the data stages (ingest, dedup, shard, and the local engine's tasks).

They are forked from a fork server, not from the caller: the caller may already run threads (a Spark JVM
gateway, tqdm's monitor, BLAS pools), and a plain fork can copy one of their locks mid-hold and deadlock the
child. They live no longer than the caller: the fork server imports `openalign.data.fork_server` first, which
has the kernel kill it when the caller dies, and every worker does the same towards the fork server
(`host.die_with_parent`). Before, a kill -9 of a local-engine driver left the fork server, the resource tracker
and the workers running (the workers wait on their task queue for ever).

The fork server also loads what every stage's tasks read and write with (`load_readers`) before it forks, so a
worker starts with it loaded instead of importing it itself (each worker importing it at once on a 2-core machine
took about as long as a small stage's tasks).
"""

from __future__ import annotations

import multiprocessing

from openalign.host import die_with_parent


def forkserver():
    """The fork-server context of every data stage's workers, its server tied to this process's lifetime."""
    context = multiprocessing.get_context("forkserver")
    # read when the server starts (once); fork_server first: it ties the server to this process
    context.set_forkserver_preload(["openalign.data.fork_server"])
    return context


def load_readers() -> None:
    """Load in full what every stage's tasks read and write with: numpy, pyarrow and Pillow (`openalign.data.sources`)
    and the parts they load lazily on first use. Pillow imports every format's plugin at its first `Image.open`;
    pyarrow imports pandas (when installed) the first time it builds an array from Python values, as every Parquet
    part a task writes does. In a fresh worker those cost 0.8 s at its first task, three tars' worth of ingest
    (bench/data_plane.py), paid again by every worker of every pool. Called by the fork server before it forks."""
    import importlib

    import PIL.Image
    import pyarrow as pa

    importlib.import_module("openalign.data.sources")  # imported here to be inherited
    PIL.Image.init()
    pa.array([0])


def process_pool(workers: int):
    """A pool of `workers` processes from the fork server; they die with it, and it with the caller."""
    return forkserver().Pool(workers, initializer=die_with_parent)
