"""`openalign study`: the paper's arguments rerun in miniature (study/), and the two studies with runners of their
own (pmi, failure-modes)."""

from __future__ import annotations

import time
from pathlib import Path

from openalign import config as config_lib
from openalign import presets
from openalign.cli.common import fitted, run_flags, with_data
from openalign.config import ConfigError


def study_flags(p) -> None:
    p.add_argument("name", help="ablation, noise-vs-scale, model-vs-data, multilingual, compositional, dynamics, "
                                "loss-batch, pmi (the loss alone on a synthetic table: its options as key=value) or "
                                "failure-modes (the teaching's failure modes, part by part: --only PART)")
    p.add_argument("--out", required=True, help="the study's folder: each run, the report, its plots and results.json")
    run_flags(p, "the base config of every run")
    p.add_argument("--quick", action="store_true", help="short runs: minutes each on a CPU")
    p.add_argument("--seeds", type=int, default=1, help="runs per variant (mean ± std)")
    p.add_argument("--only", action="append", help="a group or variant to run (repeatable); the baseline always runs")
    p.add_argument("--sources", action="store_true", help="noise-vs-scale: more data as new sources (clean emoji "
                   "against emoji + openclipart + shapes with noisy alt-texts), each source's held-out split measured")


def run_study(args) -> int:
    from openalign import distributed
    from openalign import study as study_lib
    from openalign.study import QUICK, STUDIES
    from openalign.study import report as study_report

    if args.name == "pmi":
        return _study_pmi(args)
    if args.name == "failure-modes":
        return _study_failure_modes(args)
    if args.name not in STUDIES:
        raise ConfigError(f"unknown study {args.name!r}; choose from {', '.join(STUDIES)}, pmi or failure-modes")
    study = STUDIES[args.name]
    cfg = with_data(presets.get(args.preset), args)
    if args.sources:
        if args.name != "noise-vs-scale":
            raise ConfigError("--sources belongs to the noise-vs-scale study (more data as new sources)")
        from openalign.study.noise_scale import SOURCES

        cfg = config_lib.override(cfg, ["data.corpus=" + "+".join(SOURCES)])
    tasks = [f"eval.tasks={','.join(dict.fromkeys([*cfg.eval.tasks, *study.tasks]))}"] if study.tasks else []
    cfg = config_lib.override(cfg, tasks + ([*QUICK, *study.quick] if args.quick else []) + list(args.overrides))
    cfg = fitted(cfg, args.overrides)
    variants = study.variants(cfg)
    if args.only:
        variants = [v for v in variants if v.baseline or v.group in args.only or v.name in args.only]
    out = Path(args.out)
    start = time.perf_counter()
    results = study_lib.run_study(args.name, cfg, variants, args.seeds, out, progress=not args.quiet)
    if not distributed.from_env().main:  # under torchrun every rank trained; rank 0 reports
        return 0
    report = study_report.write(args.name, study, results, args.seeds, out, study.headline(cfg))
    if study.extra_report:
        report.write_text(report.read_text() + "\n".join(study.extra_report(results, out)) + "\n")
    runs = sum(len(r["runs"]) for r in results.values())
    print(f"{len(results)} variants x {args.seeds} seed(s) ({runs} runs) in {(time.perf_counter() - start) / 60:.1f} "
          f"min -> {report}, {out / 'study.png'}, {out / 'results.json'}")
    key, metric = study.headline(cfg)
    for name, row in results.items():
        mean, std = row["mean"].get(key, float("nan")), row["std"].get(key, 0.0)
        print(f"  {row['label']:<40} {metric} {mean:.3f} ± {std:.3f}")
    return 0


def _study_pmi(args) -> int:
    """`study pmi`: no towers and no data: the loss alone on a synthetic count table (study/pmi.py)."""
    from openalign.study import pmi

    options, results, report, start = _standalone_study(
        args, pmi, pmi.PmiOptions(), pmi.QUICK, ("data", "eval_data", "images", "only", "sources"),
        "the pmi study (it makes its own table); set its options as key=value, e.g. widths=4,16 steps=600",
        "the pmi study's options are those of study/pmi.py's PmiOptions")
    print(f"{len(options.widths)} widths x 3 losses x {args.seeds} seed(s) in "
          f"{(time.perf_counter() - start) / 60:.1f} min -> {report}, {Path(args.out) / 'pmi.png'}")
    for width in options.widths:
        cells = [f"{name.split(' (')[0]} {results['learned'][d][str(width)]['mean']['residual']:.3f}"
                 for d, name in pmi.DIRECTIONS.items()]
        print(f"  d={width:<3} residual from PMI + one constant: " + ", ".join(cells)
              + f"; rank-d SVD {results['svd'][str(width)]['residual']:.3f}")
    return 0


def _standalone_study(args, module, defaults, quick: tuple, refused: tuple, refusal: str, hint: str,
                      extra: list | None = None):
    """A study with its own runner and options (pmi, failure-modes): flags it has no use for refused, its options
    from --quick and key=value, then `module.run` and `module.write_report`."""
    for flag in refused:
        if getattr(args, flag):
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to {refusal}")
    options = config_lib.override(defaults, [*(quick if args.quick else ()), *args.overrides, *(extra or [])],
                                  help_hint=hint)
    config_lib.check(options)
    start = time.perf_counter()
    results = module.run(options, args.seeds, Path(args.out), progress=not args.quiet)
    return options, results, module.write_report(results, Path(args.out)), start


def _study_failure_modes(args) -> int:
    """`study failure-modes`: the teaching's failure modes of contrastive training, part by part
    (study/failure_modes.py)."""
    from openalign.study import failure_modes

    extra = ["parts=" + ",".join(args.only)] if args.only else []
    options, results, report, start = _standalone_study(
        args, failure_modes, failure_modes.FailureOptions(), failure_modes.QUICK, ("data", "eval_data", "images",
                                                                                    "sources"),
        "the failure-modes study; set its options as key=value, e.g. parts=composition-toy toy_steps=1000",
        "the failure-modes study's options are those of study/failure_modes.py's FailureOptions", extra)
    print(f"{len(options.parts)} part(s) x {args.seeds} seed(s) in {(time.perf_counter() - start) / 60:.1f} min -> "
          f"{report}")
    if "composition-toy" in results:
        for tower, label in failure_modes.TOWERS.items():
            m = results["composition-toy"]["towers"][tower]["mean"]
            print(f"  composition toy, {label}: training loss {m['final_loss']:.3f}, held-out pairs recognised "
                  f"{m['heldout_accuracy']:.1%}")
    return 0
