"""Worker processes for the data stages (ingest, dedup, shard, and the local engine's tasks).

They are forked from a fork server, not from the caller: the caller may already run threads (a Spark JVM
gateway, tqdm's monitor, BLAS pools), and a plain fork can copy one of their locks mid-hold and deadlock the
child. They live no longer than the caller: the fork server imports `openalign.data.fork_server` first, which
has the kernel kill it when the caller dies, and every worker does the same towards the fork server
(`host.die_with_parent`). Before, a kill -9 of a local-engine driver left the fork server, the resource tracker
and the workers running (the workers wait on their task queue for ever).

The fork server also imports what every stage's tasks read with (numpy, pyarrow, Pillow: `openalign.data.sources`)
before it forks, so a worker starts with them loaded instead of importing them itself (each worker importing them
at once on a 2-core machine took about as long as a small stage's tasks).
"""

from __future__ import annotations

import multiprocessing

from openalign.host import die_with_parent


def forkserver():
    """The fork-server context of every data stage's workers, its server tied to this process's lifetime."""
    context = multiprocessing.get_context("forkserver")
    # read when the server starts (once); fork_server first: it ties the server to this process
    context.set_forkserver_preload(["openalign.data.fork_server", "openalign.data.sources"])
    return context


def process_pool(workers: int):
    """A pool of `workers` processes from the fork server; they die with it, and it with the caller."""
    return forkserver().Pool(workers, initializer=die_with_parent)
