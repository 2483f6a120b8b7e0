"""How a process uses the host: its memory (below), how long its worker processes live (`die_with_parent`), and
how long its caches live (`command_cache`, `command_scope`: as long as the command that filled them).

PyTorch has no caching allocator on the CPU: every tensor comes from the C library's `malloc`, and glibc
serves blocks above its mmap threshold (at most 32 MiB) with a fresh `mmap` and gives them back with
`munmap` when freed. A training step on the CPU allocates and frees the same large activations every
step (the demo: [128, 96, 32, 32] float maps, 50 MB each), so every step faults each of their 4 KiB pages
in again and the kernel zeroes them: ~64,000 page faults and ~0.1 s of system time per demo step, and
memory-bound operators (BatchNorm, SiLU, padding) ran 3x slower than on reused memory.

`reuse_freed_memory()` makes glibc keep what it has: no `mmap` for large blocks (they come from the heap)
and no trimming of the heap's top, so the next step reuses the pages. The process's resident memory then
stays at its peak (the demo step: +5-10% peak RSS) instead of rising and falling each step, which is what
a long-running training or evaluation process wants anyway. Other C libraries (macOS, musl) are left
alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from contextlib import contextmanager
from collections.abc import Callable

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
_applied = False


def die_with_parent() -> None:
    """A worker's initializer: the kernel kills this process when its parent dies (Linux PR_SET_PDEATHSIG). Pool
    workers otherwise wait on their task queue for ever when the driver is killed (kill -9 of a local-engine
    run left its workers running); the fork server that starts them exits on the driver's death by itself."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the workers end with their queue instead
        return
    if os.getppid() == 1:  # the parent died before the call: nobody would send the signal
        os._exit(1)


PR_SET_PDEATHSIG = 1  # prctl(2)

_CACHES: list[Callable[[], None]] = []


def command_cache(clear: Callable[[], None]) -> Callable[[], None]:
    """Register a per-process cache by its `clear`: it is emptied when the command that filled it ends
    (`command_scope`), so a second command in the same process (a test, a notebook, a warm worker) never sees
    the first's tar offsets or models."""
    _CACHES.append(clear)
    return clear


@contextmanager
def command_scope():
    """One command's lifetime: every registered cache is emptied when it ends, however it ends."""
    try:
        yield
    finally:
        for clear in _CACHES:
            clear()


def reuse_freed_memory() -> bool:
    """Make glibc reuse freed memory instead of returning it to the kernel (once per process; children
    forked later inherit it). Returns whether it is in effect."""
    global _applied
    if _applied:
        return True
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr on this platform
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; the trim threshold is an int: its largest value means "never trim"
    _applied = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    return _applied


def reuses_freed_memory() -> bool:
    """Whether `reuse_freed_memory()` is in effect in this process."""
    return _applied


# The unary operators ATen hands to MKL's vector math library (ATen/cpu/vml.h), warmed in float32 and float64.
# expm1, log1p and abs were handed to it by earlier releases; warming them costs nothing.
VML_OPERATORS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "expm1", "log", "log10", "log1p",
                 "log2", "sin", "sqrt", "tan", "tanh", "trunc", "abs")
_vector_math_settled = False


def settle_vector_math() -> None:
    """Call each of MKL's vector math functions once, on one element in this thread, before any operator runs them
    on several threads (once per process; children forked later inherit it).

    On the CPU, ATen computes float unary operators (sqrt, exp, tanh, erf, ...) of more than 2,048 elements on the
    intra-op threads, each calling MKL's VML on its chunk, and MKL chooses each function's kernel when that function
    is first called. When that first call runs on two threads at once, one thread can run a low-accuracy kernel for
    its whole chunk, once: a square root then agrees with the true one to 12 bits instead of 24 (pytorch/pytorch
    #188792; oneMKL 2024.2, the MKL of the torch wheels we lock). The next call is right, so nothing shows but a
    number that differs in the 4th digit. Training met it in LAMB's first update after a resume, on a loaded
    machine: the word embeddings' `exp_avg_sq.sqrt()` (2,080 elements, split 1,040 + 1,040) came out as
    `v * rsqrt(v)` on one chunk, and the resumed run drifted from the run that was never stopped (issue 83)."""
    global _vector_math_settled
    if _vector_math_settled:
        return
    import torch

    for dtype in (torch.float32, torch.float64):
        x = torch.full((1,), 0.5, dtype=dtype)  # inside every function's domain
        for name in VML_OPERATORS:
            getattr(torch, name)(x)
    _vector_math_settled = True


def set_threads(threads: int) -> None:
    """torch's intra-op thread count, with MKL's vector math settled first (`settle_vector_math`): every process
    that computes on several CPU threads goes through here."""
    import torch

    settle_vector_math()
    torch.set_num_threads(threads)


EXTRAS = {"spark": ("pyspark",), "serve": ("fastapi", "uvicorn"), "dashboards": ("tensorboard", "wandb"),
          "web": ("fastwarc", "selectolax", "msgspec", "fsspec", "aiohttp", "warcio", "protego")}


def require_extra(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """One sentence with the pip command when `what` needs openalign's optional `extra` (pyproject.toml) and its
    packages (`modules`, default: all of the extra's) are not installed; asked before any work."""
    import importlib.util

    missing = [m for m in (modules or EXTRAS[extra]) if importlib.util.find_spec(m) is None]
    if missing:
        from openalign.config import ConfigError

        raise ConfigError(f"{what} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                          f"installed: pip install 'openalign[{extra}]'")

