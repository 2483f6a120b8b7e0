"""`openalign.evaluate`: the same numbers as `openalign eval` on the same model and data."""

import json

import pytest

import openalign
from conftest import save_tiny_model, write_shapes
from openalign import cli
from openalign.config import ConfigError
from openalign.eval.options import EvalOptions

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")
TIMES = ("ms_per_query", "seconds")  # measured, not computed: differ between two runs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model",
                           [f"a {c} {s}" for c in COLOURS for s in SHAPES])


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    write_shapes(root / "train", 36, 12, seed=0)
    write_shapes(root / "eval", 24, 12, seed=1, corrupt=1)
    return root


def command(model_dir, out, *args) -> dict:
    assert cli.main(["eval", str(model_dir), "--out", str(out), *args]) == 0
    return json.loads(out.read_text())


def measured(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not any(t in k for t in TIMES) and k != "paper"}


def test_evaluate_gives_the_commands_numbers(model_dir, shapes, tmp_path):
    written = command(model_dir, tmp_path / "m.json", "--data", str(shapes / "eval"), "--resize", "40")
    result = openalign.evaluate(model_dir, str(shapes / "eval"), options=EvalOptions(resize=40), progress=False)
    assert isinstance(result, openalign.EvalResult)
    assert measured(result.metrics) == {k: v for k, v in measured(written).items() if k != "model_weights"}
    assert result.model_weights == written["model_weights"]
    # --resize alone keeps the model's resize-to-crop ratio (tiny: 36 -> 32)
    assert (result.crop, result.resize) == (round(40 * 32 / 36), 40)
    assert {"i2t_r1", "t2i_r1", "zeroshot_top1"} <= set(result.metrics) and result.metrics["n_skipped"] == 1
    # written by the result itself: the same file the command writes
    files = result.write(tmp_path / "r.json")
    assert [f.name for f in files][:2] == ["r.json", "r.md"]
    again = json.loads((tmp_path / "r.json").read_text())
    assert measured(again) == measured(written)


def test_a_protocol_a_shared_setting_and_overrides_resolve_as_the_command_does(model_dir, shapes, tmp_path):
    args = ["--data", str(shapes / "eval"), "--protocol", "imagenet-probe", "--train-data", str(shapes / "train"),
            "linear-probe.sgd.epochs=2"]
    written = command(model_dir, tmp_path / "m.json", *args)
    result = openalign.evaluate(str(model_dir), str(shapes / "eval"), protocol="imagenet-probe",
                                settings={"train_data": str(shapes / "train")}, overrides=["linear-probe.sgd.epochs=2"],
                                progress=False)
    assert {k: v for k, v in measured(written).items() if k != "model_weights"} == measured(result.metrics)
    assert result.tasks == ("linear-probe",) and result.metrics["linear_probe_epochs"] == 2
    assert result.paper == written["paper"]


def test_a_loaded_model_evaluates_as_its_directory(model_dir, shapes):
    by_dir = openalign.evaluate(model_dir, str(shapes / "eval"), ["zeroshot"], progress=False)
    loaded = openalign.evaluate(openalign.load(model_dir, device="cpu"), str(shapes / "eval"), ["zeroshot"],
                                progress=False)
    assert measured(loaded.metrics) == measured(by_dir.metrics) and loaded.model_weights == ""


def test_bad_arguments_are_one_sentence(model_dir, shapes):
    data = str(shapes / "eval")
    with pytest.raises(ConfigError, match="no task has such an option"):
        openalign.evaluate(model_dir, data, settings={"neighbours": 5})
    with pytest.raises(ConfigError, match="runs --task linear-probe"):
        openalign.evaluate(model_dir, data, ["zeroshot"], protocol="imagenet-probe")
    with pytest.raises(ConfigError, match="model directory or an openalign.Model"):
        openalign.evaluate(42, data)
    with pytest.raises(ConfigError, match="larger than --resize"):
        openalign.evaluate(model_dir, data, options=EvalOptions(crop=40, resize=36))
