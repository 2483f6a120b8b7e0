"""The data stages' worker processes (data/workers.py)."""

import sys

from openalign.data.workers import process_pool


def lazily_loaded_parts() -> dict:
    """What a library loads only on first use, as a worker sees it before its first task."""
    return {"every Pillow format plugin": "PIL.WebPImagePlugin" in sys.modules,
            "pyarrow's pandas shim": "pandas" in sys.modules}


def test_a_worker_starts_with_what_every_task_reads_and_writes_with_loaded():
    # each worker loading them at its first task cost 0.8 s, three tars' worth of ingest (bench/data_plane.py P11)
    with process_pool(1) as pool:
        assert pool.apply(lazily_loaded_parts) == {"every Pillow format plugin": True, "pyarrow's pandas shim": True}
