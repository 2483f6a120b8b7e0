"""The ViT image tower: a VisionTextDualEncoderModel directory that plain transformers reads the same way."""

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from openalign import presets
from openalign.config import ConfigError, check, override
from openalign.model.dual_encoder import DualEncoder, ViTDualEncoder
from openalign.model.hub import load_config, load_pretrained, save_pretrained
from openalign.tokenizer import train_tokenizer

PLAIN = """
import sys, torch
from transformers import AutoTokenizer, VisionTextDualEncoderModel
model = VisionTextDualEncoderModel.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
x = torch.load(sys.argv[2])
t = tok(["a red circle", "blue"], padding=True, return_tensors="pt")
with torch.no_grad():
    img = model.get_image_features(pixel_values=x["pixels"]).pooler_output
    txt = model.get_text_features(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).pooler_output
    logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], pixel_values=x["pixels"]).logits_per_image
torch.save({"img": img, "txt": txt, "logits": logits}, sys.argv[3])
"""


def vit_model(pool: str = "cls"):
    cfg = override(presets.get("tiny-vit"), [f"model.vision.pool={pool}"])
    torch.manual_seed(0)
    model = DualEncoder(cfg.model, cfg.loss).eval()
    with torch.no_grad():
        model.set_temperature(0.05)  # away from its init: the saved logit_scale must follow
    return cfg, model


def test_a_vit_model_round_trips_through_plain_transformers(tmp_path):
    cfg, model = vit_model()
    tok = train_tokenizer(["a red circle", "a blue square"] * 5, vocab_size=40)
    save_pretrained(model, tok, tmp_path / "model", cfg)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["model_type"] == "vision-text-dual-encoder"
    pixels = torch.rand(3, 3, 32, 32) * 2 - 1
    torch.save({"pixels": pixels}, tmp_path / "x.pt")
    subprocess.run([sys.executable, "-c", PLAIN, str(tmp_path / "model"), str(tmp_path / "x.pt"),
                    str(tmp_path / "y.pt")], check=True)
    plain = torch.load(tmp_path / "y.pt")
    t = tok(["a red circle", "blue"], padding=True, return_tensors="pt")
    with torch.no_grad():
        img = model.encode_image(pixels).embeds
        txt = model.encode_text(t["input_ids"], t["attention_mask"]).embeds
    torch.testing.assert_close(F.normalize(plain["img"], dim=-1), img, rtol=0, atol=1e-6)
    torch.testing.assert_close(F.normalize(plain["txt"], dim=-1), txt, rtol=0, atol=1e-6)
    torch.testing.assert_close(plain["logits"], img @ txt.T / 0.05, rtol=1e-5, atol=1e-5)  # 1/T as logit_scale
    loaded, _, loaded_cfg = load_pretrained(tmp_path / "model")
    assert loaded_cfg == cfg and isinstance(loaded, ViTDualEncoder) and loaded.temperature.item() == pytest.approx(0.05)
    with torch.no_grad():
        assert torch.equal(loaded.encode_image(pixels).embeds, img)


def test_a_foreign_vision_text_dual_encoder_directory_loads_with_its_config(tmp_path):
    cfg, model = vit_model()
    model.dual.save_pretrained(tmp_path)  # transformers' files only: no openalign.json, no extras
    foreign = load_config(tmp_path)
    v = foreign.model.vision
    assert (v.kind, v.hidden_size, v.num_layers, v.patch_size, v.image_size) == ("vit", 32, 1, 8, 32)
    assert foreign.loss.temperature.init == pytest.approx(0.07)  # exp(-logit_scale_init_value)
    loaded, tok, _ = load_pretrained(tmp_path)
    assert loaded.temperature.item() == pytest.approx(0.07)  # the saved logit_scale (its init: never synced here)
    pixels = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(loaded.encode_image(pixels).embeds, model.encode_image(pixels).embeds)


