import os
import subprocess
import sys

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
