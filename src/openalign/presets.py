"""Presets are functions returning a `Config`: the CPU demo and the paper's model sizes are siblings.

Paper sizes (Jia et al. 2021, Figure 3, Tables 8-9): EfficientNet B1/B3/B5/B7/L2 image towers x BERT
Mini/Medium/Base/Large text towers, e.g. `align-b7-base`, `align-l2-large` (the headline model).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Sequence

from openalign.config import Config, ConfigError, DataConfig, ModelConfig, OptimConfig, TextConfig, TrainConfig
from openalign.config import VisionConfig, fit_loss_options, override

__all__ = ["PRESETS", "configure", "get"]

# (width_coefficient, depth_coefficient), as in EfficientNet / Noisy Student.
EFFICIENTNETS = {"b1": (1.0, 1.1), "b3": (1.2, 1.4), "b5": (1.6, 2.2), "b7": (2.0, 3.1), "l2": (4.3, 5.3)}
# CLIP's vision transformers (Radford et al. 2021): (width, layers, heads, patch); MLP width is 4x width.
VITS = {"b32": (768, 12, 12, 32), "b16": (768, 12, 12, 16), "l14": (1024, 24, 16, 14)}
# (layers, hidden, heads); intermediate size is 4x hidden.
BERTS = {"mini": (4, 256, 4), "medium": (8, 512, 8), "base": (12, 768, 12), "large": (24, 1024, 16)}


def dual_encoder(name: str, image: tuple[str, ...], text: tuple[int, int, int], embed_dim: int,
                 deviations: tuple[str, ...] = ()) -> Config:
    """The paper's recipe around one image tower (`efficientnet(...)` or `vit(...)`: the overrides that make it) x
    BERT (layers, hidden, heads), with the preset's deviations from the recipe as dotted overrides. Every model
    preset is built here: the paper's sizes, the demo and tiny are siblings that differ only in their towers and
    their stated deviations."""
    layers, hidden, heads = text
    cfg = Config(
        preset=name,
        out=f"runs/{name}",
        model=ModelConfig(
            vision=VisionConfig(),
            text=TextConfig(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=4 * hidden),
            embed_dim=embed_dim,
        ),
        data=DataConfig(global_batch=16_384),
        train=TrainConfig(steps=1_200_000, checkpoint_every=5_000, eval_every=10_000),
    )
    return override(cfg, [*image, *deviations])


def efficientnet(width: float, depth: float) -> tuple[str, ...]:
    """The overrides that make a preset's image tower the EfficientNet of these scaling coefficients."""
    return (f"model.vision.width_coefficient={width}", f"model.vision.depth_coefficient={depth}")


def vit(width: int, layers: int, heads: int, patch: int, pool: str = "cls") -> tuple[str, ...]:
    """The overrides that make a preset's image tower a ViT of these sizes (MLP 4x width)."""
    return ("model.vision.kind=vit", f"model.vision.hidden_size={width}", f"model.vision.num_layers={layers}",
            f"model.vision.num_heads={heads}", f"model.vision.intermediate_size={4 * width}",
            f"model.vision.patch_size={patch}", f"model.vision.pool={pool}", "model.channels_last=false")


def clip_vit(image_tower: str, text_tower: str) -> Config:
    """A CLIP-sized ViT with a paper-sized BERT in the paper's recipe, at CLIP's 224 px (resize 256): the
    paper's 346/289 are EfficientNet-B7's resolution. Joint space 640, the paper's."""
    return dual_encoder(f"vit-{image_tower}-{text_tower}", vit(*VITS[image_tower]), BERTS[text_tower], 640,
                        ("model.vision.resize_size=256", "model.vision.image_size=224"))


def paper(image_tower: str, text_tower: str) -> Config:
    # L2 pools to 1376 and is used as is; B7 pools to 640; B1/B3/B5 get a linear layer to 640.
    return dual_encoder(f"align-{image_tower}-{text_tower}", efficientnet(*EFFICIENTNETS[image_tower]),
                        BERTS[text_tower],
                        1376 if image_tower == "l2" else 640)