def test_mean_pooling_and_another_resolution():
    _, model = vit_model("mean")
    pixels = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        out = model.dual.vision_model(pixel_values=pixels)
        expected = model.dual.vision_model.post_layernorm(out.last_hidden_state[:, 1:].mean(dim=1))
        torch.testing.assert_close(model.encode_image(pixels).features, expected)
        assert not torch.allclose(expected, out.pooler_output)  # the case tells mean from CLS
        # 48 px: a 6x6 grid of 8 px patches, the 4x4 position embeddings interpolated
        bigger = model.encode_image(torch.rand(2, 3, 48, 48) * 2 - 1).embeds
    assert bigger.shape == (2, 80) and torch.isfinite(bigger).all()


def test_vit_config_checks():
    cfg = presets.get("tiny-vit")
    with pytest.raises(ConfigError, match="image_size=36 must divide by model.vision.patch_size=8"):
        check(override(cfg, ["model.vision.image_size=36", "model.vision.resize_size=40"]))
    with pytest.raises(ConfigError, match="hidden_size=30 must divide by model.vision.num_heads=4"):
        check(override(cfg, ["model.vision.hidden_size=30", "model.vision.num_heads=4"]))
    with pytest.raises(ConfigError, match="model.vision.kind=convnext must be efficientnet or vit"):
        check(override(cfg, ["model.vision.kind=convnext"]))


def test_vit_pipeline_train_eval_embed_index_search(shapes, tmp_path, capsys):
    """A ViT trained with the late-interaction loss, through every command: eval with a re-rank and at another
    resolution, embed with its top patch vectors, index, search with a re-rank, serve."""
    from conftest import shape_images
    from openalign import cli

    run = tmp_path / "run"
    assert cli.main(["train", "--preset", "tiny-vit", "--data", str(shapes["train"]), "--eval-data",
                     str(shapes["eval"]), "--out", str(run), "--quiet", "train.steps=4", "loss.kind=filip"]) == 0
    model_dir = run / "model"
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "vision-text-dual-encoder"
    final = json.loads((run / "final_metrics.json").read_text())
    assert cli.main(["eval", str(model_dir), "--data", str(shapes["eval"]), "--out", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["i2t_r10"] == final["i2t_r10"]
    assert cli.main(["eval", str(model_dir), "--data", str(shapes["eval"]), "--task", "retrieval", "--rerank", "5",
                     "--out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["patches_per_image"] == 16  # 32 px in 8 px patches
    # at another resolution: the position embeddings are interpolated, the evaluation runs
    assert cli.main(["eval", str(model_dir), "--data", str(shapes["eval"]), "--crop", "48", "--resize", "54",
                     "--out", str(tmp_path / "m48.json")]) == 0
    images = shape_images(tmp_path / "images")
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / "emb"), "--quiet",
                     "--patches", "--top-patches", "4"]) == 0
    manifest = json.loads((tmp_path / "emb" / "manifest.json").read_text())
    assert (manifest["patches_per_image"], manifest["patch_bytes_per_image"]) == (4, 4 * 80 * 2)
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "idx"), "--text", "a red circle", "-k", "3", "--rerank", "8"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 5  # header, 3 hits, the re-rank's line
    from fastapi.testclient import TestClient

    from openalign.serve.app import create_app

    served = TestClient(create_app(tmp_path / "idx")).post("/search", json={"text": "a red circle", "k": 5}).json()
    assert len(served["results"]) == 5


def test_top_patches_keeps_the_vectors_of_largest_norm():
    from openalign.model.encode import encode_image_tokens

    _, model = vit_model()
    pixels = torch.rand(3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        out = model.encode_image(pixels, tokens=True)
    _, every = encode_image_tokens(model, pixels)
    _, kept = encode_image_tokens(model, pixels, top=4)
    assert every.shape == (3, 16, 80) and kept.shape == (3, 4, 80)
    for i in range(3):
        # each kept vector is one of the image's own, and no dropped one had a larger norm
        match = (kept[i] @ every[i].T).isclose(torch.tensor(1.0), atol=1e-5)  # [4, 16]
        chosen = match.float().argmax(dim=1)
        assert match.any(dim=1).all() and len(set(chosen.tolist())) == 4
        dropped = torch.ones(16, dtype=torch.bool)
        dropped[chosen] = False
        assert out.token_norms[i, chosen].min() >= out.token_norms[i, dropped].max()
