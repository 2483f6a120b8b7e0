import dataclasses

import pytest

import openalign.loss  # noqa: F401  (registers the loss kinds, whose rules config.check asks)
from openalign import config as config_lib
from openalign import presets
from openalign.config import Config, ConfigError


def test_override_sets_nested_typed_values():
    cfg = config_lib.override(Config(), ["optim.lr=5e-4", "model.vision.image_size=64", "train.steps=1e3",
                                         "model.channels_last=false", "optim.betas=0.8,0.9"])
    assert cfg.optim.lr == 5e-4 and cfg.model.vision.image_size == 64 and cfg.train.steps == 1000
    assert cfg.model.channels_last is False and cfg.optim.betas == (0.8, 0.9)


def test_unknown_key_fails_with_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean optim.lr"):
        config_lib.override(Config(), ["optim.lrr=1"])


def test_bad_value_and_bad_form_fail_clearly():
    with pytest.raises(ConfigError, match="not a valid int"):
        config_lib.override(Config(), ["train.steps=many"])
    with pytest.raises(ConfigError, match="key=value"):
        config_lib.override(Config(), ["train.steps"])


def test_config_is_frozen_and_round_trips_through_json(tmp_path):
    cfg = presets.get("demo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3
    config_lib.save(cfg, tmp_path / "c.json")
    assert config_lib.load(tmp_path / "c.json") == cfg


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match="did you mean align-b7-base"):
        presets.get("align-b7-bas")


def test_kinds_are_checked_once_with_every_rule_across_fields_and_processes():
    from openalign.config import check, override

    cfg = presets.get("tiny")
    with pytest.raises(ConfigError, match="loss.kind=hinge must be softmax, sigmoid or filip"):  # the registered kinds
        check(override(cfg, ["loss.kind=hinge"]))
    bad = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, implementation="fast"))
    with pytest.raises(ConfigError, match="loss.implementation=fast must be auto, naive or chunked"):
        check(bad)
    check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0"]))  # one process: fine
    check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0"]), world=2)  # and under torchrun (a ring)
    check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0", "loss.exchange=gather"]), world=2)
    with pytest.raises(ConfigError, match="loss.exchange=ring chooses how the sigmoid loss's texts reach every rank, "
                                          "which loss.kind=softmax does not use: set loss.exchange=auto"):
        check(override(cfg, ["loss.exchange=ring"]))  # the softmax gathers: the option would be ignored
    check(override(cfg, ["loss.negatives_fraction=0.5"]), world=1)
    with pytest.raises(ConfigError, match="2 config values") as err:  # the kind's rules join the others
        check(override(cfg, ["loss.negatives_fraction=0.5", "train.fsdp=true", "train.shard_optimizer=true"]), world=2)
    assert "already shards" in str(err.value) and "(the Table 8 ablation) runs in one process" in str(err.value)
    # options the sigmoid loss would ignore without a word (before: silently ignored)
    with pytest.raises(ConfigError, match="smooths the softmax's targets, which loss.kind=sigmoid does not use: set "
                                          "loss.label_smoothing=0.0"):
        check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0.1"]))
    with pytest.raises(ConfigError, match="drops in-batch negatives .* which loss.kind=sigmoid does not use"):
        check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0", "loss.negatives_fraction=0.5"]))
    with pytest.raises(ConfigError, match="drops in-batch negatives .* which loss.kind=filip does not use"):
        check(override(cfg, ["loss.kind=filip", "loss.negatives_fraction=0.5"]))
    with pytest.raises(ConfigError, match="loss.kind=filip does not run with train.micro_batch"):
        check(override(cfg, ["loss.kind=filip", "train.micro_batch=4"]))
    with pytest.raises(ConfigError, match="train.fsdp=true shards over torchrun processes"):
        check(override(cfg, ["train.fsdp=true"]), world=1)
    check(override(cfg, ["loss.direction=text_to_image"]), world=2)  # one term is exact when gathered too
    with pytest.raises(ConfigError, match="keeps one of the softmax's two terms, which loss.kind=sigmoid does not use"):
        check(override(cfg, ["loss.kind=sigmoid", "loss.direction=image_to_text", "loss.label_smoothing=0"]))
    with pytest.raises(ConfigError, match="loss.direction=rows must be both, image_to_text or text_to_image"):
        check(override(cfg, ["loss.direction=rows"]))


def test_a_batch_of_one_image_on_batchnorm_is_refused_in_one_sentence():
    # Before: data.global_batch=1 on EfficientNet trained into a BatchNorm traceback.
    from openalign.config import check, override

    cfg = presets.get("tiny")
    with pytest.raises(ConfigError, match="data.global_batch=1 gives each forward pass one image"):
        check(override(cfg, ["data.global_batch=1"]))
    with pytest.raises(ConfigError, match="train.micro_batch=1 gives each forward pass one image"):
        check(override(cfg, ["data.global_batch=8", "train.micro_batch=1"]))
    check(override(cfg, ["data.global_batch=2"]))


def test_a_rule_belongs_to_the_field_of_its_class_not_to_every_field_of_that_name():
    # Before: config.RULES was keyed by bare names, so any options class's `steps`, `lr`, `batch_size` or
    # `hidden_size` got TrainConfig's, OptimConfig's, DataConfig's or the towers' rule.
    @dataclasses.dataclass(frozen=True)
    class Elsewhere:
        steps: int = -1  # e.g. "steps back", where a negative is meaningful
        lr: float = -1.0
        batch_size: int = 0
        hidden_size: int = -3

    assert config_lib.violations(Elsewhere()) == []
    cfg = config_lib.override(Config(), ["train.steps=-1", "optim.lr=-1", "data.global_batch=0",
                                         "model.text.hidden_size=-3"])
    problems = " ".join(config_lib.violations(cfg))
    for phrase in ("train.steps=-1 must be", "optim.lr=-1.0 must be", "data.global_batch=0 must be",
                   "model.text.hidden_size=-3 must be"):
        assert phrase in problems
    from openalign.eval.options import FinetuneConfig

    # its own rules, its own keys, checked when it is made (config.Options)
    with pytest.raises(ConfigError, match=r"^2 values are invalid: steps=0 must be a positive integer; momentum=1.5 "
                                          r"must be in \[0, 1\)$"):
        config_lib.override(FinetuneConfig(), ["steps=0", "momentum=1.5"])


def test_a_commands_options_are_checked_by_their_fields_rules_and_named_as_flags():
    from openalign.data.engine import Engine
    from openalign.index.build import IndexOptions

    with pytest.raises(ConfigError, match=r"2 values are invalid: --engine=x must be local or spark; --retries=-1 "
                                          r"must be 0 or more"):
        Engine(name="x", retries=-1)
    with pytest.raises(ConfigError, match=r"--train-per-cell=12 must be at least 39"):
        config_lib.check(IndexOptions(train_per_cell=12), spell=config_lib.as_flags())
