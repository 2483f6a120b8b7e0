import dataclasses

import pytest

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


def test_kinds_are_literal_and_checked_once_with_every_rule_across_fields_and_processes():
    from openalign.config import check, override

    cfg = presets.get("tiny")
    with pytest.raises(ConfigError, match="loss.kind=hinge must be softmax, sigmoid or filip"):
        check(override(cfg, ["loss.kind=hinge"]))
    bad = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, implementation="fast"))
    with pytest.raises(ConfigError, match="loss.implementation=fast must be auto, naive or chunked"):
        check(bad)
    sigmoid = override(cfg, ["loss.kind=sigmoid", "loss.negatives_fraction=0.5", "train.fsdp=true",
                             "loss.label_smoothing=0"])
    check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0"]))  # one process: fine
    with pytest.raises(ConfigError, match="3 config values") as err:
        check(dataclasses.replace(sigmoid, train=dataclasses.replace(sigmoid.train, fsdp=False)), world=2)
    assert "sigmoid runs in one process" in str(err.value) and "negatives_fraction" in str(err.value)
    # options the sigmoid loss would ignore without a word (before: silently ignored)
    with pytest.raises(ConfigError, match="set loss.label_smoothing=0 with loss.kind=sigmoid"):
        check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0.1"]))
    with pytest.raises(ConfigError, match="is for the softmax loss; the sigmoid loss uses every pair"):
        check(override(cfg, ["loss.kind=sigmoid", "loss.label_smoothing=0", "loss.negatives_fraction=0.5"]))
    with pytest.raises(ConfigError, match="train.fsdp=true shards over torchrun processes"):
        check(override(cfg, ["train.fsdp=true"]), world=1)
    check(override(cfg, ["loss.direction=text_to_image"]), world=2)  # one term is exact when gathered too
    with pytest.raises(ConfigError, match="the sigmoid loss has no direction"):
        check(override(cfg, ["loss.kind=sigmoid", "loss.direction=image_to_text", "loss.label_smoothing=0"]))
    with pytest.raises(ConfigError, match="loss.direction=rows must be both, image_to_text or text_to_image"):
        check(override(cfg, ["loss.direction=rows"]))


def test_the_temperature_settings_live_in_one_place_and_old_keys_still_work(tmp_path):
    from openalign.config import load, override, to_dict

    cfg = override(presets.get("tiny"), ["model.temperature_init=0.5", "loss.fixed_temperature=0.01",
                                         "optim.temperature_lr_scale=10", "loss.temperature_min=0.002"])
    assert cfg.loss.temperature == config_lib.TemperatureConfig(init=0.5, fixed=0.01, min=0.002, lr_scale=10.0)
    old = to_dict(presets.get("tiny"))  # a config.json written before the move
    old["loss"].pop("temperature")
    old["model"]["temperature_init"] = 0.25
    old["optim"]["temperature_lr_scale"] = 3.0
    (tmp_path / "config.json").write_text(__import__("json").dumps(old))
    assert load(tmp_path / "config.json").loss.temperature.init == 0.25
    assert load(tmp_path / "config.json").loss.temperature.lr_scale == 3.0


def test_a_batch_of_one_image_on_batchnorm_is_refused_in_one_sentence():
    # Before: data.batch_size=1 on EfficientNet trained into a BatchNorm traceback.
    from openalign.config import check, override

    cfg = presets.get("tiny")
    with pytest.raises(ConfigError, match="data.batch_size=1 gives each forward pass one image"):
        check(override(cfg, ["data.batch_size=1"]))
    with pytest.raises(ConfigError, match="train.micro_batch=1 gives each forward pass one image"):
        check(override(cfg, ["data.batch_size=8", "train.micro_batch=1"]))
    check(override(cfg, ["data.batch_size=2"]))
