"""`openalign eval`: the flags of `openalign.evaluate` (eval/evaluate.py), then its summary and report."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from openalign import config as config_lib
from openalign.eval.options import FinetuneConfig
from openalign.flags import add_options, given, options_from


def eval_flags(p) -> None:
    from openalign.eval.options import TASK_OPTIONS, EvalOptions

    p.add_argument("model", help="a model directory (RUN/model, or a CLIP or SigLIP directory)")
    p.add_argument("--data", required=True, help="the evaluation data: shards, a Karpathy JSON, a caption or label "
                                                 "table, class folders, a Multi30k list, or a task's own file")
    p.add_argument("--task", action="append", help=f"a task to run, repeatable: {', '.join(TASK_OPTIONS)} (default: "
                                                   "retrieval and zeroshot, or zeroshot for a set without captions; "
                                                   "see docs/evaluation.md)")
    add_options(p, EvalOptions, skip=("max_length", "model_id"))
    users: dict[str, list[str]] = {}
    for task, options in TASK_OPTIONS.items():
        for f in dataclasses.fields(options):
            users.setdefault(f.name, []).append(task)
    seen: set = set()
    for options in TASK_OPTIONS.values():  # each task's options; a flag shared by several tasks sets it in each
        add_options(p, options, unset=True, seen=seen, where={k: f"{', '.join(v)}: " for k, v in users.items()},
                    rename={"dir": "--cxc", "k": "-k"}, convert={"templates": str}, skip=("recipe", "sgd"))
    p.add_argument("--protocol", choices=("imagenet-probe", "imagenet-finetune", "fine-grained", "vtab"),
                   help="one of the paper's transfer protocols: its task, resolutions and recipe (docs/evaluation.md), "
                        "whose numbers --ft and task.key=value still override")
    p.add_argument("--ft", action="append", metavar="key=value",
                   help="finetune, vtab: an item of the recipe, e.g. --ft steps=500 --ft lr=0.01 --ft freeze_bn=true "
                        f"(keys: {', '.join(config_lib.leaf_keys(FinetuneConfig))})")
    p.add_argument("--out", default="metrics.json", help="the metrics JSON (a .md table and a .png beside it), or with "
                   "--format clip_benchmark each task's result file, {task} {dataset} {model} {pretrained} {language} "
                   "filled in")
    p.add_argument("--format", choices=("openalign", "clip_benchmark"), default="openalign",
                   help="clip_benchmark: CLIP_benchmark's result JSON (zero-shot classification and retrieval; its "
                        "`dataset` is the --data folder's name, `model` the model folder's name)")
    p.add_argument("overrides", nargs="*", metavar="task.key=value",
                   help="task options, e.g. knn.k=5 cxc.positive_score=4 finetune.recipe.lr=0.01")


def run_eval(args) -> int:
    from openalign import host
    from openalign.eval.evaluate import evaluate, task_settings
    from openalign.eval.options import EvalOptions
    from openalign.eval.report import metric_lines, write_clip_benchmark
    from openalign.eval.tasks import clip_benchmark_metrics

    host.set_threads(os.cpu_count() or 1)
    tasks = args.task or []
    if args.format == "clip_benchmark":
        clip_benchmark_metrics({}, tasks)  # a task it has no place for is refused before any image is embedded
    result = evaluate(args.model, args.data, tasks, protocol=args.protocol or "",
                      options=options_from(args, EvalOptions), settings=given(args, task_settings()),
                      recipe=args.ft or (), overrides=args.overrides)
    if args.format == "clip_benchmark":
        written = write_clip_benchmark(result.clip_benchmark(), args.out, args.model, Path(args.data.rstrip("/")).stem)
        print("\n".join(metric_lines(result.metrics)))  # (CLIP_benchmark's sets have no figure of the paper's)
    else:
        written = result.write(args.out)
        print("\n".join(result.lines()))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
