"""One typed, frozen config tree, dotted overrides and (de)serialization.

Presets (presets.py) build a `Config`; the command line applies `key=value` overrides with
`override()`; the resolved tree is written as JSON into every run directory and checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from typing import Literal
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A user-facing configuration mistake (bad key, bad value); the CLI prints it as one line."""


def parse_size(text: str | int, flag: str = "a size") -> int:
    """Every memory and size flag's one spelling: '4G', '4g', '4GB', '512M', '1.5GiB', '1000000' -> bytes (K, M, G
    and T are powers of 1024 whatever the case or a trailing B); '' or 0 -> 0 (no limit). Each engine is handed its
    own spelling of the result (`spark_size`, `duckdb_size`)."""
    import re

    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text or "0", re.IGNORECASE)
    if not match:
        raise ConfigError(f"{flag} {text!r} is not a size; write e.g. 4G, 512M or a number of bytes")
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))


def format_size(size: int) -> str:
    """A size as `parse_size` reads it back: 4G, 512M, 1.5G, 1000 (bytes)."""
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return str(size)


def spark_size(size: int) -> str:
    """Spark's spelling of a size (a JVM memory setting): whole mebibytes, `4096m`."""
    return f"{max(1, size // 2**20)}m"


def duckdb_size(size: int) -> str:
    """DuckDB's spelling of a size: whole mebibytes, `4096MiB` (DuckDB's `GB` is 10^9 bytes: never written)."""
    return f"{max(1, size // 2**20)}MiB"


@dataclass(frozen=True)
class VisionConfig:
    # efficientnet: the paper's tower (transformers' AlignVisionModel), saved as an AlignModel directory;
    # vit: a Vision Transformer (transformers' CLIP vision model: patch embedding, a CLS token, learned
    # position embeddings, pre-norm blocks), saved as a VisionTextDualEncoderModel directory
    kind: Literal["efficientnet", "vit"] = "efficientnet"
    # EfficientNet scaling (Tan & Le 2019): B1 (1.0, 1.1) ... B7 (2.0, 3.1), L2 (4.3, 5.3).
    width_coefficient: float = 2.0
    depth_coefficient: float = 3.1
    # Per-stage layout of the EfficientNet base network; the demo shrinks these.
    in_channels: tuple[int, ...] = (32, 16, 24, 40, 80, 112, 192)
    out_channels: tuple[int, ...] = (16, 24, 40, 80, 112, 192, 320)
    num_block_repeats: tuple[int, ...] = (1, 2, 2, 3, 3, 4, 1)
    kernel_sizes: tuple[int, ...] = (3, 3, 5, 3, 5, 5, 3)
    strides: tuple[int, ...] = (1, 2, 2, 2, 1, 2, 1)
    expand_ratios: tuple[int, ...] = (1, 6, 6, 6, 6, 6, 6)
    drop_connect_rate: float = 0.2
    # PyTorch's sense: weight of the *new* batch (TF's 0.99 == PyTorch's 0.01). transformers'
    # default of 0.99 would make the running statistics equal the last batch.
    batch_norm_momentum: float = 0.01
    batch_norm_eps: float = 1e-3
    resize_size: int = 346  # paper: resize to 346x346
    image_size: int = 289  # paper: random crop 289 (train), center crop 289 (eval)
    # The pixel values the tower expects, as transformers' EfficientNetImageProcessor makes them from 0..255:
    # p * pixel_scale + pixel_offset, then (x - pixel_mean) / pixel_std when a mean is given. openalign's
    # own models (and kakaobrain/align-base) use p / 127.5 - 1, i.e. [-1, 1]; a foreign checkpoint's
    # preprocessor_config.json sets these (model/hub.py).
    pixel_scale: float = 1 / 127.5
    pixel_offset: float = -1.0
    pixel_mean: tuple[float, ...] = ()
    pixel_std: tuple[float, ...] = ()
    # ViT sizes (kind=vit only; CLIP's ViT-B/16 here). Evaluated at another image_size than trained, the
    # position embeddings are interpolated bicubically to the new grid of patches (CLIP's and timm's way).
    patch_size: int = 16
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    pool: Literal["cls", "mean"] = "cls"  # the image's feature: the CLS token, or the mean of the patch tokens
    # How a transparent image becomes RGB: white (openalign's rule everywhere: composited on white, as shards store
    # it) or drop (transformers' processors' convert("RGB"): the colour under each pixel, alpha ignored), which a
    # foreign checkpoint gets, as its own processor would give it.
    alpha: Literal["white", "drop"] = "white"


