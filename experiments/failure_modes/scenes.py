"""Models trained on the shapes corpus's scenes of several shapes, and their held-out scenes (relations and
several-objects read them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from openalign import config as config_lib
from openalign import presets
from openalign.corpora import corpus_dir
from openalign.data.images import load_rgb
from openalign.data.tars import image_bytes, list_shards, read_samples, sample_meta
from experiments.failure_modes.options import FailureOptions
from experiments.lab.runner import run_one


def scene_model(options: FailureOptions, scene: str, loss: str, seed: int, out: Path) -> Path:
    """A model trained on the shapes corpus's `scene` scenes (resumable: lab/runner.py's run_one)."""
    cfg = config_lib.override(presets.get(options.scene_preset), [
        "data.corpus=shapes", f"data.corpus_options=scene={scene},per_combo={options.scene_per_combo}",
        f"loss.kind={loss}", *options.scene_overrides])
    run = out / f"{scene}-{loss}" / f"seed{seed}"
    run_one(dataclasses.replace(cfg, seed=seed), run)
    return run / "model"


def held_out_scenes(model, scene: str, per_combo: int) -> list[dict]:
    """The held-out scenes of the shapes corpus's `scene` build that `model` trained on: pixels and meta."""
    root = Path(model.cfg.data.data_dir) / corpus_dir("shapes", (f"scene={scene}", f"per_combo={per_combo}"))
    return [{"pixels": model.preprocess(load_rgb(image_bytes(s))), "meta": sample_meta(s)}
            for s in read_samples(list_shards(str(root / "eval")))]