# The demo's deviations from the paper recipe, each measured on the emoji corpus (docs/demo.md):
# - temperature init 0.07 (CLIP's) instead of 1.0: in a few hundred steps 1.0 cannot fall to where the loss
#   wants it, and held-out recall is markedly lower (paper: 1.2M steps hide this);
# - LAMB peak lr 5e-3 over a 50-step warmup, no text dropout: a short run needs fast, clean steps;
# - 64 px images (resize 72, crop 64) instead of 346/289 (64 px beats 48 px at equal wall time on held-out
#   recall); towers sized for minutes of CPU time (EfficientNet width 0.75 / depth 0.5, BERT 4 layers x 256):
#   widening the text tower from 128 to 256 raised held-out R@10 from ~10x to ~14x chance, the largest gain;
# - BatchNorm momentum 0.1: in a short run the statistics must follow the weights quickly;
# - a WordPiece vocabulary of up to 8,000 (the corpus yields ~5,600; 2,000 split too many words), 640 steps
#   and 4 evaluations: what fits five minutes on 2 cores (docs/demo.md).
DEMO = ("model.vision.drop_connect_rate=0.0", "model.vision.batch_norm_momentum=0.1", "model.vision.resize_size=72",
        "model.vision.image_size=64", "model.text.vocab_size=8000", "model.text.dropout=0.0",
        "model.text.length_buckets=4", "loss.temperature.init=0.07", "optim.lr=5e-3", "optim.warmup_steps=50",
        "data.corpus=emoji", "data.global_batch=128", "data.workers=1", "data.shuffle_buffer=1000", "train.steps=640",
        "train.log_every=10", "train.eval_every=160", "train.checkpoint_every=160")
# tiny: the demo's recipe at the smallest sensible size, for tests and smoke runs (seconds on CPU)
TINY = (*DEMO, "model.vision.resize_size=36", "model.vision.image_size=32", "model.text.intermediate_size=64",
        "model.text.vocab_size=300", f"model.text.dropout={TextConfig.dropout}",
        f"model.text.length_buckets={TextConfig.length_buckets}", "data.global_batch=8", "data.workers=0",
        "data.shuffle_buffer=16", "train.steps=4", "train.log_every=1", "train.eval_every=0",
        "train.checkpoint_every=2")


def demo() -> Config:
    """A ~5.9M-parameter model trained for under five minutes on 2 CPU cores on the built-in emoji corpus
    (the deviations from the paper: DEMO above)."""
    # the width-0.75 tower pools to 240: no image projection, exact HF format
    return dual_encoder("demo", efficientnet(0.75, 0.5), (4, 256, 4), 240, DEMO)


# demo-vit: the demo with a ViT image tower of the EfficientNet's parameters (1.25M with its projection, against
# 1.23M): 8x8 patches of the 64 px images (64 tokens), width 128, 6 layers, 4 heads. (Its BERT keeps the pooler
# VisionTextDualEncoderModel projects: +66K parameters on the text side.)
DEMO_VIT = vit(128, 6, 4, 8)


def demo_vit() -> Config:
    """The demo with a ViT image tower (DEMO_VIT) instead of the EfficientNet: the EfficientNet-vs-ViT
    comparison in docs/results.md."""
    return dual_encoder("demo-vit", DEMO_VIT, (4, 256, 4), 240, DEMO)


# clipart: the demo's recipe on the built-in real sources, openclipart's ~5,800 clipart files with their noisy
# titles and the emoji with their CLDR names, for a model that works on images nobody here drew (docs/demo.md):
# - openclipart's image-size rule at 96 px instead of the paper's 200 (for 289 px training): at 64 px the
#   ~2,600 clipart images between 97 and 200 px are usable, and openclipart's training split nearly doubles;
# - every training image within 4 bits of perceptual hash of a held-out image of either source left out
#   (data.dedup_heldout: the same drawing filed twice, colour variants, identical flags);
# - a text tower of 6 layers x 384 (the demo's 4 x 256 does not fit its five minutes): at 600 steps it raised
#   held-out openclipart R@10 by about a fifth, more than 96 px images or a wider image tower (at the full hour the
#   4 x 256 tower, given the same wall time as 6,000 steps, draws with it: docs/demo.md);
# - one tokenizer trained on both sources' texts; 4,000 steps and 4 evaluations: 54-62 min on 2 cores (3 seeds);
# - evaluated also on tuxpaint and icons, real sources it never trains on: a split held out of a training source
#   overstates transfer tenfold (docs/results.md); their held-out images leave one more openclipart training image
#   out as a near-duplicate (of 5,041).
CLIPART = (*DEMO, "data.corpus=openclipart+emoji", "data.eval_corpus=openclipart+emoji+tuxpaint+icons",
           "data.corpus_options=openclipart.min_short_side=96", "data.dedup_heldout=true", "train.steps=4000",
           "train.eval_every=1000", "train.checkpoint_every=500")


