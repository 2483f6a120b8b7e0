"""Evaluation as one call: `openalign.evaluate(model, data, ...)` is what `openalign eval` runs.

    result = openalign.evaluate("runs/demo/model", "data/emoji/eval")           # retrieval and zero-shot
    result.metrics["i2t_r1"], result.metrics["zeroshot_top1"]
    openalign.evaluate(model, "imagenet/val", protocol="imagenet-probe", settings={"train_data": "imagenet/train"})
    result.write("metrics.json")                                               # + .md table and .png plot

The options resolve in one order, the command's: a protocol's task, resolutions and recipe (eval/protocols.py),
then the settings every selected task shares (--train-data, -k, ...; a shared value wins over the protocol's),
then the recipe items (--ft) and dotted `task.key=value` overrides. The crop and resize default to the model's
own (its image size, its resize-to-crop ratio); one given alone keeps that ratio.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping, Sequence

from openalign.config import ConfigError, Config
from openalign.eval.options import TASK_OPTIONS, EvalOptions

__all__ = ["EvalResult", "evaluate", "resolutions"]


@dataclass(frozen=True)
class EvalResult:
    """What an evaluation measured; `openalign eval` prints `lines()` and writes `write(out)`."""

    metrics: dict  # {metric: value}: each task's, prefixed by its name (`zeroshot_top1`; retrieval's bare, `i2t_r1`),
    # with their chance levels (`chance_*`), the images skipped (`n_skipped`) and, under a protocol, `protocol`
    tasks: tuple[str, ...]  # the tasks asked for (empty: the defaults, retrieval and zero-shot)
    crop: int  # the center crop the images were evaluated at
    resize: int  # the side they were resized to first
    protocol: str = ""  # the paper's transfer protocol that set the task and its numbers, if any
    paper: dict = field(default_factory=dict)  # {metric: the paper's cells that correspond to it} (eval/paper.py)
    figures: dict = field(default_factory=dict)  # what the report's plots draw
    model_weights: str = ""  # the model's weights fingerprint (a model given as a directory), which
    # `search --min-score` checks a calibrated threshold against

    def lines(self) -> list[str]:
        """The terminal's summary: every metric beside its chance level, then the paper's figures beside ours."""
        from openalign.eval import paper
        from openalign.eval.report import metric_lines

        return metric_lines(self.metrics) + paper.lines(self.paper, self.metrics)

    def write(self, out: str | Path) -> list[Path]:
        """The metrics JSON at `out`, its Markdown table and plot beside it; returns the files written."""
        from openalign.eval.report import write_report

        weights = {"model_weights": self.model_weights} if self.model_weights else {}
        return write_report(self.metrics | weights, Path(out), self.figures, self.paper)

    def clip_benchmark(self) -> dict[str, dict]:
        """{CLIP_benchmark task: its metrics}: the results in CLIP_benchmark's result-file form."""
        from openalign.eval.tasks import clip_benchmark_metrics

        return clip_benchmark_metrics(self.metrics, list(self.tasks))


def resolutions(cfg: Config, crop: int = 0, resize: int = 0) -> tuple[int, int]:
    """(crop, resize) for a model: the given ones, else the model's image size and its resize-to-crop ratio (a
    resize given alone sets the crop by that ratio). A crop larger than the resize is refused."""
    v = cfg.model.vision
    crop = crop or (round(resize * v.image_size / v.resize_size) if resize else v.image_size)
    resize = resize or round(crop * v.resize_size / v.image_size)
    if crop > resize:
        raise ConfigError(f"--crop {crop} is larger than --resize {resize}; the crop is taken from the resized image")
    return crop, resize


def task_settings() -> set[str]:
    """The names of every task's options: the values `settings` may give (the command's shared flags)."""
    return {f.name for options in TASK_OPTIONS.values() for f in dataclasses.fields(options)}


