"""The options of `openalign eval`, apart from the code that runs it: what every task shares (`EvalOptions`) and
each task's own (`TASK_OPTIONS`, in the order `--help` lists the tasks). Nothing here imports torch, so that
`openalign eval --help` builds its flags from these classes at once.

A field's comment is its flag's help (openalign/flags.py), a sentence that may continue on comment lines indented
deeper than the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from openalign.config import (FRACTION_CLOSED_OPEN, FRACTION_OPEN_CLOSED, NON_NEGATIVE, POSITIVE, POSITIVE_INT,
                              EvalConfig, Options, Rule, non_negative)

__all__ = ["DEFAULT_TEMPLATES", "TASK_OPTIONS", "CompositionalOptions", "CxcOptions", "EvalOptions", "FinetuneConfig",
           "FinetuneOptions", "KnnOptions", "MultilingualOptions", "ProbeOptions", "RetrievalOptions", "SgdProbe",
           "VtabOptions", "ZeroshotOptions"]

class TaskOptions(Options):
    """A task's options, spelled as its overrides are (`retrieval.rerank`); `task` is the prefix."""

    task: ClassVar[str] = ""

    def spell(self, name: str) -> str:
        return f"{self.task}.{name}" if self.task else name


@dataclass(frozen=True)
class FinetuneConfig(TaskOptions):
    """Fine-tuning the image tower with a classification head (`openalign eval --task finetune|vtab --ft k=v`).

    With `head_steps`, the paper's two stages: the head alone on the frozen tower first (the tower in evaluation
    mode, its features not differentiated), then all layers. `--protocol` sets these from the paper's recipes."""

    steps: Annotated[int, POSITIVE_INT] = 500  # the all-layers stage
    batch_size: Annotated[int, POSITIVE_INT] = 64  # images per step (one process)
    lr: Annotated[float, POSITIVE] = 0.01  # backbone peak learning rate (SGD with momentum)
    head_lr_scale: Annotated[float, NON_NEGATIVE] = 10.0  # the head's lr is this times the backbone's (paper: 10)
    momentum: Annotated[float, FRACTION_CLOSED_OPEN] = 0.9
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.0
    warmup_fraction: Annotated[float, Rule(lambda x: 0 <= x <= 1, "in [0, 1]")] = 0.1  # linear warmup over this
                                                                                       # fraction of each stage's steps
    schedule: Literal["linear", "step", "cosine"] = "linear"  # after the warmup: linear decay to 0; x `decay` every
        # `decay_every` of the stage's steps (the paper's ImageNet: x0.2 every 30 epochs); or cosine decay to 0
    decay_every: Annotated[float, FRACTION_OPEN_CLOSED] = 0.3  # step schedule: the share of a stage's steps between
                                                               # decays
    decay: Annotated[float, POSITIVE] = 0.2  # step schedule: the lr's factor at each decay
    head_steps: Annotated[int, NON_NEGATIVE] = 0  # stage 1, before `steps`: the head alone on the frozen tower
    head_stage_lr: Annotated[float, NON_NEGATIVE] = 0.0  # stage 1's peak lr (0: the head's lr, lr x head_lr_scale)
    crop: Literal["pretraining", "inception"] = "pretraining"  # training crop: the pretraining's (resize, random
        # crop, flip) or Szegedy et al.'s random-resized crop (8 to 100 percent of the area, aspect 3/4-4/3) and flip
    freeze_bn: bool = False  # keep BatchNorm running statistics fixed (paper: for small datasets)


# A short generic prompt set for icons and emoji (one definition: the config's default).
DEFAULT_TEMPLATES = EvalConfig().templates


@dataclass(frozen=True)
class EvalOptions(Options):
    """What every task shares; each task's own settings are its options class (below)."""

    encode_batch: int = 256  # images or texts encoded at once
    max_length: int = 64  # text tokens (set from the model)
    images: str = ""  # image root for a Karpathy JSON, a table or a list (default: beside the file)
    split: str = "test"  # Karpathy split to evaluate (test: the 1K Flickr30K / 5K COCO protocol; all: every image)
    image_column: str = ""  # a table's image column (default: the first of image, filepath, file, path, image_path,
        # url)
    text_column: str = ""  # a table's caption column (default: the first of text, caption, captions, title)
    resize: int = 0  # the side images are resized to before the center crop (default: the model's resize-to-crop
        # ratio applied to the crop)
    crop: int = 0  # the side of the center crop the model sees (default: the model's image size; a ViT's position
        # embeddings are interpolated, bicubic, to another size's grid of patches)
    cache: str = ""  # a directory where image embeddings are kept and reused by later runs on the same model,
        # data and image size (e.g. several probes of one large set)
    model_id: str = ""  # identifies the model's weights in cache keys (eval: a fingerprint of its files)


@dataclass(frozen=True)
class NoOptions(TaskOptions):
    pass


@dataclass(frozen=True)
class RetrievalOptions(TaskOptions):
    task: ClassVar[str] = "retrieval"
    rerank: Annotated[int, non_negative("0 (off) or a shortlist size K >= 1")] = 0  # > 0: re-rank each query's
        # top K by late interaction (FILIP scores of patch and token vectors) and report R@K after it (`*_rerank`)
        # beside the dual encoder's, with the time per query of each



@dataclass(frozen=True)
class ZeroshotOptions(TaskOptions):
    task: ClassVar[str] = "zeroshot"
    templates: tuple[str, ...] = DEFAULT_TEMPLATES  # prompts, {} for the class name: imagenet80 (CLIP's 80), generic,
        # or a file with one per line
    classnames: str = ""  # a class-names file: `label,name` lines, or one name per sorted label
    class_subset: str = ""  # a file of labels: only these classes compete (ImageNet-R/A style)
    calibrate: str = ""  # a labeled split: fit one temperature on it (NLL), report ECE and NLL before and after


