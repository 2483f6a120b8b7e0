"""Save and load a dual encoder as a Hugging Face AlignModel (EfficientNet) or VisionTextDualEncoderModel
(ViT) directory, offline.

Directory layout (the format of the public kakaobrain/align-base checkpoint, plus two extras):
    config.json, model.safetensors     transformers.AlignModel (towers, text projection, temperature)
    tokenizer.json, tokenizer_config.json   loadable as transformers.BertTokenizerFast
    preprocessor_config.json           transformers' EfficientNetImageProcessor settings: resize, crop, rescale
    openalign.json                     the resolved openalign config (absent in foreign checkpoints)
    openalign_extra.safetensors        image projection / SigLIP bias, only for models that have them
A plain `transformers.AlignModel.from_pretrained(dir)` loads the towers; it ignores the extras, so it
reproduces openalign's embeddings exactly when the model has neither (e.g. B7 at 640, L2 at 1376).

A ViT model (model.vision.kind=vit) saves the same files around a `VisionTextDualEncoderModel` (CLIP's
vision transformer + BERT, both projections, logit_scale = log(1/T)); `openalign_extra.safetensors`
then holds the raw temperature (and SigLIP's bias). Plain transformers' `get_image_features` /
`get_text_features`, L2-normalized, give openalign's embeddings for CLS pooling; a mean-pooled model
(model.vision.pool=mean) pools as `post_layernorm(last_hidden_state[:, 1:].mean(1))` before the
visual projection, which transformers' class does not do by itself.

A CLIPModel fine-tuned by `train --init` (model.family=clip) saves as a CLIPModel: its config and weights, the
learned temperature in logit_scale = log(1/T), the checkpoint's tokenizer and CLIP's image processor settings
(CLIPImageProcessor: shortest side, bicubic, centre crop, its mean and std), so `CLIPModel.from_pretrained(dir)` and
`AutoProcessor.from_pretrained(dir)` give its embeddings with nothing of openalign's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import threading
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AlignModel, VisionTextDualEncoderModel

from openalign import config as config_lib
from openalign.config import Config, ConfigError, ModelConfig, TextConfig, VisionConfig
from openalign.model import families, openclip
from openalign.model.dual_encoder import DualEncoder
from openalign.model.families import FAMILIES
from openalign.tokenizer import TOKENIZER_FILES, load_tokenizer
from openalign.outputs import staged_dir

CONFIG_FILE = "openalign.json"
EXTRA_FILE = "openalign_extra.safetensors"
PROCESSOR_FILE = "preprocessor_config.json"  # transformers' image processor settings (AlignProcessor reads it)


def save_pretrained(model: DualEncoder, tokenizer, out: Path, cfg: Config) -> Path:
    """The model directory `out`, written whole into a temporary directory beside it and then put in place: a
    save that fails (a full disk, Ctrl-C) leaves the previous model directory as it was, never half of one."""
    out = Path(out)
    with staged_dir(out) as tmp:
        _save_into(model, tokenizer, tmp, cfg)
    return out


def _save_into(model: DualEncoder, tokenizer, out: Path, cfg: Config) -> None:
    model.store_temperature()
    with _placeholder_pooler(model.hf):
        model.hf.save_pretrained(out)  # (transformers' own bars: cli.py quiets them when a command starts)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    (out / PROCESSOR_FILE).write_text(json.dumps(processor_settings(cfg.model), indent=2) + "\n")
    config_lib.save(cfg, out / CONFIG_FILE)
    saved = {id(p) for p in model.hf.parameters()}
    extra = {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if id(p) not in saved}
    if extra:
        save_file(extra, out / EXTRA_FILE)


@contextlib.contextmanager
def _placeholder_pooler(hf):
    """An AlignModel saved with its text pooler's weights, as zeros. openalign's ALIGN pools BERT's [CLS] itself and
    drops the pooler (a parameter without gradient breaks DDP); AlignModel's own text embedding does not read it
    either. Without its weights in the file, every `AlignModel.from_pretrained` prints transformers' report of
    "MISSING ... newly initialized" weights and advises training, which reads as a broken model."""
    text = getattr(hf, "text_model", None)
    if not isinstance(hf, AlignModel) or text is None or text.pooler is not None:
        yield
        return
    from transformers.models.align.modeling_align import AlignTextPooler

    pooler = AlignTextPooler(hf.config.text_config)
    torch.nn.init.zeros_(pooler.dense.weight)
    torch.nn.init.zeros_(pooler.dense.bias)
    text.pooler = pooler.to(next(hf.parameters()).device)
    try:
        yield
    finally:
        text.pooler = None


_LOADING = threading.Lock()


@contextlib.contextmanager
def _pooler_not_missing(kind):
    """An AlignModel directory saved by openalign before its pooler was kept as zeros loads without transformers'
    report of the pooler "MISSING" (openalign drops it on load anyway): the pattern is in the class's ignore list
    for this one load."""
    if kind is not AlignModel:
        yield
        return
    with _LOADING:
        before = AlignModel._keys_to_ignore_on_load_missing
        AlignModel._keys_to_ignore_on_load_missing = [*(before or []), r"^text_model\.pooler\."]
        try:
            yield
        finally:
            AlignModel._keys_to_ignore_on_load_missing = before


def processor_settings(model: ModelConfig) -> dict:
    """The image processor settings that give openalign's evaluation pixels, so that
    `AutoProcessor.from_pretrained(dir)` works: for openalign's models EfficientNetImageProcessor's (resize to a
    square, center crop, rescale and offset, optional normalization); a fine-tuned CLIPModel keeps CLIP's processor
    (shortest side, bicubic, center crop, its mean and std), as the checkpoint it started from had it."""
    v = model.vision
    size = {"height": v.resize_size, "width": v.resize_size} if v.resize_mode == "square" \
        else {"shortest_edge": v.resize_size}
    common = {"do_resize": True, "resample": {name: code for code, name in RESAMPLE.items()}[v.resample], "size": size,
              "do_center_crop": True, "crop_size": {"height": v.image_size, "width": v.image_size},
              "do_rescale": True, "rescale_factor": v.pixel_scale, "do_normalize": bool(v.pixel_mean),
              "image_mean": list(v.pixel_mean) or [0.5, 0.5, 0.5], "image_std": list(v.pixel_std) or [0.5, 0.5, 0.5]}
    if model.family == "clip":
        return {"image_processor_type": "CLIPImageProcessor", "processor_class": "CLIPProcessor", **common,
                "do_convert_rgb": True}
    processor = "VisionTextDualEncoderProcessor" if v.kind == "vit" else "AlignProcessor"
    return {"image_processor_type": "EfficientNetImageProcessor", "processor_class": processor, **common,
            "rescale_offset": v.pixel_offset == -1.0, "include_top": False}


def _square(value, default: int) -> int:
    """A processor's `size` / `crop_size` ({height, width}, {shortest_edge} or an int) as one side."""
    if isinstance(value, dict):
        sides = [value[k] for k in ("height", "width", "shortest_edge") if k in value]
        if len(set(sides)) > 1:
            raise ConfigError(f"non-square processor size {value} is not supported; openalign evaluates square crops")
        return int(sides[0]) if sides else default
    return int(value) if isinstance(value, (int, float)) else default


RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}  # PIL's codes, by name


def _resize_mode(processor: dict) -> str:
    """`shortest_edge` when the processor resizes the shortest side (CLIP's `{"shortest_edge": 224}`, or a bare
    int in a processor that does not default to a square, as CLIP's older files say it), else `square`."""
    size = processor.get("size")
    if isinstance(size, dict):
        return "shortest_edge" if "shortest_edge" in size and not {"height", "width"} & set(size) else "square"
    square = processor.get("default_to_square", True)  # CLIP's class says False (class_defaults)
    return "square" if isinstance(size, (int, float)) and square else "shortest_edge" if size is not None else "square"


PROCESSOR_KEYS = ("do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
                  "rescale_offset", "do_normalize", "image_mean", "image_std", "default_to_square", "max_num_patches",
                  "patch_size")


def class_defaults(processor: dict) -> dict:
    """What the processor's class assumes for the settings its file leaves out (transformers' PIL twin of the class
    named by `image_processor_type`: CLIP's and SigLIP's resample bicubically by default, EfficientNet's not)."""
    name = str(processor.get("image_processor_type") or "").removesuffix("Fast").removesuffix("Pil")
    cls = getattr(transformers, f"{name}Pil", None) if name.isidentifier() else None
    found = {key: getattr(cls, key) for key in PROCESSOR_KEYS if cls is not None and hasattr(cls, key)}
    return {k: int(v) if k == "resample" and v is not None else v for k, v in found.items() if v is not None}