def evaluate(model, data: str | list[str], tasks: Sequence[str] = (), *, protocol: str = "",
             options: EvalOptions = EvalOptions(), settings: Mapping[str, object] | None = None,
             recipe: Sequence[str] = (), overrides: Sequence[str] = (), progress: bool = True) -> EvalResult:
    """Evaluate `model` (a model directory, or an `openalign.Model` from `openalign.load`) on `data` (shards, a
    Karpathy JSON, a caption or label table, class folders, a Multi30k list, or a task's own file).

    tasks: names from eval/tasks.py (none: retrieval and zero-shot, or zero-shot for a set without captions).
    protocol: one of the paper's transfer protocols (imagenet-probe, imagenet-finetune, fine-grained, vtab).
    options: what every task shares (EvalOptions; crop and resize 0: the model's).
    settings: {option: value} for every selected task that has it, e.g. {"train_data": DIR, "k": 5} (templates: a
    shipped set's name, a file, or the prompts themselves).
    recipe: the fine-tuning recipe's `key=value` items (finetune, vtab). overrides: `task.key=value` items."""
    from openalign import host
    from openalign.eval import paper
    from openalign.eval.datasets import load_templates
    from openalign.outputs import files_fingerprint
    from openalign.eval.finetune import parse_options
    from openalign.eval.tasks import configure, run_tasks

    net, tokenizer, cfg, directory = _loaded(model)
    if tokenizer is None:
        raise ConfigError(f"{directory or 'the model'} has no tokenizer (tokenizer.json); save the model with its "
                          "tokenizer")
    if options.cache and not directory:
        raise ConfigError("an embedding cache is keyed by the model's files: give the model as its directory")
    host.reuse_freed_memory()
    settings = {k: v for k, v in (settings or {}).items() if v is not None}
    templates = settings.get("templates")
    if isinstance(templates, str):  # a shipped set's name or a file of prompts
        settings["templates"] = load_templates(templates)
    unknown = sorted(set(settings) - task_settings())
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: no task has such an option; the tasks' options are "
                          f"{', '.join(sorted(task_settings()))}")
    names, overrides = list(tasks), list(overrides)
    recipe_options = parse_options(list(recipe)) if recipe else None
    crop, resize = options.crop, options.resize
    if protocol:
        from openalign.eval import protocols

        resolved = protocols.resolve(protocol, cfg.model.vision.image_size, crop, resize)
        task = resolved.protocol.task
        if names and names != [task]:
            raise ConfigError(f"--protocol {protocol} runs --task {task}; drop --task {' '.join(names)} (or run those "
                              "tasks without --protocol)")
        names, crop, resize = [task], resolved.crop, resolved.resize
        # the protocol's numbers first, then the user's: the recipe and task.key=value override them, and a shared
        # setting (--runs) wins over the protocol's own
        mine = [o for o in protocols.options(resolved) if o.partition("=")[0].split(".", 1)[1] not in settings]
        overrides = mine + [f"{task}.recipe.{item}" for item in recipe] + overrides
        recipe_options = None
        print(f"protocol {protocol}: {resolved.protocol.recipe}", file=sys.stderr)
    crop, resize = resolutions(cfg, crop, resize)
    common = dataclasses.replace(options, max_length=cfg.model.text.max_length, crop=crop, resize=resize,
                                 model_id=files_fingerprint(str(directory)) if options.cache else "")
    configured = configure(names or ["retrieval", "zeroshot"], overrides, **settings | {"recipe": recipe_options})
    metrics, figures = run_tasks(net, tokenizer, data, names, common, configured, progress=progress)
    if protocol:
        metrics["protocol"] = protocol
    weights = ""
    if directory:
        from openalign.model.hub import weights_fingerprint

        weights = weights_fingerprint(directory)
    beside = paper.beside(metrics, data, protocol) if isinstance(data, str) else {}
    return EvalResult(metrics=metrics, tasks=tuple(names), crop=crop, resize=resize, protocol=protocol, paper=beside,
                      figures=figures, model_weights=weights)


def _loaded(model) -> tuple:
    """(model, tokenizer, config, its directory or None) of a directory or an `openalign.Model`."""
    if isinstance(model, (str, Path)):
        from openalign.model.hub import load_pretrained

        return (*load_pretrained(Path(model)), Path(model))
    if all(hasattr(model, name) for name in ("model", "tokenizer", "cfg")):
        return model.model, model.tokenizer, model.cfg, None
    raise ConfigError(f"evaluate takes a model directory or an openalign.Model (openalign.load), not a "
                      f"{type(model).__name__}")
