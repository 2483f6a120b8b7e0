import os
import subprocess
import sys
from pathlib import Path

import pytest

from openalign import host

# Allocate, touch and free a 64 MiB block twice (plain libc calls, no torch), printing the page faults the
# second round took: a block served by mmap is faulted in again page by page; a reused one is not.
PROBE = """
import ctypes, ctypes.util, resource, sys
from openalign import host
if sys.argv[1] == "reuse":
    assert host.reuse_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
n = 64 << 20
for round in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    libc.memset(p, 1, n)
    libc.free(p)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults)
"""


def second_round_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or "glibc" not in os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="glibc's mallopt only")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    pages = (64 << 20) // 4096
    assert second_round_faults("default") > pages // 2  # glibc's default: mmap, munmap, fault in again
    assert second_round_faults("reuse") < pages // 20


def test_reuse_is_idempotent():
    assert host.reuse_freed_memory() == host.reuse_freed_memory()


def test_vector_math_is_settled_on_one_element_in_this_thread_before_the_thread_count_is_set(monkeypatch):
    # MKL picks each vector math function's kernel at its first call; a first call on two threads at once can run a
    # low-accuracy kernel for one thread's chunk (issue 83: the resumed run's first LAMB update). Every function
    # is called once on one element (one chunk, this thread) before any operator can run it on several threads.
    import torch

    calls = []
    for name in host.VML_OPERATORS:
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda x, name=name, real=real: calls.append((name, x.dtype, x.numel()))
                            or real(x))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(("set_num_threads", n)))
    monkeypatch.setattr(host, "_vector_math_settled", False)
    host.set_threads(3)
    warmed = {(name, dtype) for name, dtype, numel in calls[:-1] if numel == 1}
    assert warmed == {(name, dtype) for name in host.VML_OPERATORS for dtype in (torch.float32, torch.float64)}
    assert len(calls) == len(warmed) + 1 and calls[-1] == ("set_num_threads", 3)  # settled first, then threads
    host.set_threads(2)  # once per process
    assert calls[-2:] == [("set_num_threads", 3), ("set_num_threads", 2)]


def test_every_thread_count_is_set_through_host():
    # a torch.set_num_threads of its own would let that command's first operators race in MKL (above)
    import openalign

    src = Path(openalign.__file__).parent
    direct = [f"{path.relative_to(src)}:{number}" for path in sorted(src.rglob("*.py")) if path.name != "host.py"
              for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if "torch.set_num_threads(" in line]
    assert direct == [], f"set the thread count with host.set_threads: {direct}"
