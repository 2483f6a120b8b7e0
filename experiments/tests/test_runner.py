"""The lab's runner: one run trained once, resumed from its checkpoint, redone when its config or data changed, and a
study under torchrun (every rank trains each run, rank 0 reports)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openalign import presets
from tests.conftest import free_port, read_jsonl, shape_shards


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return shape_shards(tmp_path_factory.mktemp("shapes"))


ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]


def env() -> dict:
    return os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def test_an_interrupted_run_starts_again_or_resumes(shapes, tmp_path, monkeypatch):
    from openalign import config as config_lib
    from experiments.lab import runner

    cfg = config_lib.override(presets.get("tiny"), [f"data.train={shapes['train']}", f"data.eval={shapes['eval']}",
                                                  "train.steps=2", "train.checkpoint_every=0"])
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 99.0, "temperature": 9.0}\n')  # killed, no checkpoint
    row = runner.run_one(cfg, out)
    assert row["final_loss"] != 99.0 and len(read_jsonl(out / "metrics.jsonl")) == 3  # two steps and the eval
    (out / "result.json").unlink()
    (out / "checkpoint.pt").write_bytes(b"")  # now with a checkpoint: the run resumes from it
    import openalign.prepare as prepare

    def fake_train(c, resume=False, progress=True):
        raise RuntimeError(f"resume={resume}")

    monkeypatch.setattr(prepare, "train", fake_train)
    with pytest.raises(RuntimeError, match="resume=True"):
        runner.run_one(cfg, out)
    assert (out / "metrics.jsonl").is_file()  # kept for the resumed run


def test_a_finished_run_is_reused_only_for_the_same_config_and_data(shapes, tmp_path, monkeypatch):
    # Before: run_one returned an earlier result.json whatever the config it was now asked to run.
    from openalign import config as config_lib
    from experiments.lab import runner

    base = [f"data.train={shapes['train']}", f"data.eval={shapes['eval']}", "train.steps=2", "train.checkpoint_every=0"]
    cfg = config_lib.override(presets.get("tiny"), base)
    out = tmp_path / "run"
    first = runner.run_one(cfg, out)
    import openalign.prepare as prepare

    calls = []
    real = prepare.train
    monkeypatch.setattr(prepare, "train", lambda c, **k: calls.append(c) or real(c, **k))
    assert runner.run_one(cfg, out) == first and calls == []  # the same config: reused
    changed = runner.run_one(config_lib.override(cfg, ["seed=1"]), out)
    assert len(calls) == 1 and calls[0].seed == 1 and changed["final_loss"] != first["final_loss"]


def test_a_study_under_torchrun_trains_each_run_on_both_processes_and_reports_once(shapes, tmp_path):
    out = tmp_path / "study"
    argv = ["--out", str(out), "--preset", "tiny", "--data", str(shapes["train"]),
            "--eval-data", str(shapes["eval"]), "--only", "label smoothing", "--quiet", "train.steps=3",
            "train.eval_every=0", "train.checkpoint_every=0"]
    for launch in range(2):  # the second launch finds every run done and trains nothing
        done = subprocess.run(TORCHRUN + ["--master_port", str(free_port()), "-m", "experiments.ablation", *argv],
                              env=env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("2 variants x 1 seed(s)") == 1  # rank 0 alone reports
        results = json.loads((out / "results.json").read_text())
        assert list(results["variants"]) == ["baseline", "no_smoothing"]
        for name, row in results["variants"].items():
            run = out / "runs" / name / "seed0"
            assert len(torch.load(run / "checkpoint.pt", weights_only=False)["ranks"]) == 2  # both processes trained
            assert json.loads((run / "result.json").read_text()) == row["runs"][0]
        assert (out / "report.md").is_file() and (out / "study.png").stat().st_size > 0
        stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed0/checkpoint.pt")}
        if launch == 0:
            first, first_stamps = results["variants"], stamps
    assert results["variants"] == first and stamps == first_stamps
