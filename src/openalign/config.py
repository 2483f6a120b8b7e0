"""One typed, frozen config tree, dotted overrides and (de)serialization.

Presets (presets.py) build a `Config`; the command line applies `key=value` overrides with
`override()`; the resolved tree is written as JSON into every run directory and checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, cast
from collections.abc import Callable
from pathlib import Path

__all__ = ["at_least", "check", "Config", "ConfigError", "DataConfig", "EvalConfig", "leaf_keys", "load", "LossConfig",
           "ModelConfig", "NON_NEGATIVE", "non_negative", "OptimConfig", "override", "POSITIVE", "POSITIVE_INT",
           "POSITIVE_INTS", "Rule", "TemperatureConfig", "TextConfig", "to_dict", "TrainConfig", "VisionConfig"]


class ConfigError(ValueError):
    """A user-facing configuration mistake (bad key, bad value); the CLI prints it as one line."""


# ---------------------------------------------------------------------------------------------- rules
# A field's rule is declared on the field, `lr: Annotated[float, POSITIVE] = 1e-3`, so it belongs to that class alone
# (a FinetuneConfig's `steps` and a TrainConfig's `steps` each carry their own). `check` applies every rule of a
# resolved config, with the Literal choices and the rules across fields, and names every violation in one sentence:
# a bad value is a sentence naming the key, never a hang (data.global_batch=-1), a ZeroDivisionError or a run that
# trains NaN. Any options dataclass can use them (data/engine.py, index/build.py, eval/options.py).


@dataclass(frozen=True)
class Rule:
    """A predicate on one field's value and what the value must be, for the sentence when it fails."""

    test: Callable[[typing.Any], bool]
    what: str
    also: tuple[type, ...] = ()  # types the field takes besides its annotation's (a size: an int of bytes too)


POSITIVE = Rule(lambda x: x > 0, "a positive number")
POSITIVE_INT = Rule(lambda x: x > 0, "a positive integer")
POSITIVE_INTS = Rule(lambda xs: len(xs) > 0 and all(x > 0 for x in xs), "positive integers")
NON_NEGATIVE = Rule(lambda x: x >= 0, "0 or more")
FRACTION_OPEN_CLOSED = Rule(lambda x: 0 < x <= 1, "in (0, 1]")
FRACTION_CLOSED_OPEN = Rule(lambda x: 0 <= x < 1, "in [0, 1)")
TEMPLATES = Rule(lambda xs: all(x.count("{") == x.count("}") == x.count("{}") == 1 for x in xs),
                 "templates with one {} each and no other braces, e.g. '{},a picture of {}.'")
DEVICE = Rule(lambda x: x in ("auto", "cpu", "cuda", "mps") or (x.startswith("cuda:") and x[5:].isdigit()),
              "auto, cpu, cuda, cuda:N or mps")


def at_least(low, what: str = "") -> Rule:
    return Rule(lambda x: x >= low, what or f"at least {low}")


def non_negative(what: str) -> Rule:
    """0 or more, with what 0 means: `non_negative("0 (off) or more")`."""
    return Rule(lambda x: x >= 0, what)


