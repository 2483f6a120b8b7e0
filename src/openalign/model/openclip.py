"""OpenCLIP's native checkpoints as the transformers CLIPModel they are, where the mapping is exact.

A native directory is what open_clip's `push_to_hf_hub` uploads (LAION's, DataComp's, DFN's and MetaCLIP's models):
`open_clip_config.json` (`model_cfg`: embed_dim, quick_gelu, vision_cfg, text_cfg; `preprocess_cfg`: mean, std,
interpolation, resize_mode), `open_clip_model.safetensors` (or the older `open_clip_pytorch_model.bin`, read with
torch's weights-only loader: no pickled code runs) and the tokenizer's files (openai/clip-vit-large-patch14's BPE,
which open_clip's own bundled tokenizer also is).

Exact, and loaded as a CLIPModel: open_clip's `CLIP` (or `CustomTextCLIP` with its own text transformer) with a
VisionTransformer image tower pooled at the class token (`ln_pre`, `ln_post`, a linear `proj`) and its causal text
transformer pooled at the largest token id (open_clip's `argmax`: the end-of-text token; CLIPConfig's
`eos_token_id=2` pools the same way), GELU or QuickGELU, LayerNorm eps 1e-5. Each `in_proj` is split into q, k, v;
`proj` and `text_projection` are transposed. That is the ViT-B/L/H/g/bigG family of CLIP models.
Refused in one sentence, naming the setting: ModifiedResNet towers (RN50...), timm towers (ConvNeXt, EVA...),
Hugging Face text towers (XLM-R...), CoCa, layer scale, attentional or average pooling, custom attention blocks, a
logit bias (open_clip's SigLIP models: load their transformers release), and any weight the mapping leaves over.

Preprocessing is open_clip's `image_transform` as the config gives it: the shortest side resized to the image size
(`resize_mode: shortest`, bicubic unless `interpolation` says otherwise), then a centre crop whose corner torchvision
rounds to the nearest pixel (`crop_round: nearest`), or a plain resize to the square (`squash`); mean and std.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import transformers

from openalign.config import ConfigError

CONFIG_FILE = "open_clip_config.json"
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")

# settings of open_clip's CLIPVisionCfg / CLIPTextCfg whose only exact CLIPModel value is their default
VISION_DEFAULTS = {"ls_init_value": None, "attentional_pool": False, "no_ln_pre": False, "pos_embed_type": "learnable",
                   "final_ln_after_pool": False, "pool_type": "tok", "act_kwargs": None, "norm_kwargs": None,
                   "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False, "scale_attn_inner": False,
                   "scale_attn": False, "scale_fc": False, "timm_model_name": None, "global_average_pool": False}
TEXT_DEFAULTS = {"ls_init_value": None, "embed_cls": False, "no_causal_mask": False, "final_ln_after_pool": False,
                 "pool_type": "argmax", "proj_bias": False, "proj_type": "linear", "act_kwargs": None,
                 "norm_kwargs": None, "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False,
                 "scale_attn_inner": False, "scale_attn": False, "scale_fc": False, "hf_model_name": None}
BLOCKS = (None, "default")


def is_native(path: Path) -> bool:
    """An OpenCLIP-native directory: its config, and no transformers config.json beside it (a directory with
    both, as some of LAION's releases are, loads as the CLIPModel its config.json names)."""
    return (Path(path) / CONFIG_FILE).is_file() and not (Path(path) / "config.json").is_file()


def read(path: Path) -> dict:
    try:
        data = json.loads((Path(path) / CONFIG_FILE).read_text())
    except ValueError:
        raise ConfigError(f"{Path(path) / CONFIG_FILE} is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_cfg"), dict):
        raise ConfigError(f"{Path(path) / CONFIG_FILE} has no model_cfg; it is not an OpenCLIP checkpoint's config")
    return data


def _refuse(path: Path, what: str) -> ConfigError:
    return ConfigError(f"{path} is an OpenCLIP checkpoint with {what}, which has no exact transformers CLIPModel "
                       "form; openalign loads OpenCLIP's ViT CLIP models (class-token pooling, argmax text pooling)")


def clip_config(path: Path) -> transformers.CLIPConfig:
    """The CLIPConfig of a native checkpoint, or one sentence naming the setting that has no exact CLIPModel form."""
    path = Path(path)
    model = read(path)["model_cfg"]
    vision, text = model.get("vision_cfg") or {}, model.get("text_cfg") or {}
    if model.get("multimodal_cfg"):
        raise _refuse(path, "a text decoder (CoCa)")
    if model.get("init_logit_bias") is not None:
        raise _refuse(path, "a logit bias (a sigmoid-loss model: load its transformers SiglipModel release)")
    if not isinstance(vision.get("layers", 12), int):
        raise _refuse(path, f"a ModifiedResNet image tower (vision_cfg.layers={vision['layers']})")
    for part, settings, defaults in (("vision_cfg", vision, VISION_DEFAULTS), ("text_cfg", text, TEXT_DEFAULTS)):
        for key, default in defaults.items():
            if settings.get(key, default) != default:
                raise _refuse(path, f"{part}.{key}={settings[key]!r}")
        if settings.get("block_type") not in BLOCKS:
            raise _refuse(path, f"{part}.block_type={settings['block_type']!r}")
    size = vision.get("image_size", 224)
    if isinstance(size, (list, tuple)):
        if len(set(size)) != 1:
            raise _refuse(path, f"a non-square image size {list(size)}")
        size = size[0]
    act = "quick_gelu" if model.get("quick_gelu") else "gelu"
    width, text_width = vision.get("width", 768), text.get("width", 512)
    vision_config = dict(hidden_size=width, intermediate_size=int(width * vision.get("mlp_ratio", 4.0)),
                         num_hidden_layers=vision.get("layers", 12),
                         num_attention_heads=width // vision.get("head_width", 64), image_size=int(size),
                         patch_size=vision.get("patch_size", 16), hidden_act=act, layer_norm_eps=1e-5)
    text_config = dict(vocab_size=text.get("vocab_size", 49408), hidden_size=text_width,
                       intermediate_size=int(text_width * text.get("mlp_ratio", 4.0)),
                       num_hidden_layers=text.get("layers", 12), num_attention_heads=text.get("heads", 8),
                       max_position_embeddings=text.get("context_length", 77), hidden_act=act, layer_norm_eps=1e-5,
                       eos_token_id=2)  # CLIPTextTransformer pools at input_ids.argmax(-1) for eos_token_id 2
    return transformers.CLIPConfig(text_config=text_config, vision_config=vision_config,
                                   projection_dim=model.get("embed_dim", 512))