@dataclass(frozen=True)
class TextConfig:
    # BERT sizes (Turc et al. 2019): Mini 4x256, Medium 8x512, Base 12x768, Large 24x1024.
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    dropout: float = 0.1
    vocab_size: int = 100_000  # paper: 100k English, 250k multilingual
    max_length: int = 64  # paper: 64 tokens
    # Encode a batch as this many groups of similar length, each padded only to its own longest text
    # (the [CLS] output does not depend on masked padding, so results are the same up to rounding).
    # Alt-texts are short with a long tail: one padding length per batch wastes most of the compute.
    length_buckets: int = 1


@dataclass(frozen=True)
class ModelConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    embed_dim: int = 640  # B7 pools to 640, L2 to 1376; other towers get a linear layer
    init_from: str = ""  # a model directory (AlignModel, or VisionTextDualEncoderModel for a ViT) to initialize from
    channels_last: bool = True  # depthwise convs are ~7x faster in channels_last on CPU


@dataclass(frozen=True)
class TemperatureConfig:
    """The learned scale of the logits, in one place: the model creates it, the loss clamps it, the optimizer
    gives it its own learning rate (DualEncoder.scale_parameters)."""

    init: float = 1.0  # paper: 1.0 (CLIP: 0.07)
    fixed: float = 0.0  # > 0: not learned, held at this value (Table 8: 1/128, 1/64, 1/32)
    min: float = 1e-3  # floor: logits stay finite, the loss cannot diverge
    # Multiplier on its learning rate. The paper's 1.0 init moves by ~lr per step under LAMB (trust ratio
    # x |t|), far too slowly for runs of a few hundred steps.
    lr_scale: float = 1.0
    sigmoid_bias_init: float = -10.0  # SigLIP's learned bias (loss.kind=sigmoid), in the same group


@dataclass(frozen=True)
class LossConfig:
    # softmax: the paper's normalized softmax; sigmoid: SigLIP; filip: the softmax loss plus the same loss over
    # late-interaction scores (FILIP's token-wise max similarity of patch and token vectors), so that the pooled
    # embeddings a two-stage search shortlists with are trained too; memory O(B_local x B x patches x tokens)
    kind: Literal["softmax", "sigmoid", "filip"] = "softmax"
    label_smoothing: float = 0.1
    negatives_fraction: float = 1.0  # Table 8: 100/50/25% of in-batch negatives
    # naive: materialized logits; chunked: O(B x chunk) memory; auto: chunked from 4,096 pairs
    implementation: Literal["auto", "naive", "chunked"] = "auto"
    # softmax terms summed: both (the paper), image_to_text (the rows of img @ txt.T: each image picks its
    # caption) or text_to_image (the columns) alone: the one-direction ablation of the PMI view
    direction: Literal["both", "image_to_text", "text_to_image"] = "both"
    temperature: TemperatureConfig = field(default_factory=TemperatureConfig)


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["lamb", "adamw"] = "lamb"
    lr: float = 1e-3
    weight_decay: float = 1e-5  # not on biases, norms or the temperature
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    warmup_steps: int = 10_000
    grad_clip: float = 0.0  # 0: off


@dataclass(frozen=True)
class DataConfig:
    train: str = ""  # webdataset shards: a directory, a brace pattern or a list file
    eval: str = ""  # held-out shards for periodic and final evaluation
    corpus: str = ""  # built-in corpus to build into data_dir when `train` is empty (emoji)
    # options of the built-in corpus's builder, e.g. data.corpus_options=noise=0.5,languages=en+de+fr; a corpus built
    # with options lives in data_dir/<corpus>-<options>, so variants of one corpus sit side by side
    corpus_options: tuple[str, ...] = ()
    data_dir: str = "data"
    # train on this share of the training samples (0 < f <= 1): a fixed subset chosen by a hash of each sample's
    # key, the same for every seed and nested across fractions (the paper's Table 9 "10% of ALIGN data")
    fraction: float = 1.0
    # train on the original shards (e.g. img2dataset's), reading only the pairs these keep-list directories keep
    # (filter, dedup, screen outputs; intersected), instead of rewriting the corpus with `openalign shard`
    keep: tuple[str, ...] = ()
    batch_size: int = 16_384  # global; paper: 16 pairs per core x 1024 cores
    workers: int = 1
    shuffle_buffer: int = 2_000
    tokenizer: str = ""  # a trained tokenizer directory; empty: train one on the training texts
    # `train`/`eval` may also be a Karpathy-split JSON (dataset_flickr30k.json): its images (under `images`)
    # are sharded once into data_dir/karpathy/, every caption of an image kept
    images: str = ""
    train_splits: tuple[str, ...] = ("train", "restval")  # Karpathy splits trained on (COCO's 113K = both)
    eval_split: str = "test"


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1_200_000  # paper: 1.2M steps
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    checkpoint_every: int = 1_000
    threads: int = 0  # torch intra-op threads; 0: all cores (measured: no slower than leaving one to the workers)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU; logits, loss fp32
    micro_batch: int = 0  # > 0 and below the per-device batch: gradient caching in micro-batches of this size
    grad_checkpointing: bool = False  # recompute tower activations in backward (transformers' checkpointing)
    shard_optimizer: bool = False  # under torchrun: ZeRO-1, each rank keeps 1/world of LAMB's state (exact LAMB)
    fsdp: bool = False  # under torchrun: FSDP2, parameters, gradients and LAMB's state sharded over ranks
    device: str = "auto"


