"""Image-only transfer by fine-tuning: the image tower plus a linear classification head, and the
VTAB-1k protocol built on it (the paper's Table 6).

Fine-tuning (`--task finetune`): a copy of the image tower gets a zero-initialized linear head on its
pooled features; SGD with momentum 0.9, linear warmup then linear decay, the paper's random crop + flip
(data/transforms.py); the head's learning rate is `head_lr_scale` (paper: 10) times the backbone's;
`freeze_bn` keeps BatchNorm's running statistics fixed (the paper's choice for small datasets). The
evaluated model is never changed. Scores are top-1/top-5 on the test split.

VTAB-1k (`--task vtab`): for each task, 1,000 training images (the task's train/ + val/ when it has a
val/ folder, else a seeded sample of train/ split 800/200); every point of the sweep is trained on the
800 and scored on the 200; the best (first on ties) is retrained on all 1,000 with `runs` seeds and
scored on test/: mean and (population) std over the runs, the mean over tasks (and its std over the runs), and
the mean of each of VTAB's groups present (natural, specialized, structured: `VTAB_GROUPS`, as the paper's
Table 6). The default sweep is VTAB's
lightweight one (lr 0.1/0.01 x 2,500/10,000 steps, batch 512, one learning rate for head and
backbone); pass a smaller `--sweep` on a CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from openalign.config import ConfigError, check, leaf_keys, override
from openalign.data import sources, transforms
from openalign.eval import metrics as M
from openalign.eval.features import Context
from openalign.eval.options import EvalOptions, FinetuneConfig, FinetuneOptions, VtabOptions
from openalign.model.dual_encoder import DualEncoder
from openalign.model.encode import device_of, evaluating
from openalign.schedule import lr_at


VTAB_SWEEP = ("lr=0.1,0.01", "steps=2500,10000", "batch_size=512", "head_lr_scale=1")
VTAB_TRAIN, VTAB_VAL = 800, 200
# VTAB-1k's 19 tasks in their three groups (Zhai et al. 2019; the paper's Table 6 reports each group's mean), by
# the names TFDS and google-research/task_adaptation give them; a task directory is matched by its name with case,
# punctuation and spaces ignored (`oxford_iiit_pet`, `Oxford-IIIT-Pet`)
VTAB_GROUPS = {
    "natural": ("caltech101", "cifar100", "dtd", "oxford_flowers102", "oxford_iiit_pet", "sun397", "svhn"),
    "specialized": ("patch_camelyon", "eurosat", "resisc45", "diabetic_retinopathy"),
    "structured": ("clevr_count", "clevr_distance", "dmlab", "kitti_distance", "dsprites_location",
                   "dsprites_orientation", "smallnorb_azimuth", "smallnorb_elevation"),
}
VTAB_ALIASES = {"cifar": "cifar100", "flowers102": "oxford_flowers102", "pets": "oxford_iiit_pet",
                "pcam": "patch_camelyon", "retinopathy": "diabetic_retinopathy", "kitti": "kitti_distance",
                "clevr_closest_object_distance": "clevr_distance", "clevr_count_all": "clevr_count",
                "dsprites_label_x_position": "dsprites_location", "dsprites_label_orientation": "dsprites_orientation",
                "smallnorb_label_azimuth": "smallnorb_azimuth", "smallnorb_label_elevation": "smallnorb_elevation"}


def _plain(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def vtab_group(task: str) -> str:
    """The VTAB group (natural, specialized, structured) of a task directory's name; '' for a task not of VTAB's
    19 (it counts in the mean over tasks, in no group)."""
    plain = _plain(task)
    for alias, name in VTAB_ALIASES.items():
        if plain == _plain(alias):
            plain = _plain(name)
    return next((group for group, names in VTAB_GROUPS.items() if plain in {_plain(n) for n in names}), "")


def parse_options(assignments: list[str]) -> FinetuneConfig:
    ft = override(FinetuneConfig(), assignments,
                  help_hint="the fine-tuning keys are " + ", ".join(leaf_keys(FinetuneConfig)))
    check(ft)
    return ft


def parse_sweep(assignments: list[str], base: FinetuneConfig) -> list[FinetuneConfig]:
    """`lr=0.1,0.01 steps=100,300` -> the grid of options (in the order given, last key fastest)."""
    axes = []
    for item in assignments:
        key, sep, values = item.partition("=")
        if not sep or not values:
            raise ConfigError(f"sweep {item!r} is not of the form key=v1,v2 (e.g. lr=0.1,0.01)")
        axes.append([f"{key}={v}" for v in values.split(",")])
    grid = [override(base, list(point)) for point in itertools.product(*axes)] or [base]
    for point in grid:
        check(point)
    return grid


class Diverged(ConfigError):
    """A fine-tuning run whose loss went non-finite: its scores would measure nothing."""

    def __init__(self, step: int, loss: float, ft: FinetuneConfig):
        super().__init__(f"fine-tuning diverged at step {step + 1} of {ft.steps} (loss {loss}) with lr={ft.lr:g}; "
                         "lower --ft lr (or --sweep lr=...)")


@dataclass
class Labeled:
    images: list  # PIL images, resized to resize x resize
    labels: list[str]
    skipped: int = 0
    crop: int = 0  # the evaluation crop those images are stored for (their side / crop: the resize-to-crop ratio)


def load_labeled(path: str | Path, options: EvalOptions, resize: int) -> Labeled:
    counter: dict = {}
    samples = [(item.label, transforms.eval_pixels(image, resize, 0)) for item, image in
               sources.decoded(sources.items(str(path), options.images, options.split, counter, captionless=False),
                               counter)]
    if not samples:
        raise ConfigError(f"no readable labeled images in {path}")
    return Labeled([pixels for _, pixels in samples], [label for label, _ in samples], counter.get("skipped", 0),
                   options.crop)


class Classifier(torch.nn.Module):
    """The image tower of a (copied) DualEncoder and a linear head on its pooled features."""

    def __init__(self, model: DualEncoder, n_classes: int):
        super().__init__()
        self.tower = copy.deepcopy(model)
        self.tower.hf.text_model = None  # not used; never trained
        self.head = torch.nn.Linear(self.tower.image_features_dim, n_classes)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, pixels: torch.Tensor, frozen_tower: bool = False) -> torch.Tensor:
        if frozen_tower:  # the head alone learns: the tower's features are inputs, not differentiated
            with torch.no_grad():
                features = self.tower.encode_image(pixels).features
            return self.head(features)
        return self.head(self.tower.encode_image(pixels).features)


def _train_mode(classifier: Classifier, freeze_bn: bool) -> None:
    classifier.train()
    if freeze_bn:
        for module in classifier.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()


def stage_lr(step: int, peak: float, steps: int, ft: FinetuneConfig) -> float:
    """A stage's learning rate at `step` of `steps`: linear warmup over `warmup_fraction` of them, then linear
    decay to 0, x`decay` every `decay_every` of the steps, or cosine decay to 0 (`ft.schedule`)."""
    warmup = int(steps * ft.warmup_fraction)
    if ft.schedule == "linear" or step < warmup:
        return lr_at(step, peak, warmup, steps)
    if ft.schedule == "step":
        return peak * ft.decay ** ((step - warmup) // max(1, round((steps - warmup) * ft.decay_every)))
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def fit(model: DualEncoder, data: Labeled, classes: dict[str, int], ft: FinetuneConfig, seed: int, crop: int,
        progress: bool = False) -> Classifier:
    """Fine-tune a copy of the image tower and a new head on `data` at training resolution `crop`; a pure function
    of its arguments. With `ft.head_steps`, the head first learns alone on the frozen tower (evaluation mode), then
    all layers train (the paper's two stages). Raises `Diverged` as soon as the loss is not finite."""
    if model.cfg.vision.resize_mode == "naflex":
        raise ConfigError("--task finetune and vtab train an image tower on fixed-size crops; a NaFlex Siglip2Model "
                          "takes each image at its own aspect ratio: evaluate it with the other tasks")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    classifier = Classifier(model, len(classes)).to(device_of(model))
    labels = torch.tensor([classes[c] for c in data.labels], dtype=torch.long)
    stored = data.images[0].size[0]
    resize = max(crop, round(crop * stored / data.crop)) if data.crop else stored  # the pretraining crop's margin
    order: list[int] = []

    def batches(steps: int):
        nonlocal order
        for step in range(steps):
            if len(order) < ft.batch_size:  # epochs of seeded permutations; a batch may span two epochs
                order += rng.sample(range(len(labels)), len(labels))
            rows, order = order[:ft.batch_size], order[ft.batch_size:]
            pixels = torch.stack([transforms.inception_transform(data.images[i], crop, rng) if ft.crop == "inception"
                                  else transforms.train_transform(data.images[i], resize, crop, rng) for i in rows])
            yield step, transforms.to_unit_range(pixels).to(device_of(model)), labels[rows].to(device_of(model))

    def run(optimizer, peak: float, steps: int, frozen_tower: bool, name: str) -> None:
        for step, pixels, target in tqdm(batches(steps), total=steps, desc=name, unit="step", disable=not progress,
                                         leave=False):
            for group in optimizer.param_groups:
                group["lr"] = stage_lr(step, peak, steps, ft) * group["lr_scale"]
            loss = torch.nn.functional.cross_entropy(classifier(pixels, frozen_tower), target)
            if not torch.isfinite(loss):
                raise Diverged(step, float(loss.detach()), ft)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    head = list(classifier.head.parameters())
    if ft.head_steps:  # stage 1: the head alone, on the frozen tower's features
        classifier.eval()
        stage_one = torch.optim.SGD([{"params": head, "weight_decay": 0.0, "lr_scale": 1.0}], lr=0.0,
                                    momentum=ft.momentum)
        run(stage_one, ft.head_stage_lr or ft.lr * ft.head_lr_scale, ft.head_steps, True, "fine-tune: head")
    backbone = [p for n, p in classifier.named_parameters() if not n.startswith("head.")]
    groups = [{"params": [p for p in backbone if p.ndim >= 2], "weight_decay": ft.weight_decay, "lr_scale": 1.0},
              {"params": [p for p in backbone if p.ndim < 2], "weight_decay": 0.0, "lr_scale": 1.0},
              {"params": head, "weight_decay": 0.0, "lr_scale": ft.head_lr_scale}]
    _train_mode(classifier, ft.freeze_bn)
    run(torch.optim.SGD(groups, lr=ft.lr, momentum=ft.momentum), ft.lr, ft.steps, False, "fine-tune")
    return classifier.eval()


def predict(classifier: Classifier, data: Labeled, crop: int, batch_size: int = 256) -> torch.Tensor:
    """[N, C] logits on center crops."""
    resize = data.images[0].size[0]
    out = []
    with evaluating(classifier):
        for start in range(0, len(data.images), batch_size):
            pixels = torch.stack([transforms.eval_transform(im, resize, crop)
                                  for im in data.images[start:start + batch_size]])
            out.append(classifier(pixels.to(device_of(classifier))).float().cpu())
    return torch.cat(out)


def score(classifier: Classifier, data: Labeled, classes: dict[str, int], crop: int) -> dict[str, float]:
    known = [i for i, c in enumerate(data.labels) if c in classes]
    subset = Labeled([data.images[i] for i in known], [data.labels[i] for i in known])
    labels = torch.tensor([classes[c] for c in subset.labels], dtype=torch.long)
    return M.topk_accuracy(predict(classifier, subset, crop), labels)


def finetune(ctx: Context, options: FinetuneOptions = FinetuneOptions()) -> tuple[dict, dict]:
    """The test split `ctx.path`, scored after fine-tuning on `options.train_data` (`runs` times: the mean top-1 and
    top-5 and the std of the top-1 over the runs)."""
    if not options.train_data:
        raise ConfigError("--task finetune needs --train-data (a labeled training split: folders, a table or shards)")
    resize, crop = ctx.options.resize, ctx.options.crop
    train, test = load_labeled(options.train_data, ctx.options, resize), load_labeled(ctx.path, ctx.options, resize)
    classes = {c: i for i, c in enumerate(sorted(set(train.labels)))}
    train_crop = options.train_crop or crop
    scores = [score(fit(ctx.model, train, classes, options.recipe, options.seed + run, train_crop, progress=True),
                    test, classes, crop) for run in range(options.runs)]
    n = len(classes)
    mean = {k: statistics.mean(s[k] for s in scores) for k in scores[0]}
    return mean | {"top1_std": statistics.pstdev(s["top1"] for s in scores), "runs": options.runs} \
        | dataclasses.asdict(options.recipe) | {
        "train_resolution": train_crop, "eval_resolution": crop, "n_train": len(train.labels),
        "n_test": len(test.labels), "n_classes": n, "n_skipped": train.skipped + test.skipped, "chance_top1": 1 / n,
        "chance_top5": min(1.0, 5 / n)}, {}


def vtab_tasks(root: Path) -> dict[str, Path]:
    """{task name: directory with train/ and test/}: ROOT itself, or every such sub-directory of it."""
    if (root / "train").is_dir() and (root / "test").is_dir():
        return {root.name: root}
    tasks = {d.name: d for d in sorted(root.iterdir()) if (d / "train").is_dir() and (d / "test").is_dir()} \
        if root.is_dir() else {}
    if not tasks:
        raise ConfigError(f"{root} has no VTAB task: give a directory with train/ and test/ class folders "
                          "(optionally val/), or a directory of such task directories")
    return tasks


def split_1k(train: Labeled, val: Labeled | None, seed: int) -> tuple[Labeled, Labeled]:
    """VTAB-1k's 800/200: train/ + val/ as given, or a seeded sample of 1,000 of train/ cut 800/200."""
    if val is not None:
        return train, val
    order = random.Random(seed).sample(range(len(train.labels)), min(len(train.labels), VTAB_TRAIN + VTAB_VAL))
    cut = max(1, len(order) * VTAB_TRAIN // (VTAB_TRAIN + VTAB_VAL))
    pick = lambda rows: Labeled([train.images[i] for i in rows], [train.labels[i] for i in rows], crop=train.crop)  # noqa: E731
    return pick(order[:cut]), pick(order[cut:])


def vtab(ctx: Context, options: VtabOptions = VtabOptions()) -> tuple[dict, dict]:
    """VTAB-1k over the task directories under `ctx.path` (see the module docstring)."""
    grid = parse_sweep(list(options.sweep) or list(VTAB_SWEEP), options.recipe)
    if options.trials:  # a random search over the grid: the drawn points, in the grid's order
        grid = [grid[i] for i in sorted(random.Random(options.seed).sample(range(len(grid)),
                                                                          min(options.trials, len(grid))))]
    model, crop = ctx.model, ctx.options.crop
    out: dict = {}
    per_task: dict[str, list[float]] = {}
    for name, task in vtab_tasks(Path(ctx.path)).items():
        load = lambda split, task=task: load_labeled(task / split, ctx.options, ctx.options.resize)  # noqa: E731
        fit_set, val_set = split_1k(load("train"), load("val") if (task / "val").is_dir() else None, options.seed)
        test = load("test")
        classes = {c: i for i, c in enumerate(sorted(set(fit_set.labels) | set(val_set.labels)))}
        val_scores, diverged = [], []
        for ft in tqdm(grid, desc=f"{name}: sweep", leave=False):
            try:
                val_scores.append(score(fit(model, fit_set, classes, ft, options.seed, crop), val_set, classes,
                                        crop)["top1"])
            except Diverged as err:  # a diverged point cannot win the sweep with a meaningless score
                val_scores.append(float("-inf"))
                diverged.append(ft)
                tqdm.write(f"{name}: sweep point lr={ft.lr:g} steps={ft.steps} dropped: {err}")
        if len(diverged) == len(grid):
            raise ConfigError(f"{name}: every point of the sweep diverged (loss not finite); sweep lower learning "
                              "rates (--sweep lr=...)")
        best = grid[val_scores.index(max(val_scores))]
        full = Labeled(fit_set.images + val_set.images, fit_set.labels + val_set.labels, crop=fit_set.crop)
        runs = [score(fit(model, full, classes, best, options.seed + run, crop), test, classes, crop)["top1"]
                for run in tqdm(range(options.runs), desc=f"{name}: runs", leave=False)]
        per_task[name] = runs
        out |= {f"{name}_top1_mean": statistics.mean(runs), f"{name}_top1_std": statistics.pstdev(runs),
                f"{name}_val_top1": max(val_scores), f"{name}_lr": best.lr, f"{name}_steps": best.steps,
                f"{name}_n_train": len(full.labels), f"{name}_n_test": len(test.labels),
                f"{name}_sweep_points": len(grid), f"{name}_sweep_diverged": len(diverged),
                f"chance_{name}_top1_mean": 1 / len(classes)}
    # the benchmark's mean over tasks, its std over the runs (run r: the mean of every task's r-th run), and each
    # group's mean over its tasks present
    by_run = [statistics.mean(runs[r] for runs in per_task.values()) for r in range(options.runs)]
    out |= {"mean_top1": statistics.mean(statistics.mean(runs) for runs in per_task.values()),
            "mean_top1_std": statistics.pstdev(by_run), "n_tasks": len(per_task), "runs": options.runs,
            "trials": len(grid)}
    for group in VTAB_GROUPS:
        mine = [statistics.mean(runs) for name, runs in per_task.items() if vtab_group(name) == group]
        if mine:
            out |= {f"{group}_top1": statistics.mean(mine), f"n_{group}": len(mine)}
    return out, {}
