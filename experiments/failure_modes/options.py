"""The failure-modes study's options (key=value on its command line) and --quick's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from openalign.config import POSITIVE, POSITIVE_INT, POSITIVE_INTS, Rule, at_least

POSITIVE_FLOATS = Rule(lambda v: len(v) > 0 and all(x > 0 for x in v), "positive numbers, at least one")
SHARE = Rule(lambda v: 0 < v < 1, "a share of all pairs, in (0, 1)")
PARTS = ("composition-toy", "deeper-tower", "generic-captions", "rerank-cost", "concept-frequency", "relations",
         "several-objects")


@dataclass(frozen=True)
class FailureOptions:
    parts: tuple[str, ...] = PARTS  # the parts to run
    toy_dim: Annotated[int, POSITIVE_INT] = 32  # composition toy: the image features' width
    toy_embed: Annotated[int, POSITIVE_INT] = 8  # composition toy: the shared embedding's width
    toy_hidden: Annotated[int, POSITIVE_INT] = 64  # composition toy: the deeper image tower's hidden width
    toy_noise: Annotated[float, POSITIVE] = 1.0  # composition toy: the image noise's norm against the colour and
        # shape vectors' (each about 1)
    toy_steps: Annotated[int, POSITIVE_INT] = 3_000  # composition toy: Adam steps, each a batch of the 16 seen pairs
    toy_lr: Annotated[float, POSITIVE] = 0.01  # composition toy: Adam's learning rate
    toy_test: Annotated[int, at_least(1)] = 200  # composition toy: fresh images per held-out combination
    toy_fillers: Annotated[int, POSITIVE_INT] = 2  # composition toy: most filler words per caption
    generic: Annotated[int, POSITIVE_INT] = 1  # generic captions: how many are added to the PMI study's table
    generic_share: Annotated[float, SHARE] = 0.5  # generic captions: their share of all pairs
    generic_width: Annotated[int, POSITIVE_INT] = 8  # generic captions: the embedding width d
    generic_steps: Annotated[int, POSITIVE_INT] = 2_000  # generic captions: optimizer steps per run
    rerank_model: str = "runs/demo/model"  # rerank cost: the model (`make demo`'s)
    rerank_images: str = "data/emoji/train"  # rerank cost: the collection embedded (images, shards or a table)
    rerank_shortlists: Annotated[tuple[int, ...], POSITIVE_INTS] = (10, 50, 100, 200)  # rerank cost: the K re-ranked
    rerank_queries: Annotated[int, POSITIVE_INT] = 40  # rerank cost: text queries timed
    frequency_models: tuple[str, ...] = ("runs/demo/model",)  # concept frequency: a model per set
    frequency_train: tuple[str, ...] = ("data/emoji/train",)  # concept frequency: the set's training shards
    frequency_eval: tuple[str, ...] = ("data/emoji/eval",)  # concept frequency: the set's held-out shards
    scene_preset: str = "demo"  # relations, several objects: the preset trained on the scenes
    scene_per_combo: Annotated[int, POSITIVE_INT] = 40  # relations, several objects: training scenes per seen pair
    scene_overrides: tuple[str, ...] = ("train.steps=300", "train.eval_every=0", "train.checkpoint_every=0",
                                        "model.vision.image_size=64", "model.vision.resize_size=72")  # their budget
    scene_scales: Annotated[tuple[int, ...], POSITIVE_INTS] = (1, 10, 30, 100)  # several objects: softmax scales
    depths: Annotated[tuple[float, ...], POSITIVE_FLOATS] = (0.25, 1.0)  # deeper tower: EfficientNet depths
    # deeper tower: after the scenes' budget, a recipe both depths train under (at the demo's lr 5e-3 depth 1.0
    # does not)
    depth_overrides: tuple[str, ...] = ("train.steps=1000", "optim.lr=2e-3", "optim.warmup_steps=200")


QUICK = ("toy_steps=1000", "toy_test=100", "generic_steps=600", "rerank_queries=10")  # --quick: about a minute
