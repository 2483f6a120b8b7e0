"""Run a study's variants over seeds, resumably, and summarize them (mean ± std over seeds)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from tqdm import tqdm

from openalign import config as config_lib
from openalign import distributed
from openalign.config import Config, ConfigError
from openalign.eval.metrics import chance_key, is_chance
from openalign.outputs import files_fingerprint, write_json


@dataclass(frozen=True)
class Variant:
    name: str  # unique within the study, used as a directory name
    group: str  # variants compared with each other (one table and one panel each)
    overrides: tuple[str, ...] = ()  # dotted key=value over the study's base config
    label: str = ""  # what the report shows; the name when empty
    baseline: bool = False  # the reference of its group (the others are reported against it)
    paper: dict = field(default_factory=dict)  # the paper's numbers for this row, where it has them


@dataclass(frozen=True)
class Study:
    name: str  # the study's name: its report's title and its command (python -m experiments.NAME, - as _)
    variants: Callable[[Config], list[Variant]]  # the plan, from the study's base config
    intro: str  # the report's first paragraph: what is compared and why
    paper: str = ""  # where the paper's numbers shown next to ours come from (table, model, metric)
    paper_columns: tuple[str, ...] = ()  # keys of Variant.paper, one report column each
    extra_report: Callable[[dict, Path], list[str]] | None = None  # more Markdown (and plots) after the tables
    quick: tuple[str, ...] = ()  # overrides --quick adds for this study, after the common ones
    tasks: tuple[str, ...] = ()  # held-out tasks it adds to the base's eval.tasks (Tables 8-10 read ImageNet KNN: knn)
    # the headline, (result key, label), for Δ and plots; or a function of the base config giving it
    metric: tuple[str, str] | Callable[[Config], tuple[str, str]] = ("mean_recall", "mean recall")

    def headline(self, base: Config) -> tuple[str, str]:
        return self.metric(base) if callable(self.metric) else self.metric


def corpus_override(base: Config, **options) -> str:
    """A `data.corpus_options=` override setting `options` over the base config's own corpus options."""
    merged = dict(item.partition("=")[::2] for item in base.data.corpus_options)
    merged |= {k: "+".join(v) if isinstance(v, (tuple, list)) else str(v) for k, v in options.items()}
    return "data.corpus_options=" + ",".join(f"{k}={v}" for k, v in merged.items())


def _summary_keys(runs: list[dict]) -> list[str]:
    """Numeric metrics every run has (chance levels are reported apart)."""
    return [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and not is_chance(k) and all(isinstance(r.get(k), (int, float)) for r in runs)]


def run_one(cfg: Config, out: Path, layout: distributed.Dist = distributed.Dist()) -> dict:
    """Train one run (or read its earlier result); its final held-out metrics and temperature. A run that
    was interrupted resumes from its last checkpoint, or starts again when it has none. Under torchrun
    every rank trains its share and returns rank 0's row; rank 0 alone writes."""
    from openalign.prepare import train
    from openalign.train.trainer import CHECKPOINT

    result_file, key_file = out / "result.json", out / "run_key.json"
    cfg = dataclasses.replace(cfg, out=str(out))
    data = [p for p in (cfg.data.train, cfg.data.eval, cfg.data.images) if p and Path(p).exists()]
    key = {"config": config_lib.to_dict(cfg), "data": files_fingerprint(*data)}  # a built-in corpus: by its options

    def earlier() -> dict | None:
        try:
            same = json.loads(key_file.read_text()) == json.loads(json.dumps(key))
        except (OSError, ValueError):
            same = False
        if same and result_file.is_file():
            return json.loads(result_file.read_text())
        if out.exists() and (not same or not (out / CHECKPOINT).is_file()):
            shutil.rmtree(out)  # another config's or data's run, or a partial one without a checkpoint
        out.mkdir(parents=True, exist_ok=True)
        write_json(key_file, key)
        return None

    done = distributed.all_objects(earlier() if layout.main else None, layout)[0]  # rank 0 decides for all
    if done is not None:
        return done
    resume = (out / CHECKPOINT).is_file()
    start = time.perf_counter()
    result = train(cfg, resume=resume, progress=False)
    row = None
    if layout.main:
        row = result.metrics | {"temperature": result.last["temperature"], "final_loss": result.last["loss"],
                                "minutes": (time.perf_counter() - start) / 60}
        write_json(result_file, row)
    return distributed.all_objects(row, layout)[0]


def run_study(name: str, base: Config, variants: list[Variant], seeds: int, out: Path,
              progress: bool = True) -> dict:
    """Every variant for `seeds` seeds; returns {variant name: {"runs": [...], "mean": {...}, "std": {...}}}.
    Under torchrun each run is trained by all the processes and rank 0 writes results.json."""
    if seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, not {seeds}")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ConfigError(f"study {name}: variant names repeat")
    configs = {v.name: config_lib.override(base, list(v.overrides)) for v in variants}  # fail before any training
    layout = distributed.init(distributed.resolve_device(base.train.device, distributed.from_env().local_rank).type)
    if layout.main:
        out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    bar = tqdm(total=len(variants) * seeds, desc=f"study {name}", unit="run", disable=not (progress and layout.main))
    for variant in variants:
        runs = []
        for seed in range(seeds):
            bar.set_postfix_str(f"{variant.name} seed {seed}")
            cfg = dataclasses.replace(configs[variant.name], seed=base.seed + seed)
            runs.append(run_one(cfg, out / "runs" / variant.name / f"seed{seed}", layout))
            bar.update(1)
        keys = _summary_keys(runs)
        results[variant.name] = {
            "group": variant.group, "label": variant.label or variant.name, "baseline": variant.baseline,
            "overrides": list(variant.overrides), "paper": variant.paper, "runs": runs,
            "mean": {k: statistics.fmean(r[k] for r in runs) for k in keys},
            "std": {k: statistics.pstdev(r[k] for r in runs) for k in keys},
            "chance": {k: runs[0][c] for k in keys if (c := chance_key(k, runs[0]))},
        }
    bar.close()
    if layout.main:
        (out / "results.json").write_text(json.dumps({"study": name, "seeds": seeds, "base": config_lib.to_dict(base),
                                                      "variants": results}, indent=2) + "\n")
    return results