@dataclass(frozen=True)
class VisionConfig:
    # efficientnet: the paper's tower (transformers' AlignVisionModel), saved as an AlignModel directory;
    # vit: a Vision Transformer (transformers' CLIP vision model: patch embedding, a CLS token, learned
    # position embeddings, pre-norm blocks), saved as a VisionTextDualEncoderModel directory
    kind: Literal["efficientnet", "vit"] = "efficientnet"
    # EfficientNet scaling (Tan & Le 2019): B1 (1.0, 1.1) ... B7 (2.0, 3.1), L2 (4.3, 5.3).
    width_coefficient: Annotated[float, POSITIVE] = 2.0
    depth_coefficient: Annotated[float, POSITIVE] = 3.1
    # Per-stage layout of the EfficientNet base network; the demo shrinks these.
    in_channels: Annotated[tuple[int, ...], POSITIVE_INTS] = (32, 16, 24, 40, 80, 112, 192)
    out_channels: Annotated[tuple[int, ...], POSITIVE_INTS] = (16, 24, 40, 80, 112, 192, 320)
    num_block_repeats: Annotated[tuple[int, ...], POSITIVE_INTS] = (1, 2, 2, 3, 3, 4, 1)
    kernel_sizes: Annotated[tuple[int, ...], POSITIVE_INTS] = (3, 3, 5, 3, 5, 5, 3)
    strides: Annotated[tuple[int, ...], POSITIVE_INTS] = (1, 2, 2, 2, 1, 2, 1)
    expand_ratios: Annotated[tuple[int, ...], POSITIVE_INTS] = (1, 6, 6, 6, 6, 6, 6)
    drop_connect_rate: Annotated[float, FRACTION_CLOSED_OPEN] = 0.2
    # PyTorch's sense: weight of the *new* batch (TF's 0.99 == PyTorch's 0.01). transformers'
    # default of 0.99 would make the running statistics equal the last batch.
    batch_norm_momentum: Annotated[float, Rule(FRACTION_OPEN_CLOSED.test, "in (0, 1] (PyTorch's sense: the "
                                                    "new batch's weight)")] = 0.01
    batch_norm_eps: Annotated[float, POSITIVE] = 1e-3
    resize_size: Annotated[int, POSITIVE_INT] = 346  # paper: resize to 346x346
    image_size: Annotated[int, POSITIVE_INT] = 289  # paper: random crop 289 (train), center crop 289 (eval)
    # How evaluation resizes before the center crop: to a square of resize_size (openalign's, ALIGN's and SigLIP's
    # processors), or the shortest side to resize_size keeping the aspect ratio (CLIP's processor); and with which
    # filter (openalign trains bilinear; CLIP's and SigLIP's processors are bicubic). A checkpoint's processor
    # files set both (model/hub.py).
    resize_mode: Literal["square", "shortest_edge", "naflex"] = "square"
    # naflex (Siglip2Model's processor): no crop; the image resized, aspect kept, to the largest whole grid of
    # patch_size patches that holds at most max_num_patches, sent as that many patches (the rest padding, masked)
    max_num_patches: Annotated[int, NON_NEGATIVE] = 0
    resample: Literal["nearest", "lanczos", "bilinear", "bicubic", "box", "hamming"] = "bilinear"  # Pillow's filters
    # the centre crop's corner at half the margin rounded down (transformers' center_crop), or to the nearest pixel,
    # halves to even (torchvision's CenterCrop: OpenCLIP's checkpoints, model/openclip.py)
    crop_round: Literal["down", "nearest"] = "down"
    # The pixel values the tower expects, as transformers' EfficientNetImageProcessor makes them from 0..255:
    # p * pixel_scale + pixel_offset, then (x - pixel_mean) / pixel_std when a mean is given. openalign's
    # own models (and kakaobrain/align-base) use p / 127.5 - 1, i.e. [-1, 1]; a foreign checkpoint's
    # preprocessor_config.json sets these (model/hub.py).
    pixel_scale: Annotated[float, POSITIVE] = 1 / 127.5
    pixel_offset: float = -1.0
    pixel_mean: tuple[float, ...] = ()
    pixel_std: Annotated[tuple[float, ...], Rule(lambda xs: all(x > 0 for x in xs), "positive numbers")] = ()
    # ViT sizes (kind=vit only; CLIP's ViT-B/16 here). Evaluated at another image_size than trained, the
    # position embeddings are interpolated bicubically to the new grid of patches (CLIP's and timm's way).
    patch_size: Annotated[int, POSITIVE_INT] = 16
    hidden_size: Annotated[int, POSITIVE_INT] = 768
    num_layers: Annotated[int, POSITIVE_INT] = 12
    num_heads: Annotated[int, POSITIVE_INT] = 12
    intermediate_size: Annotated[int, POSITIVE_INT] = 3072
    pool: Literal["cls", "mean"] = "cls"  # the image's feature: the CLS token, or the mean of the patch tokens
    # How a transparent image becomes RGB: white (openalign's rule everywhere: composited on white, as shards store
    # it) or drop (transformers' processors' convert("RGB"): the colour under each pixel, alpha ignored), which a
    # foreign checkpoint gets, as its own processor would give it.
    alpha: Literal["white", "drop"] = "white"


