"""The evaluation tasks: one registry, one contract (in the style of big_vision's evaluators).

Each `Task` declares its name, what it reads, whether it runs on the held-out split during training, and
its own small frozen options. Its function takes a `Context` (model, tokenizer, the shared `EvalOptions`,
and the split's features, or the path the user named) and the options, and returns `(metrics, figures)`:
flat metrics, and what the report's plots need. It mutates nothing.

    reads="features"   the split's images are embedded once (eval/features.py) and shared by these tasks
    reads="path"       the task reads --data itself (scored text pairs; images to fine-tune on)

Options are set by dotted overrides, `knn.k=5 cxc.positive_score=4 finetune.recipe.lr=0.01`, or by a value
every selected task with that field takes (`configure(..., train_data=...)`: the CLI's --train-data).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal
from collections.abc import Callable

from openalign.config import ConfigError, leaf_keys, override
from openalign.eval import compositional as compositional_lib
from openalign.eval import multilingual as multilingual_lib
from openalign.eval import retrieval as retrieval_lib
from openalign.eval import zeroshot as zeroshot_lib
from openalign.eval.arithmetic import arithmetic
from openalign.eval.compositional import compositional
from openalign.eval.cxc import cxc
from openalign.eval.features import Context, embed_split
from openalign.eval.finetune import finetune, vtab
from openalign.eval.knn import KNN_GROUP, knn
from openalign.eval.linear_probe import linear_probe
from openalign.eval.multilingual import multilingual
from openalign.eval.options import (CompositionalOptions, CxcOptions, EvalOptions, FinetuneOptions, KnnOptions,
                                     MultilingualOptions, NoOptions, ProbeOptions, RetrievalOptions, VtabOptions,
                                     ZeroshotOptions)
from openalign.eval.retrieval import retrieval
from openalign.eval.text_similarity import sts, word_sim
from openalign.eval.zeroshot import zeroshot
from openalign.model.dual_encoder import DualEncoder

__all__ = ["HELD_OUT_TASKS", "TASKS", "Task", "clip_benchmark_metrics", "configure", "run_tasks"]


@dataclass(frozen=True)
class Task:
    name: str
    run: Callable[[Context, object], tuple[dict, dict]]
    options: type = NoOptions
    reads: Literal["features", "path"] = "features"
    held_out: bool = False  # needs nothing but the held-out split: training may run it (config eval.tasks)
    meta: tuple[str, ...] = ()  # the keys of each image's metadata it reads (EvalData.meta), kept when it runs
    # its result in CLIP_benchmark's JSON, where that has one: (CLIP_benchmark's task name, metrics -> its keys)
    clip_benchmark: tuple[str, Callable[[dict], dict]] | None = None

    @property
    def prefix(self) -> str:
        """Its metrics' prefix: retrieval's keys are bare, the others' are `zeroshot_top1`, `cxc_t2t_r1`, ..."""
        return "" if self.name == "retrieval" else self.name.replace("-", "_") + "_"


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("retrieval", retrieval, RetrievalOptions, held_out=True,
         clip_benchmark=("zeroshot_retrieval", retrieval_lib.clip_benchmark)),
    Task("zeroshot", zeroshot, ZeroshotOptions, held_out=True,
         clip_benchmark=("zeroshot_classification", zeroshot_lib.clip_benchmark)),
    Task("knn", knn, KnnOptions, held_out=True, meta=(KNN_GROUP,)),
    Task("linear-probe", linear_probe, ProbeOptions),
    Task("cxc", cxc, CxcOptions),
    Task("multilingual", multilingual, MultilingualOptions, held_out=True, meta=(multilingual_lib.META,)),
    Task("arithmetic", arithmetic, held_out=True),
    Task("compositional", compositional, CompositionalOptions, held_out=True, meta=(compositional_lib.META,)),
    Task("word-sim", word_sim, reads="path"),
    Task("sts", sts, reads="path"),
    Task("finetune", finetune, FinetuneOptions, reads="path"),
    Task("vtab", vtab, VtabOptions, reads="path"),
)}
HELD_OUT_TASKS = tuple(name for name, task in TASKS.items() if task.held_out)


