"""The command line of every study: `python -m experiments.NAME --out DIR [--quick] [--seeds N] [key=value ...]`.

A study of variants (lab/runner.py's `Study`) takes a base config (`--preset`, `--data`, `--eval-data`, dotted
overrides) and `--only`; a study with a runner of its own (pmi, failure_modes) takes its options as key=value.
Mistakes are one sentence and exit code 2, as openalign's own commands answer them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from collections.abc import Callable

import openalign
from openalign import config as config_lib
from openalign import distributed, presets
from openalign.outputs import owned

# --quick: about a minute per run on 2 CPU cores with the demo preset; no periodic evaluation or checkpoints, as a
# short run is rerun whole
QUICK = ("train.steps=100", "train.eval_every=0", "train.checkpoint_every=0", "model.vision.image_size=48",
         "model.vision.resize_size=54")


def parser(name: str, description: str) -> argparse.ArgumentParser:
    """The flags every study has: where it writes, how short, how many seeds, quiet."""
    p = argparse.ArgumentParser(prog=f"python -m experiments.{name}", description=description)
    p.add_argument("--out", required=True, help="the study's folder: each run, the report, its plots and results.json")
    p.add_argument("--quick", action="store_true", help="short runs: minutes each on a CPU")
    p.add_argument("--seeds", type=int, default=1, help="runs per variant (mean ± std)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def variant_parser(study) -> argparse.ArgumentParser:
    """A study of variants: the base config of every run, and the variants to run."""
    p = parser(study.name, study.intro)
    p.add_argument("--preset", default="demo", help=f"the base config: one of {', '.join(presets.PRESETS)}")
    p.add_argument("--data", help="the training shards: a directory of .tar, a brace pattern, a list file, or a "
                                  "Karpathy JSON")
    p.add_argument("--eval-data", help="the held-out shards for evaluation, or a Karpathy-split JSON")
    p.add_argument("--images", help="the image root when --data or --eval-data is a Karpathy-split JSON")
    p.add_argument("--only", action="append", help="a group or variant to run (repeatable); the baseline always runs")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of the base config, e.g. "
                                                                     "optim.lr=5e-4")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None, field: str) -> argparse.Namespace:
    """The flags, with key=value given after them too (argparse leaves those out of `field`, a trailing list)."""
    args, extra = p.parse_known_args(argv)
    if extra and all("=" in e and not e.startswith("-") for e in extra):
        setattr(args, field, [*getattr(args, field), *extra])
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def guarded(run: Callable[[], int]) -> int:
    """`run()`, with a user's mistake as one sentence on stderr and exit code 2."""
    try:
        return run()
    except openalign.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def base_config(study, args, extra: tuple[str, ...] = ()) -> config_lib.Config:
    """The base config as `openalign train` resolves it: the preset, the data flags, `extra` (the study's own), the
    held-out tasks the study adds, --quick's budget, then the user's overrides; notes on loss options printed."""
    import warnings

    data = [f"data.{key}={value}" for key, value in (("train", args.data), ("eval", args.eval_data),
                                                     ("images", args.images)) if value]
    preset = presets.get(args.preset)
    tasks = [f"eval.tasks={','.join(dict.fromkeys([*preset.eval.tasks, *study.tasks]))}"] if study.tasks else []
    quick = [*QUICK, *study.quick] if args.quick else []
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        cfg = openalign.configure(args.preset, [*data, *extra, *tasks, *quick, *args.overrides])
    if distributed.from_env().main:
        for note in notes:
            print(f"note: {note.message}", file=sys.stderr)
    return cfg


def run_variants(study, args, extra: tuple[str, ...] = ()) -> int:
    """Every variant of `study` over the seeds into --out, then the report (rank 0 under torchrun)."""
    from experiments.lab import report as study_report
    from experiments.lab.runner import run_study

    cfg = base_config(study, args, extra)
    variants = study.variants(cfg)
    if args.only:
        variants = [v for v in variants if v.baseline or v.group in args.only or v.name in args.only]
    out = Path(args.out)
    start = time.perf_counter()
    results = run_study(study.name, cfg, variants, args.seeds, out, progress=not args.quiet)
    if not distributed.from_env().main:  # under torchrun every rank trained; rank 0 reports
        return 0
    report = study_report.write(study, results, args.seeds, out, study.headline(cfg))
    runs = sum(len(r["runs"]) for r in results.values())
    print(f"{len(results)} variants x {args.seeds} seed(s) ({runs} runs) in {(time.perf_counter() - start) / 60:.1f} "
          f"min -> {report}, {out / 'study.png'}, {out / 'results.json'}")
    key, metric = study.headline(cfg)
    for row in results.values():
        mean, std = row["mean"].get(key, float("nan")), row["std"].get(key, 0.0)
        print(f"  {row['label']:<40} {metric} {mean:.3f} ± {std:.3f}")
    return 0


def main(study, argv: list[str] | None = None, flags: Callable[[argparse.ArgumentParser], None] | None = None,
         extra: Callable[[argparse.Namespace], tuple[str, ...]] = lambda args: ()) -> int:
    """`python -m experiments.NAME` of a study of variants; `flags` adds the study's own, `extra` turns them into
    overrides of the base config (before --quick's and the user's)."""
    p = variant_parser(study)
    if flags:
        flags(p)
    args = parse(p, argv, "overrides")
    return guarded(lambda: _locked(args, lambda: run_variants(study, args, extra(args))))


def _locked(args, run: Callable[[], int]) -> int:
    """`run()` holding --out's lock (rank 0 under torchrun, which alone writes the report); every rank leaves the
    process group together."""
    import contextlib
    import os

    lock = owned(Path(args.out)) if int(os.environ.get("RANK", 0)) == 0 else contextlib.nullcontext()
    with lock:
        code = run()
    if "torch.distributed" in sys.modules:
        distributed.shutdown()
    return code


def standalone(name: str, description: str, defaults, quick: tuple[str, ...], run: Callable, report: Callable,
               argv: list[str] | None, summary: Callable[[object, dict], list[str]], extra_flags=None,
               extra: Callable[[argparse.Namespace], list[str]] = lambda args: []) -> int:
    """A study with its own runner and options (pmi, failure_modes): its options from --quick and key=value over
    `defaults`, then `run(options, seeds, out, progress)` and `report(results, out)`; `summary` gives the lines
    printed after the report's path."""
    p = parser(name, description)
    p.add_argument("options", nargs="*", metavar="key=value", help=f"the study's options ({type(defaults).__name__})")
    if extra_flags:
        extra_flags(p)
    args = parse(p, argv, "options")

    def go() -> int:
        options = config_lib.override(defaults, [*(quick if args.quick else ()), *args.options, *extra(args)],
                                      help_hint=f"the options are {type(defaults).__name__}'s fields, in "
                                                f"experiments/{name}")
        config_lib.check(options)
        start = time.perf_counter()
        results = run(options, args.seeds, Path(args.out), progress=not args.quiet)
        path = report(results, Path(args.out))
        print(f"{name} in {(time.perf_counter() - start) / 60:.1f} min -> {path}")
        for line in summary(options, results):
            print(f"  {line}")
        return 0

    return guarded(lambda: _locked(args, go))