@dataclass(frozen=True)
class TextConfig:
    # BERT sizes (Turc et al. 2019): Mini 4x256, Medium 8x512, Base 12x768, Large 24x1024.
    hidden_size: Annotated[int, POSITIVE_INT] = 768
    num_layers: Annotated[int, POSITIVE_INT] = 12
    num_heads: Annotated[int, POSITIVE_INT] = 12
    intermediate_size: Annotated[int, POSITIVE_INT] = 3072
    dropout: Annotated[float, FRACTION_CLOSED_OPEN] = 0.1
    vocab_size: Annotated[int, POSITIVE_INT] = 100_000  # paper: 100k English, 250k multilingual
    max_length: Annotated[int, at_least(3, "at least 3 ([CLS], a token, [SEP])")] = 64  # paper: 64 tokens
    # Encode a batch as this many groups of similar length, each padded only to its own longest text
    # (the [CLS] output does not depend on masked padding, so results are the same up to rounding).
    # Alt-texts are short with a long tail: one padding length per batch wastes most of the compute.
    length_buckets: Annotated[int, POSITIVE_INT] = 1
    # How texts are padded for encoding: to the longest of a batch (BERT and CLIP pool a token that padding cannot
    # reach), or every text to max_length (SigLIP pools the last position: it was trained, and is evaluated by
    # transformers' zero-shot pipeline, padded to 64, and padding=True gives other vectors).
    padding: Literal["longest", "max_length"] = "longest"


@dataclass(frozen=True)
class ModelConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    embed_dim: Annotated[int, POSITIVE_INT] = 640  # B7 pools to 640, L2 to 1376; other towers get a linear layer
    init_from: str = ""  # a model directory to start from: AlignModel, VisionTextDualEncoderModel (ViT), CLIPModel
    channels_last: bool = True  # depthwise convs are ~7x faster in channels_last on CPU
    # Whose towers: openalign's dual encoder (vision.kind), or a public checkpoint's as it ships (clip: CLIPModel,
    # siglip: SiglipModel, siglip2: Siglip2Model (NaFlex); model/families.py), which openalign evaluates, embeds and
    # serves; a CLIPModel also fine-tunes from init_from (model/dual_encoder.py CLIPDualEncoder).
    family: Literal["openalign", "clip", "siglip", "siglip2"] = "openalign"


@dataclass(frozen=True)
class TemperatureConfig:
    """The learned scale of the logits, in one place: the loss kind says how it starts and how it is learned, the
    model creates it, the loss floors it, the optimizer gives it its own learning rate (DualEncoder.learned_scalars)."""

    # the starting temperature T (logits = cosine / T); 0: the loss kind's own (softmax and filip: 1.0, the
    # paper's; sigmoid: 0.1, SigLIP's logit scale 10)
    init: Annotated[float, non_negative("0 (the loss kind's own) or a positive number")] = 0.0
    # what is learned: raw, T itself (the paper's divisor); log, log(1/T), the log of the logits' scale (CLIP's
    # logit_scale, SigLIP's t'); auto: the loss kind's own (softmax and filip: raw; sigmoid: log)
    parameterization: Literal["auto", "raw", "log"] = "auto"
    # > 0: the logits' scale 1/T is capped here (CLIP: 100), as T is floored at min; past either, T's gradient is 0
    max_scale: Annotated[float, non_negative("0 (no cap) or a positive number")] = 0.0
    fixed: Annotated[float, non_negative("0 (learned) or a positive number")] = 0.0  # > 0: not learned, held at this
                                                                                     # value (Table 8: 1/128, 1/64,
                                                                                     # 1/32)
    min: Annotated[float, POSITIVE] = 1e-3  # floor: logits stay finite, the loss cannot diverge
    # Multiplier on its learning rate. The paper's 1.0 init moves by ~lr per step under LAMB (trust ratio
    # x |t|), far too slowly for runs of a few hundred steps.
    lr_scale: Annotated[float, NON_NEGATIVE] = 1.0
    sigmoid_bias_init: float = -10.0  # SigLIP's learned bias (loss.kind=sigmoid), in the same group