@dataclass(frozen=True)
class KnnOptions(TaskOptions):
    task: ClassVar[str] = "knn"
    train_data: str = ""  # the labeled training split (class folders, a label table or shards); without it the
        # evaluated split is its own pair: each class's images dealt alternately to train and test (`group`)
    k: int = 1  # neighbours (1: the paper's ImageNet KNN R@1)
    group: str = ""  # without train_data: the images' metadata key whose values are the classes (default: `family`
        # where every image has one, as the emoji corpus' held-out split; else the labels)


@dataclass(frozen=True)
class SgdProbe(TaskOptions):
    task: ClassVar[str] = "linear-probe.sgd"
    """The paper's frozen-feature probe recipe (Section 5.3): SGD with momentum on a linear head, the lr decayed by
    `decay` every `decay_every` epochs."""

    lr: Annotated[float, POSITIVE] = 0.1
    momentum: Annotated[float, FRACTION_CLOSED_OPEN] = 0.9
    batch_size: Annotated[int, POSITIVE_INT] = 1024  # the global batch
    epochs: Annotated[int, POSITIVE_INT] = 100
    decay_every: Annotated[int, POSITIVE_INT] = 30  # epochs between decays
    decay: Annotated[float, POSITIVE] = 0.2  # the lr's factor at each decay
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.0


@dataclass(frozen=True)
class ProbeOptions(TaskOptions):
    task: ClassVar[str] = "linear-probe"
    train_data: str = ""  # the labeled training split (class folders, a label table or shards)
    solver: Literal["sgd", "lbfgs"] = "lbfgs"  # lbfgs: CLIP's (full-batch logistic regression, its L2 strength
        # found by CLIP's search on a fifth of the training split); sgd: the paper's recipe for 1.28M ImageNet images
        # (below; --protocol imagenet-probe). lbfgs scored higher on 146 and on 19,200 training images
        # (docs/evaluation.md, "Choosing the probe's solver")
    sgd: SgdProbe = SgdProbe()  # the sgd solver's recipe (`linear-probe.sgd.lr=0.05`, ...)
    train_crop: Annotated[int, non_negative("0 (the evaluation's crop) or a size in pixels")] = 0  # the training
        # split's features at this resolution (the paper: 289 for training, 360 for evaluation; --protocol
        # imagenet-probe sets both from the model's image size)
    seed: int = 0  # lbfgs: which fifth of the training split validates; sgd: the order of the training rows



@dataclass(frozen=True)
class CxcOptions(TaskOptions):
    task: ClassVar[str] = "cxc"
    dir: str = ""  # the directory of Crisscrossed Captions' sts_/sis_/sits_<split>.csv
    positive_score: float = 3.0  # human score (0-5) at or above which a pair counts as a positive
    bootstrap: Annotated[int, non_negative("0 (off) or a number of resamples")] = 1000  # resamples of each kind's
        # pairs: Spearman's mean and std over them (`*_spearman_boot_mean` / `_boot_std`), as the paper's Table 3
    seed: int = 0  # the bootstrap's resampling seed



@dataclass(frozen=True)
class MultilingualOptions(TaskOptions):
    task: ClassVar[str] = "multilingual"
    captions: str = ""  # the directory of Multi30k caption files (default: found beside the image list)


@dataclass(frozen=True)
class CompositionalOptions(TaskOptions):
    task: ClassVar[str] = "compositional"
    templates: tuple[str, ...] = DEFAULT_TEMPLATES  # prompts of the pair classifier ({} = "colour shape")


@dataclass(frozen=True)
class FinetuneOptions(TaskOptions):
    task: ClassVar[str] = "finetune"
    train_data: str = ""  # the labeled training split (class folders, a label table or shards)
    seed: int = 0  # the first run's seed
    recipe: FinetuneConfig = FinetuneConfig()  # the training recipe (--ft key=value)
    runs: Annotated[int, POSITIVE_INT] = 1  # runs (seeds seed, seed+1, ...): the mean and std of their scores
    train_crop: Annotated[int, NON_NEGATIVE] = 0  # training resolution (0: the evaluation's crop; the paper trains
        # at 475 and evaluates at 600 on ImageNet, 289/360 on the fine-grained sets: FixRes)



@dataclass(frozen=True)
class VtabOptions(TaskOptions):
    task: ClassVar[str] = "vtab"
    seed: int = 0  # the first seed
    recipe: FinetuneConfig = FinetuneConfig()  # the recipe the sweep varies (--ft key=value)
    sweep: tuple[str, ...] = ()  # grid as `key=v1,v2` items (default: VTAB's lightweight sweep)
    runs: int = 3  # retrain runs (seeds) whose mean and std are reported
    trials: Annotated[int, NON_NEGATIVE] = 0  # > 0: a random search, this many points drawn (seeded, without
        # replacement) from the sweep's grid instead of all of it; the paper's 50 trials drew from Zhai et al.
        # 2019's Appendix I space, which is not available here (docs/evaluation.md)



TASK_OPTIONS: dict[str, type] = {  # each task's options class, in the registry's order (eval/tasks.py TASKS)
    "retrieval": RetrievalOptions, "zeroshot": ZeroshotOptions, "knn": KnnOptions, "linear-probe": ProbeOptions,
    "cxc": CxcOptions, "multilingual": MultilingualOptions, "arithmetic": NoOptions,
    "compositional": CompositionalOptions, "word-sim": NoOptions, "sts": NoOptions, "finetune": FinetuneOptions,
    "vtab": VtabOptions}
