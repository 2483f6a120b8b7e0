"""OpenCLIP-native checkpoints (model/openclip.py) against what the real open_clip gives on the same files.

tests/fixtures/openclip/ holds two tiny CLIP models saved by open_clip 3.3's own `save_for_hf` (GELU as LAION's,
QuickGELU as OpenAI's) and, in NAME.expected.safetensors, open_clip's own preprocess pixels, `encode_image`, token
ids and `encode_text` on fixtures' images/ and TEXTS.json, from the directory reloaded with `local-dir:`
(tests/fixtures/openclip/make_fixture.py, with the command that made them)."""

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import openalign
from openalign import cli
from openalign.config import ConfigError
from openalign.data import sources, transforms
from openalign.model.encode import encode_images, encode_texts
from openalign.model.hub import load_pretrained

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openclip"
TEXTS = json.loads((FIXTURES / "TEXTS.json").read_text())


def cosines(a, b):
    return (F.normalize(a, dim=-1) * F.normalize(b, dim=-1)).sum(-1)


def pixels_of(cfg, **vision_changes):
    vision = cfg.model.vision.__class__(**{**cfg.model.vision.__dict__, **vision_changes})
    items = sources.items(str(FIXTURES / "images"), "", "all", {})
    return torch.stack([transforms.vision_transform(vision)(image)
                        for _, image in sources.decoded(items, alpha=vision.alpha)])


@pytest.mark.parametrize("name", ["laion", "openai"])
def test_a_native_openclip_checkpoint_embeds_as_open_clip_does(name):
    expected = load_file(FIXTURES / f"{name}.expected.safetensors")
    model, tokenizer, cfg = load_pretrained(FIXTURES / name)
    assert (cfg.model.family, cfg.model.vision.resize_mode, cfg.model.vision.resample) == ("clip", "shortest_edge",
                                                                                          "bicubic")
    assert model.hf.config.vision_config.hidden_act == ("quick_gelu" if name == "openai" else "gelu")
    pixels = pixels_of(cfg)
    # the same pixels as open_clip's torchvision preprocess, after the checkpoint's normalization
    from openalign.model.dual_encoder import tower_pixels

    assert torch.allclose(tower_pixels(cfg.model.vision, pixels), expected["pixel_values"], atol=1e-4)
    images = encode_images(model, pixels)
    assert cosines(images, expected["image_features"]).min() >= 0.9999
    texts = encode_texts(model, tokenizer, TEXTS, 2, cfg.model.text.max_length)
    assert cosines(texts, expected["text_features"]).min() >= 0.9999
    ids = tokenizer(TEXTS, padding="max_length", max_length=77)["input_ids"]
    assert torch.equal(torch.tensor(ids), expected["input_ids"])  # the directory's tokenizer, as open_clip's
    assert model.temperature.item() == pytest.approx(float(torch.exp(-expected["logit_scale"])), rel=1e-6)
    loaded = openalign.load(FIXTURES / name)  # the notebook API reads it too
    assert cosines(loaded.encode_texts(TEXTS), expected["text_features"]).min() >= 0.9999


def test_the_crop_is_torchvisions_and_it_is_what_makes_the_match():
    expected = load_file(FIXTURES / "laion.expected.safetensors")
    model, _, cfg = load_pretrained(FIXTURES / "laion")
    assert cfg.model.vision.crop_round == "nearest"
    floor = encode_images(model, pixels_of(cfg, crop_round="down"))  # transformers' center_crop rounds down
    # image 0 (50 x 37 -> 43 x 32) has an odd margin of 11: torchvision's corner is 6, transformers' 5
    assert cosines(floor, expected["image_features"])[0] < 0.9999


def test_openclip_checkpoints_run_through_the_commands(tmp_path, capsys):
    folder = tmp_path / "images"
    shutil.copytree(FIXTURES / "images", folder)
    for i, text in enumerate([*TEXTS, "a photo of a dog"]):
        (folder / f"{i}.txt").write_text(text)
    root = FIXTURES / "laion"
    assert cli.main(["eval", str(root), "--data", str(folder), "--task", "retrieval", "--out",
                     str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["n_images"] == 5
    assert cli.main(["embed", str(root), "--images", str(folder), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "idx"), "--text", "a red circle", "-k", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3


def copy_with(tmp_path, change=None, name="laion"):
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    if change:
        config = json.loads((root / "open_clip_config.json").read_text())
        change(config["model_cfg"])
        (root / "open_clip_config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize("change, said", [
    (lambda m: m["vision_cfg"].update(layers=[3, 4, 6, 3]), r"a ModifiedResNet image tower \(vision_cfg.layers="),
    (lambda m: m["vision_cfg"].update(timm_model_name="convnext_base"), r"vision_cfg.timm_model_name='convnext_base'"),
    (lambda m: m["text_cfg"].update(hf_model_name="xlm-roberta-base"), r"text_cfg.hf_model_name='xlm-roberta-base'"),
    (lambda m: m["vision_cfg"].update(ls_init_value=1e-5), r"vision_cfg.ls_init_value=1e-05"),
    (lambda m: m.update(init_logit_bias=-10), r"a logit bias"),
], ids=["resnet", "timm", "hf-text", "layer-scale", "sigmoid"])
def test_what_has_no_exact_clipmodel_form_is_refused_naming_it(tmp_path, change, said):
    root = copy_with(tmp_path, change)
    with pytest.raises(ConfigError, match=rf"is an OpenCLIP checkpoint with {said}.*openalign loads OpenCLIP's ViT CLIP"):
        load_pretrained(root)


def test_a_weight_left_unmapped_is_refused(tmp_path):
    root = copy_with(tmp_path)
    state = load_file(root / "open_clip_model.safetensors")
    state["visual.attn_pool.query"] = torch.zeros(4, 32)
    save_file(state, root / "open_clip_model.safetensors")
    with pytest.raises(ConfigError, match=r"weights openalign does not map \(visual.attn_pool.query\)"):
        load_pretrained(root)


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_pickled_weights_load_as_tensors_only(tmp_path):
    root = copy_with(tmp_path)
    state = load_file(root / "open_clip_model.safetensors")
    (root / "open_clip_model.safetensors").unlink()
    torch.save(state, root / "open_clip_pytorch_model.bin")  # the older release format
    expected = load_file(FIXTURES / "laion.expected.safetensors")
    model, tokenizer, cfg = load_pretrained(root)
    assert cosines(encode_texts(model, tokenizer, TEXTS, 2, 77), expected["text_features"]).min() >= 0.9999
    marker = tmp_path / "ran"
    (root / "open_clip_pytorch_model.bin").write_bytes(pickle.dumps({"w": Payload(marker)}))
    with pytest.raises(ConfigError, match="is not a plain state dict of tensors"):
        load_pretrained(root)
    assert not marker.exists()