# loss.kind -> its class (openalign/loss/): each loss module registers its kind as it is imported
# (`loss.base.register`). config.check asks a kind for its rules (`rules(cfg, world) -> list[str]`) and nothing else;
# config never imports a loss (it is below them).
LOSS_KINDS: dict[str, Any] = {}  # kind -> its Loss class (loss/base.py), registered by openalign/loss/


@dataclass(frozen=True)
class LossConfig:
    # softmax: the paper's normalized softmax; sigmoid: SigLIP; filip: the softmax loss plus the same loss over
    # late-interaction scores (FILIP's token-wise max similarity of patch and token vectors), so that the pooled
    # embeddings a two-stage search shortlists with are trained too; memory O(B_local x B x patches x tokens)
    # (the kinds are openalign/loss/'s modules, each registered in LOSS_KINDS)
    kind: str = "softmax"
    label_smoothing: Annotated[float, FRACTION_CLOSED_OPEN] = 0.1
    negatives_fraction: Annotated[float, FRACTION_OPEN_CLOSED] = 1.0  # Table 8: 100/50/25% of in-batch negatives
    # naive: materialized logits; chunked: O(B x chunk) memory; auto: chunked from 4,096 pairs
    implementation: Literal["auto", "naive", "chunked"] = "auto"
    # softmax terms summed: both (the paper), image_to_text (the rows of img @ txt.T: each image picks its
    # caption) or text_to_image (the columns) alone: the one-direction ablation of the PMI view
    direction: Literal["both", "image_to_text", "text_to_image"] = "both"
    # the sigmoid loss under torchrun: every rank's texts gathered at once, or passed around a ring of neighbours
    # (one block at a time, again in the backward); both exact; auto: ring, the faster measured here (docs/scale.md)
    exchange: Literal["auto", "gather", "ring"] = "auto"
    temperature: TemperatureConfig = field(default_factory=TemperatureConfig)


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["lamb", "adamw"] = "lamb"
    lr: Annotated[float, POSITIVE] = 1e-3
    weight_decay: Annotated[float, NON_NEGATIVE] = 1e-5  # not on biases, norms or the temperature
    betas: Annotated[tuple[float, float], Rule(lambda b: len(b) == 2 and all(0 <= x < 1 for x in b),
                                               "two numbers in [0, 1)")] = (0.9, 0.999)
    eps: Annotated[float, POSITIVE] = 1e-6
    warmup_steps: Annotated[int, NON_NEGATIVE] = 10_000
    grad_clip: Annotated[float, non_negative("0 (off) or more")] = 0.0  # 0: off


