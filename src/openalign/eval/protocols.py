"""The paper's transfer protocols by name (`openalign eval --protocol NAME`): which task runs, at which training and
evaluation resolutions, with which recipe. A protocol is a set of task options applied before the user's own
(`finetune.recipe.lr=...`, `--ft lr=...` and `linear-probe.sgd.epochs=...` still override its numbers).

The resolutions are the paper's at its 289-pixel image size and scale with a model's own `image_size` (a model
trained at 64 pixels probes at 64 and evaluates at 80). Evaluation is one central crop of 87.5% of the resized side
(`transforms.CENTER_CROP_RATIO`). docs/evaluation.md tabulates each protocol against the paper's recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from openalign.config import ConfigError
from openalign.data.transforms import CENTER_CROP_RATIO

PAPER_IMAGE_SIZE = 289  # the paper's pretraining crop: the sizes below are at this scale


@dataclass(frozen=True)
class Protocol:
    task: str
    train_size: int  # the training resolution at the paper's image size (0: the model's own, as evaluation's)
    eval_size: int  # the evaluation resolution at the paper's image size (0: the model's own crop and resize)
    options: tuple[str, ...]  # task options, `task.key=value`, applied before the user's
    recipe: str  # the paper's recipe in a sentence (the report prints it)


RECIPE = "finetune.recipe."
PROTOCOLS = {
    "imagenet-probe": Protocol(
        "linear-probe", 289, 360, ("linear-probe.solver=sgd",),
        "frozen features, a linear head by SGD (momentum 0.9, batch 1024, lr 0.1 x0.2 every 30 epochs, 100 epochs, "
        "no weight decay), features at 289 for training and 360 for evaluation (Section 5.3)"),
    "imagenet-finetune": Protocol(
        "finetune", 475, 600,
        tuple(RECIPE + o for o in ("head_steps=500", "lr=0.001", "head_lr_scale=10", "momentum=0.9", "schedule=step",
                                   "decay=0.2", "decay_every=0.3", "warmup_fraction=0", "weight_decay=0",
                                   "crop=inception")),
        "the head first on frozen features, then all layers; SGD momentum 0.9, lr 0.01 for the head and 0.001 for "
        "the backbone, x0.2 every 30 epochs; Szegedy's random-resized crop and flip at 475, one 0.875 central crop "
        "at 600 (FixRes; Section 5.3)"),
    "fine-grained": Protocol(
        "finetune", 289, 360,
        tuple(RECIPE + o for o in ("head_steps=2000", "head_stage_lr=0.01", "lr=0.001", "head_lr_scale=1",
                                   "batch_size=256", "weight_decay=1e-05", "freeze_bn=true", "schedule=cosine",
                                   "steps=20000", "warmup_fraction=0", "crop=inception")) + ("finetune.runs=3",),
        "BatchNorm statistics frozen, batch 256, weight decay 1e-5; the head at lr 1e-2, then all layers at 1e-3 "
        "with cosine decay over 20k steps; random-resized crop at 289, central crop at 360; the mean of 3 runs "
        "(Section 5.3)"),
    "vtab": Protocol(
        "vtab", 0, 0, (),
        "VTAB-1k: per task, a sweep on 800/200, the winner retrained on all 1,000 and scored on the test split, "
        "the mean ± std of 3 runs (Section 5.3; Zhai et al. 2019)"),
}


@dataclass(frozen=True)
class Resolved:
    protocol: Protocol
    train_crop: int
    crop: int
    resize: int


def resolve(name: str, image_size: int, crop: int = 0, resize: int = 0) -> Resolved:
    """The protocol `name` at a model's `image_size`: its training and evaluation crops scaled by
    image_size / 289, the evaluation resize that makes the crop 87.5% of the side. A given `crop` / `resize`
    (--crop, --resize) is kept."""
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown --protocol {name!r}; choose from {', '.join(PROTOCOLS)}")
    protocol = PROTOCOLS[name]
    scale = image_size / PAPER_IMAGE_SIZE
    train = round(protocol.train_size * scale)
    crop = crop or round(protocol.eval_size * scale)
    resize = resize or (round(crop / CENTER_CROP_RATIO) if protocol.eval_size else 0)
    return Resolved(protocol, train, crop, resize)


def options(resolved: Resolved) -> list[str]:
    """The protocol's task options, with its training resolution."""
    task = resolved.protocol.task
    train = [f"{task}.train_crop={resolved.train_crop}"] if resolved.train_crop and task != "vtab" else []
    return list(resolved.protocol.options) + train