def vision_from_processor(v: VisionConfig, processor: dict) -> VisionConfig:
    """`v` with the resize (square or shortest side, and its filter), crop, rescale and normalization of a
    transformers image processor's settings (with its class's defaults for what they leave out)."""
    processor = class_defaults(processor) | processor
    resample = processor.get("resample", 2)
    resample = RESAMPLE.get(resample, resample) if isinstance(resample, int) else str(resample).lower()
    if resample not in RESAMPLE.values():
        raise ConfigError(f"the checkpoint's image processor resamples with {processor['resample']!r}; openalign "
                          f"reads Pillow's filters ({', '.join(f'{k} {n}' for k, n in RESAMPLE.items())})")
    size = _square(processor.get("size"), v.image_size)
    crop = _square(processor.get("crop_size"), size) if processor.get("do_center_crop", False) else size
    if not processor.get("do_resize", True):
        size = max(size, crop)  # no resize: the processor expects inputs of this size already
    scale = float(processor.get("rescale_factor", 1 / 255)) if processor.get("do_rescale", True) else 1.0
    offset = -1.0 if processor.get("do_rescale", True) and processor.get("rescale_offset", False) else 0.0
    normalize = processor.get("do_normalize", False)
    mean = tuple(float(x) for x in processor.get("image_mean") or ()) if normalize else ()
    std = tuple(float(x) for x in processor.get("image_std") or ()) if normalize else ()
    v = dataclasses.replace(v, resize_size=size, image_size=crop, pixel_scale=scale, pixel_offset=offset,
                            pixel_mean=mean, pixel_std=std, resize_mode=_resize_mode(processor), resample=resample,
                            crop_round=processor.get("crop_round", "down"))
    if processor.get("max_num_patches"):  # Siglip2's NaFlex processor: no fixed size, a budget of patches
        v = dataclasses.replace(v, resize_mode="naflex", max_num_patches=int(processor["max_num_patches"]),
                                patch_size=int(processor.get("patch_size") or v.patch_size))
    return v


def _model_config_from_hf(hf) -> ModelConfig:
    """A ModelConfig describing a foreign AlignModel checkpoint (e.g. kakaobrain/align-base)."""
    v, t = hf.vision_config, hf.text_config
    return ModelConfig(
        vision=VisionConfig(
            width_coefficient=v.width_coefficient, depth_coefficient=v.depth_coefficient,
            in_channels=tuple(v.in_channels), out_channels=tuple(v.out_channels),
            num_block_repeats=tuple(v.num_block_repeats), kernel_sizes=tuple(v.kernel_sizes),
            strides=tuple(v.strides), expand_ratios=tuple(v.expand_ratios),
            drop_connect_rate=v.drop_connect_rate, batch_norm_momentum=v.batch_norm_momentum,
            batch_norm_eps=v.batch_norm_eps, image_size=v.image_size, resize_size=v.image_size,
        ),
        text=TextConfig(
            hidden_size=t.hidden_size, num_layers=t.num_hidden_layers, num_heads=t.num_attention_heads,
            intermediate_size=t.intermediate_size, dropout=t.hidden_dropout_prob, vocab_size=t.vocab_size,
        ),
        embed_dim=hf.projection_dim,
    )


def _model_config_from_dual(hf) -> ModelConfig:
    """A ModelConfig describing a foreign VisionTextDualEncoderModel checkpoint of CLIP vision + BERT."""
    v, t = hf.vision_config, hf.text_config
    if v.model_type not in ("clip_vision_model", "clip") or t.model_type != "bert":
        raise ConfigError(f"this VisionTextDualEncoderModel pairs {v.model_type} with {t.model_type}; openalign reads "
                          "CLIP vision transformers with BERT text towers")
    if v.hidden_act != "quick_gelu":
        raise ConfigError(f"the checkpoint's vision transformer uses {v.hidden_act}; openalign's ViT is CLIP's "
                          "(quick_gelu)")
    return ModelConfig(
        vision=VisionConfig(kind="vit", patch_size=v.patch_size, hidden_size=v.hidden_size,
                            num_layers=v.num_hidden_layers, num_heads=v.num_attention_heads,
                            intermediate_size=v.intermediate_size, image_size=v.image_size, resize_size=v.image_size),
        text=TextConfig(hidden_size=t.hidden_size, num_layers=t.num_hidden_layers, num_heads=t.num_attention_heads,
                        intermediate_size=t.intermediate_size, dropout=t.hidden_dropout_prob, vocab_size=t.vocab_size),
        embed_dim=hf.projection_dim, channels_last=False)


MODEL_TYPES = {"align": "AlignModel", "vision-text-dual-encoder": "VisionTextDualEncoderModel", **FAMILIES}


