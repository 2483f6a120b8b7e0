"""`python -m experiments.failure_modes`: where contrastive training fails, measured against what the standard
teaching of CLIP-style models states with numbers (docs/results.md has the readings).

Each part is a module of this package with its `run` (options, seeds -> its results), and its `section` (the
report's table, figure and reading, each verdict computed from the numbers); `--only` picks parts, and the parts an
earlier call ran stay in results.json with the options and seeds they ran with.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

import openalign
from experiments.failure_modes import captions, depth, frequency, objects, relations, rerank, toy
from experiments.failure_modes.options import PARTS, QUICK, FailureOptions
from experiments.lab import command

INTRO = ("Where contrastive training fails, measured against what the standard teaching of CLIP-style models states "
         "with numbers, part by part.")
MODULES = {module.NAME: module for module in (toy, depth, captions, rerank, frequency, relations, objects)}
assert tuple(MODULES) == PARTS


def run(options: FailureOptions, seeds: int, out: Path, progress: bool = True) -> dict:
    """Every part asked for, added to results.json in `out`."""
    unknown = [p for p in options.parts if p not in PARTS]
    if unknown:
        raise openalign.ConfigError(f"failure-modes: unknown part {unknown[0]!r}; parts: {', '.join(PARTS)}")
    if seeds < 1:
        raise openalign.ConfigError(f"--seeds must be at least 1, not {seeds}")
    torch.set_num_threads(1)  # tiny matrices: threads cost more than they give
    try:
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        results = {}
    for part in options.parts:
        results[part] = MODULES[part].run(options, seeds, out, progress) | {"options": asdict(options), "seeds": seeds}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def ran_with(result: dict) -> FailureOptions:
    """The options a part ran with, as results.json keeps them."""
    return FailureOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in result["options"].items()})


def write_report(results: dict, out: Path) -> Path:
    """report.md and each part's PNG in `out`, the parts in their order."""
    lines = ["# openalign study: failure-modes", "", INTRO, ""]
    for part in PARTS:
        if part in results:
            lines += MODULES[part].section(results[part], ran_with(results[part]), results[part]["seeds"], out)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def summary(options: FailureOptions, results: dict) -> list[str]:
    """The lines printed after the report: the composition toy's two numbers per tower, when it ran."""
    if "composition-toy" not in results:
        return []
    towers = results["composition-toy"]["towers"]
    return [f"composition toy, {label}: training loss {towers[tower]['mean']['final_loss']:.3f}, held-out pairs "
            f"recognised {towers[tower]['mean']['heldout_accuracy']:.1%}" for tower, label in toy.TOWERS.items()]


def only_flag(p) -> None:
    p.add_argument("--only", action="append", choices=PARTS, help="a part to run (repeatable); default: every part")


def main(argv: list[str] | None = None) -> int:
    return command.standalone("failure_modes", INTRO, FailureOptions(),
                              QUICK, run, write_report, argv, summary, only_flag,
                              lambda args: ["parts=" + ",".join(args.only)] if args.only else [])