@dataclass(frozen=True)
class EvalConfig:
    batch_size: int = 256
    # tasks of the periodic and final evaluation on the held-out split: retrieval, zeroshot, multilingual (texts
    # per language: data.corpus_options=eval_languages=...), arithmetic (emoji), compositional (shapes)
    tasks: tuple[str, ...] = ("retrieval", "zeroshot")
    templates: tuple[str, ...] = ("{}", "an emoji of {}", "a picture of {}", "an icon of {}", "{} emoji")


@dataclass(frozen=True)
class Config:
    preset: str = ""
    seed: int = 0
    out: str = "runs/demo"
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning the image tower with a classification head (`openalign eval --task finetune|vtab --ft k=v`)."""

    steps: int = 500
    batch_size: int = 64
    lr: float = 0.01  # backbone peak learning rate (SGD with momentum)
    head_lr_scale: float = 10.0  # the head's lr is this times the backbone's (paper: 10)
    momentum: float = 0.9
    weight_decay: float = 0.0
    warmup_fraction: float = 0.1  # linear warmup over this fraction of the steps, then linear decay to 0
    freeze_bn: bool = False  # keep BatchNorm running statistics fixed (paper: for small datasets)


@dataclass(frozen=True)
class FilterConfig:
    """ALIGN's frequency filters (paper section 3); a pair is kept only if no rule fires.

    Rules are counted on the raw pair table, before any other rule, as the paper describes."""

    min_short_side: int = 200  # image: keep only if the shorter side is > this many pixels
    max_aspect: float = 3.0  # image: keep only if long side / short side < this
    max_texts_per_image: int = 1000  # image: drop images with more distinct alt-texts than this
    max_images_per_text: int = 10  # text: drop alt-texts shared by more distinct images than this
    min_words: int = 3  # text: keep only texts with min_words..max_words unigrams
    max_words: int = 20
    vocab_size: int = 100_000_000  # text: drop texts with a unigram/bigram outside the K most frequent
    vocab_ngrams: int = 2  # 2: unigrams and bigrams are both checked (paper); 1: unigrams only
    lowercase: bool = True  # count words case-insensitively
    examples: int = 3  # example texts per rule in the report


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


MOVED = {  # old dotted key -> where it lives now (configs saved before, and overrides written for them, still work)
    "model.temperature_init": "loss.temperature.init", "loss.fixed_temperature": "loss.temperature.fixed",
    "loss.temperature_min": "loss.temperature.min", "optim.temperature_lr_scale": "loss.temperature.lr_scale",
    "loss.sigmoid_bias_init": "loss.temperature.sigmoid_bias_init",
}


def _moved(data: dict) -> dict:
    """A saved Config dict with the keys of MOVED at their new places."""
    data = json.loads(json.dumps(data))
    for old, new in MOVED.items():
        *path, name = old.split(".")
        node = data
        for part in path:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict) and name in node:
            value = node.pop(name)
            *where, leaf = new.split(".")
            target = data
            for part in where:
                target = target.setdefault(part, {})
            target[leaf] = value
    return data


def from_dict(cls, data: dict):
    """Rebuild a config dataclass from `to_dict` output; unknown keys are an error."""
    if cls is Config:
        data = _moved(data)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown config keys {sorted(unknown)} for {cls.__name__}")
    kwargs = {}
    for name, value in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            kwargs[name] = from_dict(kind, value)
        elif typing.get_origin(kind) is tuple:
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def save(cfg: Config, path: Path) -> None:
    Path(path).write_text(json.dumps(to_dict(cfg), indent=2) + "\n")


def load(path: Path) -> Config:
    return from_dict(Config, json.loads(Path(path).read_text()))


def leaf_keys(cls, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        kind = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(kind):
            keys += leaf_keys(kind, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _parse(text: str, kind, key: str):
    if typing.get_origin(kind) is Literal:
        return text  # `check` names the choices, with every other problem of the config
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind in (int, float):
            return kind(float(text)) if kind is int and "e" in text.lower() else kind(text)
        if kind is str:
            return text
        if typing.get_origin(kind) is tuple:
            items = [s for s in text.strip("()[] ").split(",") if s.strip()]
            args = typing.get_args(kind)
            item_kind = args[0]
            return tuple(_parse(s.strip(), item_kind, key) for s in items)
    except ValueError:
        pass
    raise ConfigError(f"{key}={text!r} is not a valid {getattr(kind, '__name__', kind)}")


def override(cfg, assignments: list[str], help_hint: str = "see `openalign train --show-config`"):
    """Apply dotted `key=value` overrides to any config dataclass, e.g. `optim.lr=5e-4 model.vision.image_size=64`."""
    valid = leaf_keys(type(cfg))
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. optim.lr=5e-4)")
        key = key.strip()
        key = MOVED.get(key, key) if isinstance(cfg, Config) else key
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f"; {help_hint}"
            raise ConfigError(f"unknown config key {key!r}{hint}")
        cfg = _replace(cfg, key.split("."), text, key)
    return cfg


def _replace(node, path: list[str], text: str, key: str):
    name = path[0]
    if len(path) == 1:
        kind = typing.get_type_hints(type(node))[name]
        return dataclasses.replace(node, **{name: _parse(text, kind, key)})
    return dataclasses.replace(node, **{name: _replace(getattr(node, name), path[1:], text, key)})


# ---------------------------------------------------------------------------------------------- validation
# Every rule a resolved config must satisfy, checked once (`check`) before any work: a bad value is a
# sentence naming the key, never a hang (data.batch_size=-1), a ZeroDivisionError or a run that trains NaN.

def _positive(x) -> bool:
    return x > 0


def _non_negative(x) -> bool:
    return x >= 0


def _fraction_open_closed(x) -> bool:  # (0, 1]
    return 0 < x <= 1


def _fraction_closed_open(x) -> bool:  # [0, 1)
    return 0 <= x < 1


def _all(rule):
    return lambda xs: len(xs) > 0 and all(rule(x) for x in xs)


RULES: dict[str, tuple] = {  # key (leaf of any config tree below) -> (predicate, what the value must be)
    "width_coefficient": (_positive, "a positive number"),
    "depth_coefficient": (_positive, "a positive number"),
    "in_channels": (_all(_positive), "positive integers"),
    "out_channels": (_all(_positive), "positive integers"),
    "num_block_repeats": (_all(_positive), "positive integers"),
    "kernel_sizes": (_all(_positive), "positive integers"),
    "strides": (_all(_positive), "positive integers"),
    "expand_ratios": (_all(_positive), "positive integers"),
    "drop_connect_rate": (_fraction_closed_open, "in [0, 1)"),
    "batch_norm_momentum": (_fraction_open_closed, "in (0, 1] (PyTorch's sense: the new batch's weight)"),
    "batch_norm_eps": (_positive, "a positive number"),
    "pixel_scale": (_positive, "a positive number"),
    "pixel_std": (lambda xs: all(x > 0 for x in xs), "positive numbers"),
    "resize_size": (_positive, "a positive integer"),
    "image_size": (_positive, "a positive integer"),
    "patch_size": (_positive, "a positive integer"),
    "hidden_size": (_positive, "a positive integer"),
    "num_layers": (_positive, "a positive integer"),
    "num_heads": (_positive, "a positive integer"),
    "intermediate_size": (_positive, "a positive integer"),
    "dropout": (_fraction_closed_open, "in [0, 1)"),
    "vocab_size": (_positive, "a positive integer"),
    "max_length": (lambda x: x >= 3, "at least 3 ([CLS], a token, [SEP])"),
    "length_buckets": (_positive, "a positive integer"),
    "embed_dim": (_positive, "a positive integer"),
    "label_smoothing": (_fraction_closed_open, "in [0, 1)"),
    "negatives_fraction": (_fraction_open_closed, "in (0, 1]"),
    "loss.temperature.init": (_positive, "a positive number"),
    "loss.temperature.fixed": (_non_negative, "0 (learned) or a positive number"),
    "loss.temperature.min": (_positive, "a positive number"),
    "loss.temperature.lr_scale": (_non_negative, "0 or more"),
    "lr": (_positive, "a positive number"),
    "weight_decay": (_non_negative, "0 or more"),
    "betas": (lambda b: len(b) == 2 and all(0 <= x < 1 for x in b), "two numbers in [0, 1)"),
    "eps": (_positive, "a positive number"),
    "warmup_steps": (_non_negative, "0 or more"),
    "grad_clip": (_non_negative, "0 (off) or more"),
    "fraction": (_fraction_open_closed, "the share of the training samples to use, in (0, 1]"),
    "batch_size": (_positive, "a positive integer"),
    "workers": (_non_negative, "0 (read in the main process) or more"),
    "shuffle_buffer": (_positive, "a positive integer"),
    "steps": (_positive, "a positive integer"),
    "log_every": (_positive, "a positive integer"),
    "eval_every": (_non_negative, "0 (only at the end) or more"),
    "checkpoint_every": (_non_negative, "0 (only at the end) or more"),
    "threads": (_non_negative, "0 (all cores) or more"),
    "precision": (lambda x: x in ("auto", "fp32", "bf16"), "auto, fp32 or bf16"),
    "micro_batch": (_non_negative, "0 (off) or a positive integer"),
    "device": (lambda x: x in ("auto", "cpu", "cuda", "mps") or (x.startswith("cuda:") and x[5:].isdigit()),
               "auto, cpu, cuda, cuda:N or mps"),
    # FinetuneConfig
    "head_lr_scale": (_non_negative, "0 or more"),
    "momentum": (_fraction_closed_open, "in [0, 1)"),
    "warmup_fraction": (lambda x: 0 <= x <= 1, "in [0, 1]"),
    # FilterConfig
    "min_short_side": (_non_negative, "0 or more pixels"),
    "max_aspect": (lambda x: x >= 1, "at least 1"),
    "max_texts_per_image": (_positive, "a positive integer"),
    "max_images_per_text": (_positive, "a positive integer"),
    "min_words": (_non_negative, "0 or more"),
    "max_words": (_positive, "a positive integer"),
    "vocab_ngrams": (lambda x: x in (1, 2), "1 or 2"),
    "examples": (_non_negative, "0 or more"),
}


def _leaves(node, prefix: str = ""):
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f.name, value


def violations(cfg, world: int = 1) -> list[str]:
    """Every rule `cfg` (a Config, FinetuneConfig or FilterConfig) breaks, as `key=value must be ...` phrases."""
    problems = []
    for key, name, value in _leaves(cfg):
        numbers = value if isinstance(value, tuple) else (value,)
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            problems.append(f"{key}={value} must be a finite number")
            continue
        rule_key = key if key in RULES else name
        if rule_key in RULES:
            rule, what = RULES[rule_key]
            try:
                ok = rule(value)
            except TypeError:
                ok = False
            if not ok:
                problems.append(f"{key}={value} must be {what}")
    problems += _literal_problems(cfg)
    if isinstance(cfg, Config):
        problems += _cross_field(cfg, world)
    elif isinstance(cfg, FilterConfig) and cfg.min_words > cfg.max_words:
        problems.append(f"min_words={cfg.min_words} must not exceed max_words={cfg.max_words}")
    return problems


def _literal_problems(node, prefix: str = "") -> list[str]:
    """`key=value must be a, b or c` for every Literal-typed field whose value is not one of its choices."""
    problems = []
    for name, kind in typing.get_type_hints(type(node)).items():
        value = getattr(node, name)
        if dataclasses.is_dataclass(value):
            problems += _literal_problems(value, f"{prefix}{name}.")
        elif typing.get_origin(kind) is Literal and value not in typing.get_args(kind):
            *rest, last = typing.get_args(kind)
            problems.append(f"{prefix}{name}={value} must be {', '.join(rest)} or {last}")
    return problems


def _cross_field(cfg: Config, world: int) -> list[str]:
    problems = []
    v, t = cfg.model.vision, cfg.model.text
    stages = {len(getattr(v, f)) for f in ("in_channels", "out_channels", "num_block_repeats", "kernel_sizes",
                                           "strides", "expand_ratios")}
    if len(stages) > 1:
        problems.append("model.vision's per-stage tuples (in_channels ... expand_ratios) must have one entry per stage")
    if v.image_size > v.resize_size > 0:
        problems.append(f"model.vision.image_size={v.image_size} (the crop) must not exceed model.vision.resize_size="
                        f"{v.resize_size}")
    if len(v.pixel_mean) not in (0, 3) or len(v.pixel_std) != len(v.pixel_mean):
        problems.append("model.vision.pixel_mean and pixel_std must both be empty or both give 3 channels")
    if v.kind == "vit":
        if v.patch_size > 0 and v.image_size % v.patch_size:
            problems.append(f"model.vision.image_size={v.image_size} must divide by model.vision.patch_size="
                            f"{v.patch_size} (a whole grid of patches)")
        if v.num_heads > 0 and v.hidden_size % v.num_heads:
            problems.append(f"model.vision.hidden_size={v.hidden_size} must divide by model.vision.num_heads="
                            f"{v.num_heads}")
    if t.num_heads > 0 and t.hidden_size % t.num_heads:
        problems.append(f"model.text.hidden_size={t.hidden_size} must divide by model.text.num_heads={t.num_heads}")
    batch = cfg.data.batch_size
    if batch > 0 and batch % world:
        problems.append(f"data.batch_size={batch} is the global batch; it must divide by the {world} processes")
    per_rank = batch // world if batch > 0 else 0
    if cfg.train.micro_batch > 0 and per_rank and per_rank % cfg.train.micro_batch:
        problems.append(f"train.micro_batch={cfg.train.micro_batch} must divide each process's batch of {per_rank}")
    smallest = cfg.train.micro_batch or per_rank
    if v.kind == "efficientnet" and 0 < smallest < 2:  # BatchNorm's batch statistics need two images
        problems.append(f"{'train.micro_batch' if cfg.train.micro_batch else 'data.batch_size'}={smallest} gives each "
                        "forward pass one image, and EfficientNet's BatchNorm needs at least 2 to train; use 2 or more")
    if cfg.train.fsdp and cfg.train.shard_optimizer:
        problems.append("train.fsdp=true already shards the optimizer state; leave train.shard_optimizer off")
    for option in ("shard_optimizer", "fsdp"):
        if getattr(cfg.train, option) and world == 1:
            problems.append(f"train.{option}=true shards over torchrun processes; launch with torchrun")
    if world > 1 and cfg.loss.kind == "sigmoid":
        problems.append("loss.kind=sigmoid runs in one process; use the softmax loss with torchrun")
    if cfg.loss.kind == "filip" and cfg.train.micro_batch:
        problems.append("loss.kind=filip does not run with train.micro_batch (gradient caching keeps pooled embeddings, "
                        "not token vectors); set train.micro_batch=0")
    if cfg.loss.kind == "filip" and cfg.loss.negatives_fraction < 1.0:
        problems.append("loss.negatives_fraction < 1 (the Table 8 ablation) is for the pooled softmax loss")
    if cfg.loss.kind == "sigmoid" and cfg.loss.direction != "both":
        problems.append(f"loss.direction={cfg.loss.direction} applies to the softmax loss; the sigmoid loss has no "
                        "direction")
    if world > 1 and cfg.loss.negatives_fraction < 1.0:
        problems.append("loss.negatives_fraction < 1 (the Table 8 ablation) runs in one process")
    if cfg.loss.kind == "sigmoid" and cfg.loss.label_smoothing > 0:  # it would be ignored without a word
        problems.append(f"loss.label_smoothing={cfg.loss.label_smoothing} smooths the softmax's targets; the sigmoid "
                        "loss scores each pair on its own: set loss.label_smoothing=0 with loss.kind=sigmoid")
    if cfg.loss.kind == "sigmoid" and cfg.loss.negatives_fraction < 1.0:
        problems.append("loss.negatives_fraction < 1 (the Table 8 ablation) is for the softmax loss; the sigmoid loss "
                        "uses every pair")
    t = cfg.loss.temperature
    if t.fixed and t.fixed < t.min:
        problems.append(f"loss.temperature.fixed={t.fixed} is below loss.temperature.min={t.min}")
    return problems


def check(cfg, world: int = 1) -> None:
    """Raise one ConfigError listing every violation (see RULES, the Literal kinds and the rules across
    fields and processes), or return: run once, when a config is resolved, never in a hot path."""
    problems = violations(cfg, world)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} config values are invalid: " + "; ".join(problems))