def model_type(path: Path) -> str:
    """config.json's model_type: one of MODEL_TYPES (anything else is refused, naming them)."""
    try:
        kind = json.loads((Path(path) / "config.json").read_text()).get("model_type", "")
    except ValueError:
        raise ConfigError(f"{Path(path) / 'config.json'} is not JSON") from None
    if kind not in MODEL_TYPES:
        raise ConfigError(f"{path} holds a {kind or 'unknown'} model; openalign loads "
                          f"{', '.join(list(MODEL_TYPES.values())[:-1])} and {list(MODEL_TYPES.values())[-1]} "
                          "directories")
    return kind


def load_config(path: Path) -> Config:
    """The config of a model directory of one of MODEL_TYPES (openalign's own, or one describing a public
    checkpoint)."""
    path = Path(path)
    if openclip.is_native(path):  # OpenCLIP's own format: the CLIPModel it maps onto, open_clip's preprocessing
        model = families.model_config(openclip.clip_config(path), "clip")
        return Config(model=dataclasses.replace(model, vision=vision_from_processor(model.vision,
                                                                                    openclip.processor(path))))
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a model directory (no config.json); pass the `model` folder of a run")
    if (path / CONFIG_FILE).is_file():
        cfg = config_lib.load(path / CONFIG_FILE)
        processor = image_processor_settings(path)
        if processor is not None and vision_from_processor(cfg.model.vision, processor) != cfg.model.vision:
            implied = vision_from_processor(cfg.model.vision, processor)
            raise ConfigError(f"{path}'s image processor files say resize {implied.resize_size} / crop "
                              f"{implied.image_size} but the model was trained at {cfg.model.vision.resize_size} / "
                              f"{cfg.model.vision.image_size} ({CONFIG_FILE}); restore its {PROCESSOR_FILE} and remove "
                              f"a {PROCESSOR_FILES[1]} saved over it, or train at the new size")
        return cfg
    kind = model_type(path)
    if kind in FAMILIES:  # a public checkpoint: its towers as they are, its processor's preprocessing
        hf = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        model = families.model_config(hf, kind)
        processor = image_processor_settings(path)
        if processor is None:  # its size, crop and mean are the checkpoint's own: never guessed
            raise ConfigError(f"{path} has no {' or '.join(PROCESSOR_FILES)}: a {FAMILIES[kind]}'s preprocessing "
                              "(resize, crop, mean and std) is read from it; copy it from the checkpoint's release")
        return Config(model=dataclasses.replace(model, vision=vision_from_processor(model.vision, processor)))
    if kind == "vision-text-dual-encoder":
        hf = transformers.VisionTextDualEncoderConfig.from_pretrained(path)
        model, temperature = _model_config_from_dual(hf), math.exp(-hf.logit_scale_init_value)
    else:
        hf = transformers.AlignConfig.from_pretrained(path)
        model, temperature = _model_config_from_hf(hf), hf.temperature_init_value
    processor = image_processor_settings(path)
    if processor is not None:  # the checkpoint's own preprocessing, not resize = crop = image size
        model = dataclasses.replace(model, vision=vision_from_processor(model.vision, processor))
    # transparency as transformers' processors make it RGB (convert("RGB")), not openalign's white background
    model = dataclasses.replace(model, vision=dataclasses.replace(model.vision, alpha="drop"))
    loss = config_lib.LossConfig(temperature=config_lib.TemperatureConfig(init=temperature))
    return Config(model=model, loss=loss)


PROCESSOR_FILES = (PROCESSOR_FILE, "processor_config.json")  # transformers 5 saves a processor's settings in the
# second, under "image_processor"; older releases (and openalign) the image processor's alone in the first


def image_processor_settings(path: Path) -> dict | None:
    """A model directory's image processor settings, from either file transformers writes (the one place every
    loader reads them); None when it has neither. Two files that disagree are refused in one sentence: which one
    transformers' own loading would take depends on the class and release, so neither is guessed."""
    found = {}
    for name in PROCESSOR_FILES:
        if (Path(path) / name).is_file():
            try:
                data = json.loads((Path(path) / name).read_text())
            except ValueError:
                raise ConfigError(f"{Path(path) / name} is not JSON") from None
            settings = data if name == PROCESSOR_FILE else (data or {}).get("image_processor")
            if isinstance(settings, dict):
                found[name] = settings
    if len(found) == 2:
        keys = ("size", "crop_size", "do_center_crop", "do_resize", "rescale_factor", "rescale_offset", "do_normalize",
                "image_mean", "image_std", "resample", "max_num_patches", "patch_size")
        differ = [k for k in keys if found[PROCESSOR_FILES[0]].get(k) != found[PROCESSOR_FILES[1]].get(k)]
        if differ:
            raise ConfigError(f"{path} holds two image processor files that disagree on {', '.join(differ)} "
                              f"({' and '.join(PROCESSOR_FILES)}); remove the stale one")
    return next(iter(found.values()), None)


WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".npz")  # beside *.safetensors


def weights_fingerprint(path: Path) -> str:
    """A hash of a model directory's config and every weight file it can hold (content only: copying the directory
    keeps it): safetensors, and transformers', PyTorch's, Flax's, Keras's and numpy's formats (`pytorch_model.bin`
    and its shards among them). The order keeps the digest of a directory of safetensors alone as it always was."""
    digest = hashlib.blake2b(digest_size=16)
    extra = [Path(path) / name for name in ("config.json", openclip.CONFIG_FILE, openclip.WEIGHT_FILES[1])]
    others = sorted(f for f in Path(path).iterdir() if f.suffix in WEIGHT_SUFFIXES and f not in extra) \
        if Path(path).is_dir() else []
    for file in sorted(Path(path).glob("*.safetensors")) + extra + others:
        if file.is_file():
            digest.update(file.name.encode())
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(2**24), b""):
                    digest.update(block)
    return digest.hexdigest()


MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "spiece.model",
               "sentencepiece.bpe.model", "tokenizer.model", "vocab.json", "merges.txt", PROCESSOR_FILE,
               "processor_config.json")


def model_fingerprint(path: Path) -> str:
    """What a model directory's outputs depend on: its weights and config (weights_fingerprint) and its tokenizer
    and processor files, by content; the key of work that encodes with it."""
    digest = hashlib.blake2b(weights_fingerprint(path).encode(), digest_size=16)
    for name in MODEL_FILES:
        if (Path(path) / name).is_file():
            digest.update(name.encode() + b"\0" + (Path(path) / name).read_bytes())
    return digest.hexdigest()




def has_tokenizer(path: Path) -> bool:
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def load_pretrained(path: Path) -> tuple[DualEncoder, object, Config]:
    """Load (model in eval mode, tokenizer or None, config) from a model directory of one of MODEL_TYPES."""
    path = Path(path)
    cfg = load_config(path)
    # openalign drops BERT's pooler (it pools [CLS] itself) and saves it as zeros (_placeholder_pooler); a directory
    # saved before that loads with the pooler ignored (_pooler_not_missing): no load report either way.
    if cfg.model.family != "openalign":
        hf = openclip.load(path) if openclip.is_native(path) else \
            getattr(transformers, FAMILIES[cfg.model.family]).from_pretrained(path, local_files_only=True)
        model = families.PublicDualEncoder(cfg.model, hf)
    else:
        kind = VisionTextDualEncoderModel if cfg.model.vision.kind == "vit" else AlignModel
        with _pooler_not_missing(kind):
            hf = kind.from_pretrained(path, local_files_only=True)
        model = DualEncoder(cfg.model, cfg.loss, hf=hf)
        if (path / EXTRA_FILE).is_file():
            model.load_state_dict(load_file(path / EXTRA_FILE), strict=False)
    tokenizer = None
    if has_tokenizer(path):
        tokenizer = load_tokenizer(path)
    return model.eval(), tokenizer, cfg


def init_towers(model: DualEncoder, path: Path) -> None:
    """Initialize towers, projections and temperature (everything the model has) from the model directory it
    starts from. A CLIPModel's kind (model.family=clip) loaded the checkpoint when it was built."""
    family = load_config(path).model.family
    if family != model.cfg.family:  # (before its weights are loaded)
        if family == "clip":
            raise ConfigError(f"{path} is a CLIPModel directory; start from it with `openalign train --init {path}`, "
                              "which takes its towers, processor and tokenizer")
        if family == "openalign":
            raise ConfigError(f"{path} is not a CLIPModel directory, which model.family=clip starts from")
        raise ConfigError(f"{path} is a {MODEL_TYPES[family]} directory; openalign fine-tunes AlignModel, "
                          "VisionTextDualEncoderModel and CLIPModel directories")
    if family != "openalign":
        return
    source, _, _ = load_pretrained(path)
    try:
        model.load_state_dict(source.state_dict(), strict=False)
    except RuntimeError as err:
        raise ConfigError(f"{path} does not match the configured towers ({str(err).splitlines()[1].strip()})"
                          ) from None
    # T as the source used it, into whichever parameter this model learns (raw T or log(1/T)); a fixed T stays fixed
    model.set_temperature(model.temperature_settings.fixed or float(source.temperature.detach()))


def describe(model: DualEncoder) -> dict:
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return {
        "vision_params": count(model.vision_tower),
        "text_params": count(model.text_tower),
        "embed_dim": model.cfg.embed_dim,
        "temperature": model.temperature.item(),
    }