def processor(path: Path) -> dict:
    """open_clip's preprocessing of this checkpoint in an image processor's vocabulary (hub.vision_from_processor),
    with torchvision's rounding of the centre crop's corner."""
    data = read(path)
    pre, config = data.get("preprocess_cfg") or {}, clip_config(path)
    size = config.vision_config.image_size
    mode = pre.get("resize_mode", "shortest")
    interpolation = pre.get("interpolation", "bicubic")
    if mode not in ("shortest", "squash") or interpolation not in ("bicubic", "bilinear"):
        what = f"resize_mode {mode!r}" if mode not in ("shortest", "squash") else f"interpolation {interpolation!r}"
        raise ConfigError(f"{path}'s preprocess_cfg asks for {what}; openalign reads OpenCLIP's shortest-side and "
                          "squash resizes, bicubic or bilinear")
    mean, std = pre.get("mean", (0.48145466, 0.4578275, 0.40821073)), pre.get("std", (0.26862954, 0.26130258,
                                                                                     0.27577711))
    return {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
            "size": {"shortest_edge": size} if mode == "shortest" else {"height": size, "width": size},
            "do_center_crop": True, "crop_size": {"height": size, "width": size},
            "resample": 3 if interpolation == "bicubic" else 2, "do_rescale": True, "rescale_factor": 1 / 255,
            "do_normalize": True, "image_mean": list(mean), "image_std": list(std), "crop_round": "nearest"}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        file = Path(path) / name
        if file.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(file)
            try:  # tensors only: a pickle that would build anything else is refused, never run
                with warnings.catch_warnings():  # (torch's note on the pickle protocol of a file it then refuses)
                    warnings.simplefilter("ignore")
                    return torch.load(file, map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - torch.load's refusals come as many types
                raise ConfigError(f"{file} is not a plain state dict of tensors ({type(err).__name__}); convert it "
                                  "to open_clip_model.safetensors") from None
    raise ConfigError(f"{path} has {CONFIG_FILE} but no weights ({' or '.join(WEIGHT_FILES)})")


def clip_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(CLIPModel's state dict, the native keys left over) from an open_clip CLIP state dict."""
    out: dict[str, torch.Tensor] = {}
    left = []
    blocks = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
              "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    plain = {"logit_scale": "logit_scale", "visual.class_embedding": "vision_model.embeddings.class_embedding",
             "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
             "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
             "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
             "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
             "visual.ln_post.weight": "vision_model.post_layernorm.weight",
             "visual.ln_post.bias": "vision_model.post_layernorm.bias",
             "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
             "positional_embedding": "text_model.embeddings.position_embedding.weight",
             "ln_final.weight": "text_model.final_layer_norm.weight",
             "ln_final.bias": "text_model.final_layer_norm.bias"}
    for key, value in state.items():
        name = key.removeprefix("text.") if key.startswith("text.") else key  # CustomTextCLIP's text tower
        if name in plain:
            out[plain[name]] = value
        elif name in ("visual.proj", "text_projection"):
            target = "visual_projection.weight" if name == "visual.proj" else "text_projection.weight"
            out[target] = value.t().contiguous()
        elif name == "attn_mask":  # the causal mask, saved as a buffer by older releases
            continue
        elif ".resblocks." in name and name.startswith(("visual.transformer.", "transformer.")):
            tower = "vision_model" if name.startswith("visual.") else "text_model"
            index, rest = name.split(".resblocks.", 1)[1].split(".", 1)
            prefix = f"{tower}.encoder.layers.{index}"
            if rest.startswith("attn.in_proj_"):
                for part, chunk in zip(("q", "k", "v"), value.chunk(3, dim=0)):
                    out[f"{prefix}.self_attn.{part}_proj.{rest.removeprefix('attn.in_proj_')}"] = chunk.contiguous()
                continue
            module, leaf = rest.rsplit(".", 1)
            if module in blocks:
                out[f"{prefix}.{blocks[module]}.{leaf}"] = value
            else:
                left.append(key)
        else:
            left.append(key)
    return out, left


def load(path: Path) -> transformers.CLIPModel:
    """The CLIPModel of a native checkpoint, its weights mapped exactly (every weight placed, none missing)."""
    path = Path(path)
    config = clip_config(path)
    mapped, left = clip_state_dict(_weights(path))
    model = transformers.CLIPModel(config)
    expected = set(model.state_dict())
    missing = sorted(expected - set(mapped))
    if left or missing:
        what = f"weights openalign does not map ({', '.join(left[:3])})" if left else \
            f"no weights for {', '.join(missing[:3])}"
        raise _refuse(path, what)
    model.load_state_dict(mapped, strict=True)
    return model.eval()