@dataclass(frozen=True)
class DataConfig:
    train: str = ""  # webdataset shards: a directory, a brace pattern or a list file
    eval: str = ""  # held-out shards for periodic and final evaluation
    # built-in corpus to build into data_dir when `train` is empty (emoji); several joined by + (emoji+openclipart):
    # trained on together, evaluated on the union of their held-out splits and on each one's (metrics NAME/...)
    corpus: str = ""
    # built-in corpora whose held-out splits evaluate the run (default: data.corpus's), e.g. a run trained on emoji
    # alone measured on emoji+openclipart+shapes as well; each one's metrics NAME/...
    eval_corpus: str = ""
    # options of the built-in corpus's builder, e.g. data.corpus_options=noise=0.5,languages=en+de+fr (several corpora:
    # NAME.noise=0.5); a corpus built with options lives in data_dir/<corpus>-<options>, so variants sit side by side
    corpus_options: tuple[str, ...] = ()
    data_dir: str = "data"
    # train on this share of the training samples (0 < f <= 1): a fixed subset chosen by a hash of each sample's
    # key, the same for every seed and nested across fractions (the paper's Table 9 "10% of ALIGN data")
    fraction: Annotated[float, Rule(FRACTION_OPEN_CLOSED.test, "the share of the training samples to use, in "
                                                                   "(0, 1]")] = 1.0
    # train on the original shards (e.g. img2dataset's), reading only the pairs these keep-list directories keep
    # (filter, dedup, screen outputs; intersected), instead of rewriting the corpus with `openalign shard`
    keep: tuple[str, ...] = ()
    # built-in corpora: leave out every training image within 4 bits (of a 64-bit perceptual hash) of a held-out
    # image of any corpus the run is evaluated on (the paper's test-set hygiene; corpora/heldout.py)
    dedup_heldout: bool = False
    global_batch: Annotated[int, POSITIVE_INT] = 16_384  # pairs per step over all processes; paper: 16 per core x 1024
        # cores (each process encodes global_batch / world: StreamSpec.rank_batch)
    workers: Annotated[int, non_negative("0 (read in the main process) or more")] = 1
    shuffle_buffer: Annotated[int, POSITIVE_INT] = 2_000
    # the training crop: the paper's (a square of model.vision.resize_size, a random image_size crop of it, a
    # horizontal flip half of the time) or Szegedy et al.'s random-resized crop (an area share uniform in
    # [crop_min_area, 1] and an aspect log-uniform in [3/4, 4/3] of that same square, resized to image_size, then
    # the flip); evaluation is the same centre crop after either
    crop: Literal["pretraining", "inception"] = "pretraining"
    crop_min_area: Annotated[float, FRACTION_OPEN_CLOSED] = 0.08  # data.crop=inception only (Szegedy et al.: 0.08)
    # each training text put in one of these, drawn at random a visit (`{}` keeps it as it is), as UniCL turns a
    # label into a caption; for sources whose texts are bare names (a category, a Unicode name) and models asked in
    # sentences. The tokenizer learns from the texts as training sees them. Empty (the paper's): the texts as they are
    text_templates: Annotated[tuple[str, ...], TEMPLATES] = ()
    tokenizer: str = ""  # a trained tokenizer directory; empty: train one on the training texts
    # `train`/`eval` may also be a Karpathy-split JSON (dataset_flickr30k.json): its images (under `images`)
    # are sharded once into data_dir/karpathy/, every caption of an image kept
    images: str = ""
    train_splits: tuple[str, ...] = ("train", "restval")  # Karpathy splits trained on (COCO's 113K = both)
    eval_split: str = "test"


@dataclass(frozen=True)
class TrainConfig:
    steps: Annotated[int, POSITIVE_INT] = 1_200_000  # paper: 1.2M steps
    log_every: Annotated[int, POSITIVE_INT] = 10
    eval_every: Annotated[int, non_negative("0 (only at the end) or more")] = 0  # 0: only at the end
    checkpoint_every: Annotated[int, non_negative("0 (only at the end) or more")] = 1_000
    threads: Annotated[int, non_negative("0 (all cores) or more")] = 0  # torch intra-op threads; 0: all cores
                                                                        # (measured: no slower than leaving one to the
                                                                        # workers)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU; logits, loss fp32
    micro_batch: Annotated[int, non_negative("0 (off) or a positive integer")] = 0  # > 0 and below the per-device
                                                                                    # batch: gradient caching in
                                                                                    # micro-batches of this size
    grad_checkpointing: bool = False  # recompute tower activations in backward (transformers' checkpointing)
    shard_optimizer: bool = False  # under torchrun: ZeRO-1, each rank keeps 1/world of LAMB's state (exact LAMB)
    fsdp: bool = False  # under torchrun: FSDP2, parameters, gradients and LAMB's state sharded over ranks
    device: Annotated[str, DEVICE] = "auto"
    deterministic: bool = False  # deterministic kernels only (torch.use_deterministic_algorithms): a resumed GPU
                                 # run then repeats an uninterrupted one's numbers, at some speed; the CPU step is
                                 # deterministic either way
    # dashboards the run's metrics.jsonl rows also go to: tensorboard (RUN/tensorboard), wandb (offline unless W&B
    # is configured); any subset, e.g. tensorboard,wandb (train/dashboards.py)
    report_to: Annotated[tuple[str, ...], Rule(lambda xs: all(x in ("tensorboard", "wandb") for x in xs),
                                               "tensorboard, wandb or both, comma-separated")] = ()


