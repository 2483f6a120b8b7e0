"""`python -m experiments.reproduce --out DIR [--only STUDY] [--record]`: every study's --quick run, afresh, against
the tables committed in experiments/expected/STUDY-quick.md.

A table is the report's lines that start with "|"; a column of wall-clock time (its header names ms, seconds,
minutes or wall) is left out, as no two runs share it. The runs are seeded and the CPU kernels deterministic for a
given thread count, so a study that still computes what it did gives its table to the digit; any other row is
printed beside the committed one. `--record` writes the tables instead (after a change that means to move them).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
import time
from pathlib import Path

EXPECTED = Path(__file__).resolve().parent / "expected"
STUDIES = ("pmi", "noise_scale", "model_data", "ablation", "dynamics", "multilingual", "compositional", "loss_batch",
           "failure_modes", "transfer", "transfer_levers")
# failure_modes' rerank-cost and concept-frequency parts read `make demo`'s model, another run's output (and
# rerank-cost measures wall time): the reproduction runs its other parts
ONLY = {"failure_modes": ["composition-toy", "deeper-tower", "generic-captions", "relations", "several-objects"]}
TIMED = re.compile(r"\b(ms|seconds|minutes|wall)\b", re.IGNORECASE)


def tables(report: str) -> list[str]:
    """The report's table rows (a table: lines starting with "|", its header first), each cell of a wall-clock
    column replaced by "…"."""
    rows: list[str] = []
    timed: set[int] = set()
    header = True
    for line in report.splitlines():
        if not line.startswith("|"):
            header = True
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header:
            timed, header = {i for i, cell in enumerate(cells) if TIMED.search(cell)}, False
        rule = set("".join(cells)) <= set("-: ")
        rows.append(line if rule or not timed else
                    "| " + " | ".join("…" if i in timed else cell for i, cell in enumerate(cells)) + " |")
    return rows


def expected_path(name: str) -> Path:
    return EXPECTED / f"{name}-quick.md"


def machine() -> str:
    """What the digits depend on beyond the code: torch, its CPU kernels' instruction set and the thread count."""
    import torch

    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} kernels, {os.cpu_count()} threads"


def record(name: str, rows: list[str]) -> None:
    """The committed tables of `name`, with the command that made them and the machine they were made on."""
    expected_path(name).write_text(f"<!-- the tables of `python -m experiments.{name} --quick` (report.md, wall-clock "
                                   "columns as …); `python -m experiments.reproduce` reruns it and compares to the "
                                   f"digit; recorded with {machine()} -->\n" + "\n".join(rows) + "\n",
                                   encoding="utf-8")


def recorded_on(name: str) -> str:
    """The machine `name`'s committed tables were recorded with ("" when the file does not say)."""
    path = expected_path(name)
    found = re.search(r"recorded with (.+?) -->", path.read_text(encoding="utf-8")) if path.is_file() else None
    return found.group(1) if found else ""


def compare(name: str, rows: list[str]) -> list[str]:
    """The differing lines of `name`'s tables against the committed ones (none: reproduced)."""
    path = expected_path(name)
    if not path.is_file():
        return [f"no committed table: {path} (run with --record to write it)"]
    want = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    if want == rows:
        return []
    return [line for line in difflib.unified_diff(want, rows, "committed", "this run", lineterm="", n=0)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="a new folder: one sub-folder per study, each trained afresh")
    p.add_argument("--only", action="append", choices=STUDIES, help="a study to rerun (repeatable; default: all)")
    p.add_argument("--record", action="store_true", help="write the tables to experiments/expected instead")
    args = p.parse_args(argv)
    out = Path(args.out)
    names = args.only or list(STUDIES)
    reused = [name for name in names if (out / name).exists()]
    if reused:
        p.error(f"{out / reused[0]} already exists, and a reproduction trains afresh (a study resumes its finished "
                "runs): give a new --out")
    failed = []
    for name in names:
        start = time.perf_counter()
        study = importlib.import_module(f"experiments.{name}")
        parts = [flag for part in ONLY.get(name, []) for flag in ("--only", part)]
        if study.main(["--quick", "--out", str(out / name), "--quiet", *parts]) != 0:
            print(f"{name}: the run failed", file=sys.stderr)
            failed.append(name)
            continue
        rows = tables((out / name / "report.md").read_text(encoding="utf-8"))
        minutes = (time.perf_counter() - start) / 60
        if args.record:
            record(name, rows)
            print(f"{name}: {len(rows)} table rows recorded in {expected_path(name)} ({minutes:.1f} min)")
            continue
        diff = compare(name, rows)
        print(f"{name}: " + (f"reproduces its {len(rows)} table rows to the digit" if not diff else
                             f"{len(diff)} lines differ from the committed table") + f" ({minutes:.1f} min)")
        if diff:
            print("\n".join(diff))
            if (then := recorded_on(name)) != machine():
                print(f"{name}'s tables were recorded with {then or 'an unnamed machine'}, this run with {machine()}: "
                      "other CPU kernels can move a long run's last digit")
            failed.append(name)
    if failed:
        print(f"not reproduced: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
