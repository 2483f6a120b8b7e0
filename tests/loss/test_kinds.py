"""The loss kinds' registry: each kind a module with a registered `Loss`, the step asking the factory, config asking
the kind for its rules; a fourth kind registered from outside the package trains with nothing else touched."""

import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import openalign
from conftest import read_jsonl
from openalign import cli
from openalign import config as config_lib
from openalign import loss as loss_lib
from openalign.config import LossConfig

SRC = Path(openalign.__file__).parent


class Toy(loss_lib.Loss):
    """A fourth kind, as a user's module would write it: the image-to-text cross-entropy alone."""

    name = "toy"
    options = frozenset({"label_smoothing"})
    calls = 0

    def __call__(self, img, txt, scales, generator=None):
        Toy.calls += 1
        logits = img.embeds @ txt.embeds.T / self.temperature(scales)
        return F.cross_entropy(logits, torch.arange(len(logits)), label_smoothing=self.cfg.label_smoothing)


@pytest.fixture
def toy():
    loss_lib.register(Toy)  # the registry line
    Toy.calls = 0
    yield Toy
    config_lib.LOSS_KINDS.pop(Toy.name)


def test_each_kind_is_one_registered_module_and_the_factory_builds_it():
    assert list(config_lib.LOSS_KINDS) == ["softmax", "sigmoid", "filip"]
    for name, kind in config_lib.LOSS_KINDS.items():
        assert kind.__module__ == f"openalign.loss.{name}" and kind.name == name
        assert isinstance(loss_lib.create(LossConfig(kind=name), world=2), kind)
    assert loss_lib.kind_of(LossConfig(kind="sigmoid")).initial_scalars(LossConfig()) == {"temperature": 0.1,
                                                                                           "bias": -10.0}
    assert loss_lib.kind_of(LossConfig()).initial_scalars(LossConfig()) == {"temperature": 1.0}  # the paper's


def test_no_module_outside_the_registry_names_a_loss_kind():
    """The step, the collectives and the losses' shared base ask the kind (its `scalars`, `tokens`, `rules`) instead
    of comparing loss.kind with a name; config names only its default."""
    for path in ("train/step.py", "distributed.py", "loss/base.py", "config.py"):
        tree = ast.parse((SRC / path).read_text())
        named = [(node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and node.value in config_lib.LOSS_KINDS]
        if path == "config.py":  # the default's name, once
            assert named == [(named[0][0], "softmax")], named
        else:
            assert named == [], f"{path} names a loss kind: {named}"


def test_a_fourth_kind_registered_from_outside_trains_and_saves(shapes, tmp_path, toy):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(run), "--quiet",
            "train.steps=3", "train.log_every=1", "train.eval_every=0", "train.checkpoint_every=0", "loss.kind=toy"]
    assert cli.main(argv) == 0
    losses = [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert toy.calls == 3  # the step asked the factory for it, once a step
    # its rules are the base's: an option it does not read is refused
    assert cli.main([*argv[:-1], "--out", str(tmp_path / "other"), "loss.kind=toy", "loss.negatives_fraction=0.5"]) == 2


def test_an_unregistered_kind_is_one_sentence(shapes, tmp_path, capsys):
    argv = ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "run"), "--quiet",
            "loss.kind=toy"]
    assert cli.main(argv) == 2
    assert "loss.kind=toy must be softmax, sigmoid or filip" in capsys.readouterr().err