@dataclass(frozen=True)
class EvalConfig:
    encode_batch: Annotated[int, POSITIVE_INT] = 256  # images or texts encoded at once
    # tasks of the periodic and final evaluation on the held-out split: retrieval, zeroshot, knn (the split's classes
    # dealt alternately to train and test), multilingual (texts per language: data.corpus_options=eval_languages=...),
    # arithmetic (emoji), compositional (shapes); the studies of Tables 8-10 add knn
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


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(cls, data: dict):
    """Rebuild a config dataclass from `to_dict` output; unknown keys are an error."""
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


def flat(node, prefix: str = "") -> dict:
    """{dotted key: value} of every leaf of a config tree."""
    out: dict = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        out |= flat(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name: value}
    return out


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
    valid: list[str] = leaf_keys(type(cfg))
    tree: dict = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. optim.lr=5e-4)")
        key = key.strip()
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f"; {help_hint}"
            raise ConfigError(f"unknown config key {key!r}{hint}")
        node, *path = key.split(".")
        changes = tree
        for name in [node, *path][:-1]:
            changes = changes.setdefault(name, {})
        changes[[node, *path][-1]] = (text, key)
    return _replaced(cfg, tree)


def _replaced(node, changes: dict):
    """`node` with every change of its own and of the nodes below it, each node made once: an options class checks
    itself when it is made, so every wrong value of one node is named in one sentence."""
    kinds = typing.get_type_hints(type(node))
    values = {name: _replaced(getattr(node, name), change) if isinstance(change, dict)
              else _parse(change[0], kinds[name], change[1]) for name, change in changes.items()}
    return dataclasses.replace(node, **values) if values else node


# ---------------------------------------------------------------------------------------------- validation

def _spelled(prefix: str):
    return lambda name: prefix + name


def as_flags(rename: dict[str, str] | None = None) -> Callable[[str], str]:
    """A command's options named as its flags in `check`'s sentence: `--retries`, or `rename`'s flag."""
    return lambda name: (rename or {}).get(name, "--" + name.replace("_", "-"))


def violations(cfg, world: int = 1, spell: Callable[[str], str] | None = None) -> list[str]:
    """Every rule `cfg` (a Config or any options dataclass) breaks, as `key=value must be ...` phrases: each field's
    own Rule, finiteness, Literal choices, then the rules across fields (a Config's, or an options class's own
    `cross_field_problems()`). `spell` names a field for the user (default: its dotted key; a command's options
    pass e.g. `--retries`)."""
    problems = _field_problems(cfg, spell or _spelled(""))
    if problems:  # the rules across fields compare values of the right types only
        return problems
    if isinstance(cfg, Config):
        problems += _cross_field(cfg, world)
    elif callable(getattr(cfg, "cross_field_problems", None)):
        problems += cfg.cross_field_problems()
    return problems


def type_problem(value, kind) -> str | None:
    """What `value` must be when it is not of the annotation `kind` (bool, int, float, str, Path, a Literal, a
    tuple of one of them, `X | None`, a dataclass), else None: the types a field's annotation allows, checked
    the same on every options class. An int is a float; a bool is neither an int nor a float; a str is never a
    tuple of str (a tuple's elements would be its characters)."""
    base = typing.get_args(kind)[0] if typing.get_origin(kind) is Annotated else kind
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        found = [type_problem(value, a) for a in args if a is not type(None)]
        return None if any(f is None for f in found) else " or ".join(filter(None, found))
    if origin is Literal:
        return None  # the choices are checked with the rules
    if origin is tuple:
        element = args[0] if args else typing.Any
        if isinstance(value, (str, bytes)):
            return f"a tuple of {_type_name(element)}s, not one string (write ({value!r},))"
        if not isinstance(value, tuple):
            return f"a tuple of {_type_name(element)}s"
        wrong = [type_problem(v, element) for v in value]
        return next((f"a tuple of {_type_name(element)}s ({v!r} is not one)" for v, w in zip(value, wrong) if w),
                    None)
    if base is bool:
        return None if isinstance(value, bool) else "true or false"
    if base is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if base is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if base is str:
        return None if isinstance(value, str) else "text"
    if base is Path:
        return None if isinstance(value, (str, Path)) else "a path"
    if isinstance(base, type) and dataclasses.is_dataclass(base):
        return None if isinstance(value, base) else f"a {base.__name__}"
    return None  # dict, Any, ...: not checked here


