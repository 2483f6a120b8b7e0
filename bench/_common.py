"""Helpers shared by the bench scripts."""

from __future__ import annotations

import resource
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def write_section(name: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace the block between `<!-- NAME begin/end -->` markers in docs/benchmarks.md (append if absent)."""
    begin, end = f"<!-- {name} begin -->", f"<!-- {name} end -->"
    text = path.read_text() if path.is_file() else "# Benchmarks\n\nRatios measured side by side in one run.\n\n"
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def verdict(target: str, name: str, value: float, bound: float, at_least: bool, fmt: str = ".2f") -> str:
    ok = value >= bound if at_least else value <= bound
    line = f"{target} {name}={value:{fmt}} target{'>=' if at_least else '<='}{bound:g} {'PASS' if ok else 'FAIL'}"
    if not ok and bound and value == value:  # how far off, as a factor of the target
        line += f" ({value / bound:.2f}x the target: {'short' if at_least else 'over'} by " \
                f"{abs(value - bound) / bound:.0%})"
    return line


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM belongs to the address space, so unlike ru_maxrss it
    does not inherit the high-water mark of the parent that forked us."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_mib() -> float:
    """This process's resident memory now (the baseline for an extra-peak measurement)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