def clipart() -> Config:
    """The demo's image tower with a 6 x 384 BERT, trained for about an hour on 2 CPU cores on openclipart + emoji
    (CLIPART above)."""
    return dual_encoder("clipart", efficientnet(0.75, 0.5), (6, 384, 6), 240, CLIPART)


def tiny() -> Config:
    """The smallest sensible model, for tests and smoke runs (seconds on CPU)."""
    return dual_encoder("tiny", efficientnet(0.25, 0.25), (1, 32, 2), 80, TINY)


FINETUNE_STEPS = {"flickr30k": 3_000, "coco": 6_000}


def finetune_retrieval(dataset: str) -> Config:
    """The paper's fine-tuned retrieval protocol (Section 5.1): batch 2048, lr 1e-5, 3K steps on Flickr30K /
    6K on MSCOCO, linear decay to 0 (no warmup), on the Karpathy train split (COCO: train + restval).

    The towers, their sizes and the tokenizer come from the model given with `--init`; the optimizer
    is the pretraining one (LAMB, weight decay 1e-5), which the paper does not restate for fine-tuning.
    """
    return Config(
        preset=f"finetune-{dataset}",
        out=f"runs/finetune-{dataset}",
        optim=OptimConfig(lr=1e-5, warmup_steps=0),
        data=DataConfig(global_batch=2_048, train_splits=("train", "restval"), eval_split="test"),
        train=TrainConfig(steps=FINETUNE_STEPS[dataset], checkpoint_every=500, eval_every=500),
    )


def tiny_vit() -> Config:
    """tiny with a one-layer ViT (8x8 patches of 32 px), for tests."""
    return dual_encoder("tiny-vit", vit(32, 1, 2, 8), (1, 32, 2), 80, TINY)


PRESETS: dict[str, Callable[[], Config]] = {"demo": demo, "clipart": clipart, "tiny": tiny, "demo-vit": demo_vit,
                                            "tiny-vit": tiny_vit}
NEEDS_INIT = set()  # presets that fine-tune a trained model: `--init MODEL` is required
for _dataset in FINETUNE_STEPS:
    PRESETS[f"finetune-{_dataset}"] = functools.partial(finetune_retrieval, _dataset)
    NEEDS_INIT.add(f"finetune-{_dataset}")
for _image in EFFICIENTNETS:
    for _text in BERTS:
        PRESETS[f"align-{_image}-{_text}"] = functools.partial(paper, _image, _text)
for _image in VITS:
    for _text in BERTS:
        PRESETS[f"vit-{_image}-{_text}"] = functools.partial(clip_vit, _image, _text)


def get(name: str) -> Config:
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; choose one of {', '.join(PRESETS)}"
        raise ConfigError(f"unknown preset {name!r}{hint}")
    return PRESETS[name]()


def configure(preset: str = "demo", overrides: Sequence[str] = ()) -> Config:
    """A run's config as `openalign train --preset PRESET key=value ...` resolves it: the preset, the dotted overrides
    (`optim.lr=5e-4`, `out=runs/x`, `data.train=SHARDS`), then the loss options the chosen loss kind does not read at
    that kind's own values unless an override set them (warned, one line each)."""
    import warnings

    import openalign.loss  # noqa: F401 - fills the registry of loss kinds

    cfg, notes = fit_loss_options(override(get(preset), list(overrides)), list(overrides))
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return cfg