def _type_name(kind) -> str:
    if typing.get_origin(kind) is Literal:
        return "choice"
    return {bool: "true or false", int: "integer", float: "number", str: "string", Path: "path"}.get(
        kind, getattr(kind, "__name__", str(kind)))


def _field_problems(node, spell: Callable[[str], str]) -> list[str]:
    problems = []
    hints = typing.get_type_hints(type(node), include_extras=True)
    for f in dataclasses.fields(node):
        value, kind, key = getattr(node, f.name), hints[f.name], spell(f.name)
        if dataclasses.is_dataclass(value):
            problems += _field_problems(value, _spelled(key + "."))
            continue
        rules = [m for m in getattr(kind, "__metadata__", ()) if isinstance(m, Rule)]
        wrong = type_problem(value, kind)
        if wrong is not None and not any(isinstance(value, t) and not isinstance(value, bool)
                                         for rule in rules for t in rule.also):
            problems.append(f"{key}={value!r} must be {wrong}")
            continue
        numbers = value if isinstance(value, tuple) else (value,)
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value  # as an override writes it
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            problems.append(f"{key}={shown} must be a finite number")
            continue
        base = typing.get_args(kind)[0] if typing.get_origin(kind) is Annotated else kind
        if typing.get_origin(base) is Literal and value not in typing.get_args(base):
            *rest, last = typing.get_args(base)
            problems.append(f"{key}={value} must be {', '.join(map(str, rest))} or {last}")
        for rule in rules:
            try:
                ok = rule.test(value)
            except TypeError:
                ok = False
            if not ok:
                problems.append(f"{key}={shown} must be {rule.what}")
    return problems


def _cross_field(cfg: Config, world: int) -> list[str]:
    problems = []
    v, t = cfg.model.vision, cfg.model.text
    if cfg.train.grad_checkpointing:
        from transformers import PreTrainedModel, __version__

        if not hasattr(PreTrainedModel, "activation_checkpointing_enable"):  # transformers 5.18 checkpoints the text
            # tower's CLS-only last layer with other shapes on recompute (torch's CheckpointError)
            problems.append(f"train.grad_checkpointing=true needs a newer transformers than {__version__} (tested: "
                            "5.24): pip install -U 'transformers>=5.24', or set train.grad_checkpointing=false")
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
    family = cfg.model.family  # (a loaded checkpoint's config is not checked: it is not trained)
    if family in ("siglip", "siglip2") or (family == "clip" and not cfg.model.init_from):
        problems.append(f"model.family={family} is a public checkpoint's format, which openalign evaluates, embeds and "
                        "serves; it trains its own dual encoder (model.family=openalign) and fine-tunes a CLIPModel "
                        "directory given with --init")
    batch = cfg.data.global_batch
    if batch > 0 and batch % world:
        problems.append(f"data.global_batch={batch} must divide by the {world} processes (each encodes an equal share)")
    per_rank = batch // world if batch > 0 else 0
    if cfg.train.micro_batch > 0 and per_rank and per_rank % cfg.train.micro_batch:
        problems.append(f"train.micro_batch={cfg.train.micro_batch} must divide each process's batch of {per_rank}")
    smallest = cfg.train.micro_batch or per_rank
    if v.kind == "efficientnet" and 0 < smallest < 2:  # BatchNorm's batch statistics need two images
        which = "train.micro_batch" if cfg.train.micro_batch else "data.global_batch"
        problems.append(f"{which}={smallest} gives each forward pass one image, and EfficientNet's BatchNorm needs "
                        "at least 2 to train; use 2 or more")
    if cfg.train.fsdp and cfg.train.shard_optimizer:
        problems.append("train.fsdp=true already shards the optimizer state; leave train.shard_optimizer off")
    for option in ("shard_optimizer", "fsdp"):
        if getattr(cfg.train, option) and world == 1:
            problems.append(f"train.{option}=true shards over torchrun processes; launch with torchrun")
    problems += _loss_rules(cfg, world)
    temp = cfg.loss.temperature
    if temp.fixed and temp.fixed < temp.min:
        problems.append(f"loss.temperature.fixed={temp.fixed} is below loss.temperature.min={temp.min}")
    if temp.fixed and temp.max_scale and temp.fixed * temp.max_scale < 1:
        problems.append(f"loss.temperature.fixed={temp.fixed} is a logit scale of {1 / temp.fixed:g}, above "
                        f"loss.temperature.max_scale={temp.max_scale}")
    return problems


