import pytest
import torch

from openalign import loss as loss_lib
from openalign import presets
from openalign.model.dual_encoder import DualEncoder, vision_pooled_dim


@pytest.mark.parametrize("name", [n for n in presets.PRESETS if n.startswith("align-")])
def test_paper_presets_build_on_meta_with_paper_dims(name):
    cfg = presets.get(name)
    assert (cfg.model.vision.resize_size, cfg.model.vision.image_size, cfg.model.text.max_length) == (346, 289, 64)
    start = loss_lib.kind_of(cfg.loss).initial_scalars(cfg.loss)["temperature"]  # init 0: the paper loss's own
    assert start == 1.0 and cfg.loss.temperature.init == 0.0 and cfg.loss.label_smoothing == 0.1
    assert cfg.optim.name == "lamb" and cfg.optim.weight_decay == 1e-5 and cfg.data.global_batch == 16_384
    with torch.device("meta"):
        model = DualEncoder(cfg.model, cfg.loss)
    pooled = vision_pooled_dim(model.align)
    if "-b7-" in name:
        assert pooled == 640 and cfg.model.embed_dim == 640 and model.image_projection is None
    elif "-l2-" in name:
        assert pooled == 1376 and cfg.model.embed_dim == 1376 and model.image_projection is None
    else:  # B1/B3/B5 pool to 320/384/512: a linear layer maps them to the paper's 640
        assert cfg.model.embed_dim == 640 and model.image_projection.in_features == pooled < 640
    assert model.align.text_model.pooler is None
    assert model.align.text_projection.out_features == cfg.model.embed_dim


@pytest.mark.parametrize("name,width,layers,heads,patch", [("vit-b32-base", 768, 12, 12, 32),
                                                            ("vit-b16-base", 768, 12, 12, 16),
                                                            ("vit-l14-large", 1024, 24, 16, 14)])
def test_clip_vit_presets_have_clip_sizes(name, width, layers, heads, patch):
    cfg = presets.get(name)
    v = cfg.model.vision
    assert (v.kind, v.hidden_size, v.num_layers, v.num_heads, v.patch_size, v.image_size) == \
        ("vit", width, layers, heads, patch, 224)
    with torch.device("meta"):
        model = DualEncoder(cfg.model, cfg.loss)
    # by hand: per block 12 w^2 + 13 w (attention with biases, MLP 4w, two LayerNorms); the patch convolution
    # (no bias), CLS token, position embeddings for every patch and the CLS, pre- and post-LayerNorm
    tokens = (224 // patch) ** 2 + 1
    expected = layers * (12 * width**2 + 13 * width) + 3 * patch**2 * width + width + tokens * width + 4 * width
    assert sum(p.numel() for p in model.vision_tower.parameters()) == expected  # B/16: 85.8M, L/14: 303.2M
    assert model.dual.visual_projection.weight.shape == (640, width) and model.image_projection is None


def test_bert_sizes_match_the_paper():
    sizes = {"mini": (4, 256), "medium": (8, 512), "base": (12, 768), "large": (24, 1024)}
    for text, (layers, hidden) in sizes.items():
        cfg = presets.get(f"align-b7-{text}").model.text
        assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (layers, hidden, 4 * hidden)


def test_demo_is_small_and_uses_pytorch_batchnorm_momentum():
    cfg = presets.get("demo")
    model = DualEncoder(cfg.model)
    n_params = sum(p.numel() for p in model.parameters())
    # 6.5M with the configured vocabulary of 8,000; ~5.9M trained (the emoji corpus yields 5,571 tokens)
    assert n_params < 7_000_000
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert bn.momentum == cfg.model.vision.batch_norm_momentum <= 0.1  # never transformers' 0.99


def test_the_demo_and_tiny_are_the_paper_recipe_plus_their_stated_deviations():
    from openalign.config import flat as leaves

    paper = leaves(presets.get("align-b1-mini"))
    towers = ("preset", "out", "model.vision.width_coefficient", "model.vision.depth_coefficient",
              "model.text.hidden_size", "model.text.num_layers", "model.text.num_heads", "model.text.intermediate_size",
              "model.embed_dim")
    for name, deviations in (("demo", presets.DEMO), ("tiny", presets.TINY), ("clipart", presets.CLIPART)):
        changed = {k for k, v in leaves(presets.get(name)).items() if paper[k] != v}
        stated = {d.split("=")[0] for d in deviations}
        assert changed - set(towers) <= stated, f"{name} deviates without saying so: {changed - set(towers) - stated}"
