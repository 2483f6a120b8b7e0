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