def _loss_rules(cfg: Config, world: int) -> list[str]:
    """The configured loss kind's own rules (LOSS_KINDS, filled by openalign/loss/)."""
    if not LOSS_KINDS:
        raise RuntimeError("no loss kind is registered: import openalign.loss before checking a Config")
    kind = LOSS_KINDS.get(cfg.loss.kind)
    if kind is None:
        *rest, last = LOSS_KINDS
        return [f"loss.kind={cfg.loss.kind} must be {', '.join(rest) + ' or ' if rest else ''}{last}"]
    return kind.rules(cfg, world)


def fit_loss_options(cfg: Config, overrides: list[str]) -> tuple[Config, list[str]]:
    """`cfg` with the loss options its kind does not read at that kind's own values, except those the user set in
    `overrides` (dotted `key=value`), and a line for each change (loss/base.py `Loss.fitted`)."""
    kind = LOSS_KINDS.get(cfg.loss.kind)
    if kind is None:
        return cfg, []  # check() names the kinds
    given = {item.partition("=")[0].strip() for item in overrides}
    return kind.fitted(cfg, given)


class Options:
    """The base of every public options dataclass (`@dataclass(frozen=True) class FetchOptions(Options)`): made, it
    checks each field's type (its annotation: a str is never taken for a tuple of str), its Rule, its Literal
    choices and the class's `cross_field_problems()`, and raises one ConfigError naming every field that is wrong,
    as `spell` names it (its flag, `--per-host`, unless the class says otherwise). A list given for a tuple field is
    taken as that tuple (`opt_out=["noai"]`). One mechanism for the command line and the Python API alike."""

    def spell(self, name: str) -> str:
        return "--" + name.replace("_", "-")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(cast(Any, self)):  # a subclass is the dataclass
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
        check(self, spell=self.spell)


def expect(value, kind: type, name: str = "options"):
    """`value` when it is a `kind`, else one sentence: a public function's options argument of another type (a dict,
    None, the class itself) would fail deep inside with an AttributeError."""
    if isinstance(value, kind):
        return value
    shown = f"the class {value.__name__}" if isinstance(value, type) else _article(type(value).__name__)
    raise ConfigError(f"{name} must be {_article(kind.__name__)} (e.g. {kind.__name__}(...) with its fields as "
                      f"keywords), not {shown}")


def _article(word: str) -> str:
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def listed(value, name: str) -> list:
    """A public function's list argument as a list: one str or Path is one item (list("a.wat") would be five
    files), a list or tuple as it is; anything else one sentence."""
    if isinstance(value, (str, Path)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"{name} must be a list of paths (or one path), not a {type(value).__name__}")


def check(cfg, world: int = 1, spell: Callable[[str], str] | None = None) -> None:
    """Raise one ConfigError listing every violation (each field's Rule, the Literal kinds and the rules across
    fields and processes), or return: run once, when a config or options are made, never in a hot path."""
    problems = violations(cfg, world, spell)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        what = "config values" if spell is None else "values"
        raise ConfigError(f"{len(problems)} {what} are invalid: " + "; ".join(problems))
