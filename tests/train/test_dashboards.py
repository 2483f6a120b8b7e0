"""train.report_to: the metrics.jsonl rows on TensorBoard (read back by tensorboard's own EventAccumulator) and W&B
(offline unless configured), evaluations as one printed line, a missing package as one sentence."""

import importlib.machinery
import importlib.util
import sys
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import read_jsonl
from openalign import cli


def train_args(shapes, out, *overrides):
    return ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--eval-data", str(shapes["eval"]),
            "--out", str(out), "train.steps=4", "train.log_every=1", "train.eval_every=2",
            "train.checkpoint_every=0", *overrides]


def test_tensorboard_reads_back_the_losses_of_metrics_jsonl_and_the_plots(shapes, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(train_args(shapes, run, "train.report_to=tensorboard")) == 0
    rows = read_jsonl(run / "metrics.jsonl")
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert {e.step: e.value for e in events.Scalars("loss")} == pytest.approx(losses, rel=1e-6)
    assert [e.step for e in events.Scalars("temperature")] == [1, 2, 3, 4]
    evals = [r for r in rows if r.get("eval")]
    assert [e.step for e in events.Scalars("eval/mean_recall")] == [r["step"] for r in evals] == [2, 4]
    assert events.Scalars("eval/mean_recall")[-1].value == pytest.approx(evals[-1]["eval"]["mean_recall"], rel=1e-6)
    assert events.Tags()["images"] == ["training"]  # the plot openalign drew
    printed = capsys.readouterr().out
    assert "step 2 eval: mean_recall" in printed  # an evaluation during the run, as one short line


def fake_wandb(calls: list):
    """A stand-in for the wandb package that records what openalign asks of it."""
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    class Run:
        def log(self, values, step):
            calls.append(("log", values, step))

        def finish(self):
            calls.append(("finish",))

    module.init = lambda **kwargs: calls.append(("init", kwargs)) or Run()
    module.Image = lambda path: ("image", path)
    return module


def test_wandb_gets_the_same_rows_offline_unless_configured(shapes, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(calls))
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    run = tmp_path / "run"
    assert cli.main(train_args(shapes, run, "train.report_to=wandb", "--quiet")) == 0
    init = calls[0][1]
    assert init["mode"] == "offline" and init["dir"] == str(run) and init["config"]["train"]["steps"] == 4
    logged = {step: values for kind, *rest in calls if kind == "log" for values, step in [rest]
              if "loss" in values}
    assert {s: v["loss"] for s, v in logged.items()} == {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl")
                                                         if "loss" in r}
    assert any(kind == "log" and "eval/mean_recall" in rest[0] for kind, *rest in calls)
    assert any(kind == "log" and "training" in rest[0] for kind, *rest in calls) and calls[-1] == ("finish",)


def test_a_missing_dashboard_package_is_one_sentence_before_any_work(shapes, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert cli.main(train_args(shapes, tmp_path / "run", "train.report_to=tensorboard,wandb", "--quiet")) == 2
    err = capsys.readouterr().err
    assert "needs wandb, which is not installed: pip install 'openalign[dashboards]'" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert cli.main(train_args(shapes, tmp_path / "other", "train.report_to=mlflow", "--quiet")) == 2
    assert "train.report_to=mlflow must be tensorboard, wandb or both" in capsys.readouterr().err