def clip_benchmark_metrics(metrics: dict, names: list[str]) -> dict[str, dict]:
    """{CLIP_benchmark task name: its metrics} of the tasks that ran (`names`, or the default pair) and have a form
    in CLIP_benchmark's result JSON; a task named that has none is refused in one sentence."""
    tasks = [_task(name) for name in names]
    without = [t.name for t in tasks if t.clip_benchmark is None]
    if without:
        raise ConfigError(f"CLIP_benchmark's result format holds zero-shot classification and retrieval; --task "
                          f"{', '.join(without)} has no place in it: write those with --format openalign")
    results = {}
    for task in tasks or [t for t in TASKS.values() if t.clip_benchmark]:
        name, convert = task.clip_benchmark
        try:
            results[name] = convert(metrics)
        except KeyError:  # not run (a default task the data had no use for)
            continue
    return results


def _task(name: str) -> Task:
    found = TASKS.get(name) or TASKS.get(name.replace("_", "-"))
    if found is None:
        raise ConfigError(f"unknown eval task {name!r}; choose from {', '.join(TASKS)}")
    return found


def configure(names: list[str], overrides: list[str] = (), **shared) -> dict[str, object]:
    """Each named task's options: its defaults, then every `shared` value whose name is one of its fields
    (a value that is None is not given), then the dotted overrides `task.key=value` aimed at it. A given value
    that no selected task takes is refused in one sentence (it would be ignored without a word)."""
    selected = [_task(name) for name in names]
    for key, value in shared.items():
        takers = [t.name for t in TASKS.values() if key in {f.name for f in dataclasses.fields(t.options)}]
        if value is not None and takers and not any(t.name in takers for t in selected):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} is an option of --task {' / '.join(takers)}, which is not selected "
                              f"(--task {' '.join(t.name for t in selected)}); add that task or drop {flag}")
    options = {}
    for name in names:
        task = _task(name)
        fields = {f.name for f in dataclasses.fields(task.options)}
        options[task.name] = task.options(**{k: v for k, v in shared.items() if k in fields and v is not None})
    for item in overrides:
        head, dot, rest = item.partition(".")
        task = _task(head) if dot else None
        if task is None or task.name not in options:
            raise ConfigError(f"eval override {item!r} names no selected task; write TASK.key=value for one of "
                              f"{', '.join(options) or 'the --task tasks'}")
        keys = leaf_keys(task.options)
        options[task.name] = override(options[task.name], [rest], help_hint=f"{task.name}'s options are "
                                      + (", ".join(keys) if keys else "none"))
    return options


def run_tasks(model: DualEncoder, tokenizer, data: str | list[str], names: list[str], common: EvalOptions,
              options: dict[str, object] | None = None, progress: bool = True) -> tuple[dict, dict]:
    """(flat metrics, figures) of the tasks `names` (none: retrieval and zero-shot, or zero-shot alone for a
    set without captions). The split's images are embedded once for every task that reads features."""
    tasks = [_task(n) for n in names]
    options = options or configure([t.name for t in tasks])
    path = data if isinstance(data, str) else ""
    metrics, figures = {}, {}

    def collect(task: Task, ctx: Context) -> None:
        found, drawn = task.run(ctx, options.get(task.name, task.options()))
        metrics.update({task.prefix + k: v for k, v in found.items()})
        figures.update(drawn)

    for task in (t for t in tasks if t.reads == "path"):
        if not path:
            raise ConfigError(f"--task {task.name} reads its own --data file or directory")
        collect(task, Context(model, tokenizer, common, path=path))
    if tasks and all(t.reads == "path" for t in tasks):
        return metrics, figures
    patches = any(getattr(options.get(t.name), "rerank", 0) for t in tasks)  # late interaction needs them
    meta = tuple(sorted({key for t in tasks for key in t.meta}))
    split = embed_split(model, data, common, progress, patches, meta)
    if not tasks:
        tasks = [TASKS["retrieval"], TASKS["zeroshot"]] if split.captions else [TASKS["zeroshot"]]
    metrics["n_skipped"] = split.skipped
    for task in (t for t in tasks if t.reads == "features"):
        collect(task, Context(model, tokenizer, common, split, path))
    return metrics, figures
