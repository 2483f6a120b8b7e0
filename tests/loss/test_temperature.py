"""How the temperature is learned (loss.temperature.parameterization): raw T (the paper's) or log(1/T) (CLIP's and
SigLIP's), SigLIP's start, CLIP's cap, what a saved model holds for transformers, and models and runs from before
the option existed."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AlignModel, VisionTextDualEncoderModel

from conftest import read_jsonl
from openalign import cli, presets
from openalign import loss as loss_lib
from openalign.config import LossConfig, TemperatureConfig
from openalign.model.dual_encoder import DualEncoder
from openalign.model.hub import load_pretrained, save_pretrained
from openalign.tokenizer import train_tokenizer


def loss_cfg(kind="softmax", **temperature) -> LossConfig:
    return LossConfig(kind=kind, label_smoothing=0.0 if kind == "sigmoid" else 0.1,
                      temperature=TemperatureConfig(**temperature))


def test_the_log_parameter_gives_the_raw_loss_and_the_chain_rule_gradient():
    g = torch.Generator().manual_seed(0)
    img, txt = (F.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1) for _ in range(2))
    t = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    p = torch.tensor(math.log(1 / 0.07), dtype=torch.float64, requires_grad=True)
    raw = loss_lib.softmax_loss(img, txt, loss_lib.temperature_of(t, "raw", TemperatureConfig()))
    log = loss_lib.softmax_loss(img, txt, loss_lib.temperature_of(p, "log", TemperatureConfig()))
    raw.backward()
    log.backward()
    assert log.item() == pytest.approx(raw.item(), rel=1e-12)
    assert p.grad.item() == pytest.approx(-0.07 * t.grad.item(), rel=1e-10)  # dT/dp = -T


def test_the_scale_is_capped_at_max_scale_and_floored_at_min_where_the_gradient_stops():
    cap = TemperatureConfig(max_scale=100.0)
    p = torch.tensor(math.log(250.0), requires_grad=True)  # CLIP's logit_scale past its cap of log 100
    t = loss_lib.temperature_of(p, "log", cap)
    assert t.item() == pytest.approx(0.01)
    t.backward()
    assert p.grad.item() == 0.0
    raw = torch.tensor(1e-5, requires_grad=True)
    assert loss_lib.temperature_of(raw, "raw", TemperatureConfig()).item() == pytest.approx(1e-3)  # min
    assert loss_lib.temperature_of(raw, "raw", cap).item() == pytest.approx(1e-2)  # the larger floor wins


def test_siglip_starts_with_log_scale_log_10_and_bias_minus_10_and_learns_the_log():
    model = DualEncoder(presets.get("tiny").model, loss_cfg("sigmoid"))
    learned = dict(model.named_parameters())
    assert model.learned_as == "log"
    assert learned["logit_scale"].item() == pytest.approx(math.log(10.0)) and learned["logit_scale"].requires_grad
    assert model.logit_bias.item() == -10.0 and model.temperature.item() == pytest.approx(0.1)
    assert not model.align.temperature.requires_grad  # where T is saved for transformers, not where it is learned
    assert set(model.learned_scalars()) == {"temperature", "bias"}
    assert model.learned_scalars()["temperature"] is learned["logit_scale"]
    paper = DualEncoder(presets.get("tiny").model, loss_cfg())
    assert paper.learned_as == "raw" and paper.temperature.item() == 1.0
    assert paper.learned_scalars()["temperature"] is paper.align.temperature
    clip = DualEncoder(presets.get("tiny").model, loss_cfg(parameterization="log", init=0.07, max_scale=100))
    assert clip.logit_scale.item() == pytest.approx(math.log(1 / 0.07), rel=1e-6)
    fixed = DualEncoder(presets.get("tiny").model, loss_cfg("sigmoid", fixed=0.05))
    assert fixed.temperature.item() == pytest.approx(0.05) and "temperature" not in fixed.learned_scalars()


@pytest.mark.parametrize("preset", ["tiny", "tiny-vit"])
def test_a_saved_model_holds_t_where_transformers_reads_it_and_loads_exactly(tmp_path, preset):
    cfg = presets.get(preset)
    cfg = dataclasses.replace(cfg, loss=loss_cfg("sigmoid", max_scale=100.0))
    tokenizer = train_tokenizer(["a red circle", "a blue square"] * 8, 200, 16)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, text=dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))))
    model = DualEncoder(cfg.model, cfg.loss)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(23.0))  # as if learned
        model.logit_bias.fill_(-7.5)
    save_pretrained(model, tokenizer, tmp_path / "m", cfg)
    if preset == "tiny":
        assert AlignModel.from_pretrained(tmp_path / "m").temperature.item() == pytest.approx(1 / 23.0, rel=1e-6)
    else:
        assert VisionTextDualEncoderModel.from_pretrained(tmp_path / "m").logit_scale.item() == pytest.approx(
            math.log(23.0), rel=1e-6)
    loaded, _, loaded_cfg = load_pretrained(tmp_path / "m")
    assert loaded.learned_as == "log" and loaded_cfg.loss.temperature.parameterization == "auto"
    assert loaded.logit_scale.item() == model.logit_scale.item() and loaded.logit_bias.item() == -7.5
    assert loaded.temperature_and_bias() == pytest.approx((1 / 23.0, -7.5), rel=1e-6)


def test_a_raw_run_resumes_raw_and_a_new_sigmoid_run_trains_the_log(shapes, tmp_path):
    def argv(out, *overrides):
        return ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(out), "--quiet",
                "train.log_every=1", "train.eval_every=0", "train.checkpoint_every=2", "loss.kind=sigmoid",
                "loss.label_smoothing=0", "train.steps=2", *overrides]

    run = tmp_path / "run"
    assert cli.main(argv(run, "loss.temperature.parameterization=raw")) == 0
    saved = json.loads((run / "config.json").read_text())
    saved["train"]["steps"] = 4
    (run / "config.json").write_text(json.dumps(saved))
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet"]) == 0
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(math.isfinite(r["loss"]) for r in rows)
    state = torch.load(run / "checkpoint.pt", weights_only=False)["model"]
    assert "logit_scale" not in state and "align.temperature" in state
    fresh = tmp_path / "fresh"
    assert cli.main(argv(fresh)) == 0
    assert "logit_scale" in torch.load(fresh / "checkpoint.pt", weights_only=False)["model"]
