"""Zero-shot classification: a prompt-ensemble classifier over the labels, top-1/top-5 and mean per-class recall,
the ensemble's gain over CLIP's single prompt, and calibration under the model's own head."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from openalign.config import ConfigError
from openalign.data import sources
from openalign.eval import metrics as M
from openalign.eval import panels
from openalign.eval.datasets import label_order, load_classnames, load_templates
from openalign.eval.features import Context, embed_split
from openalign.eval.options import DEFAULT_TEMPLATES, ZeroshotOptions

__all__ = ["SINGLE_PROMPT", "calibration", "clip_benchmark", "dataset_files", "zeroshot"]


SINGLE_PROMPT = "a photo of a {}."  # CLIP's default prompt: the one the paper's +2.9% of ensembling is measured against


def zeroshot(ctx: Context, options: ZeroshotOptions = ZeroshotOptions()) -> tuple[dict, dict]:
    """Prompt-ensemble classifier over the data's labels (or a subset), top-1/top-5 on its images; with several
    templates also the top-1 of SINGLE_PROMPT alone and the ensemble's gain over it (`top1_single_prompt`,
    `ensemble_gain`)."""
    data = ctx.data
    classes = label_order(data.labels)
    options, every_class = dataset_files(ctx.path, options)
    if every_class:  # every class of the dataset competes, as in CLIP_benchmark, present in this split or not
        classes = label_order(set(classes) | set(every_class))
    if options.class_subset:
        subset = {line.strip() for line in Path(options.class_subset).read_text().splitlines() if line.strip()}
        classes = [c for c in classes if c in subset]
        if not classes:
            raise ConfigError(f"none of the labels in {options.class_subset} occur in the evaluation data")
    names = load_classnames(options.classnames, classes) if options.classnames else {c: c for c in classes}
    prompts = [t.format(names[c]) for c in classes for t in options.templates]  # class-major [C*T]
    weights = M.class_weights(ctx.encode(prompts), len(classes))  # [C, D]
    index = {c: i for i, c in enumerate(classes)}
    rows = torch.tensor([i for i, c in enumerate(data.labels) if c in index], dtype=torch.long)
    labels = torch.tensor([index[data.labels[i]] for i in rows.tolist()], dtype=torch.long)
    logits = data.image_embeds[rows] @ weights.T
    metrics = M.topk_accuracy(logits, labels) | {"mean_per_class_recall": M.mean_per_class_recall(logits, labels)}
    if len(set(options.templates)) > 1:  # the ensemble's gain over CLIP's one prompt, read in the same run
        single = M.class_weights(ctx.encode([SINGLE_PROMPT.format(names[c]) for c in classes]), len(classes))
        one = M.topk_accuracy(data.image_embeds[rows] @ single.T, labels, ks=(1,))["top1"]
        metrics |= {"top1_single_prompt": one, "ensemble_gain": metrics["top1"] - one}
    figures = {"zeroshot": {"true": labels, "predicted": logits.argmax(dim=1), "classes": [names[c] for c in classes]}
               | ({"draw": panels.confusion} if panels.confusion_worth_drawing(labels) else {})}
    if ctx.model is not None:  # probabilities at the model's own scale and head: softmax(cos / T) or sigmoid(cos / T +
                               # b)
        scores, figures["calibration"] = calibration(ctx, options, logits, labels, weights, index)
        metrics |= scores
    chance = {"chance_top1": 1 / len(classes), "chance_top5": min(1.0, 5 / len(classes)),
              "chance_mean_per_class_recall": 1 / len(classes)}
    return metrics | {"n_classes": len(classes), "n_images": len(rows)} | chance, figures


def dataset_files(path: str, options: ZeroshotOptions) -> tuple[ZeroshotOptions, list[str]]:
    """A dataset in CLIP_benchmark's layout names its classes and prompts (classnames.txt, and
    zeroshot_classification_templates.txt unless --templates chose others): the options with them, and every class
    index it has ([] for any other data)."""
    root = sources.clip_benchmark_root(path) if path else None
    if root is None:
        return options, []
    names, templates = root / "classnames.txt", root / "zeroshot_classification_templates.txt"
    every_class = []
    if names.is_file() and not options.classnames:
        options = dataclasses.replace(options, classnames=str(names))
        every_class = [str(i) for i in range(sum(1 for line in names.read_text(encoding="utf-8").splitlines()
                                                 if line.strip()))]
    if templates.is_file() and options.templates == DEFAULT_TEMPLATES:
        options = dataclasses.replace(options, templates=load_templates(str(templates)))
        print(f"zero-shot: the {len(options.templates)} prompts of {templates} (--templates to choose others)",
              file=sys.stderr)
    return options, every_class


def calibration(ctx: Context, options: ZeroshotOptions, logits, labels, weights, index) -> tuple[dict, dict]:
    """ECE (15 bins) and NLL of the zero-shot probabilities under the model's own head: softmax(cos / T) over the
    classes, or, for a model with a logit bias (SigLIP, sigmoid-trained), sigmoid(cos / T + b) of each (image,
    class) pair on its own (`sigmoid_head` 1; its NLL sums every pair's, M.nll). With `calibrate`, also after
    temperature scaling fitted on that labeled split's images (the same classifier; the sigmoid head fits its
    bias too)."""
    (temperature, bias), head = ctx.model.temperature_and_bias(), ctx.model.head
    before = M.reliability(logits / temperature + bias, labels, head=head)
    out = {"temperature": temperature, "ece": before["ece"], "nll": M.nll(logits / temperature + bias, labels, head)}
    if head == "sigmoid":
        out |= {"bias": bias, "sigmoid_head": 1}
    figure = {"draw": panels.reliability, "before": before, "head": head}
    if options.calibrate:
        on_itself = bool(ctx.path) and Path(options.calibrate).resolve() == Path(ctx.path).resolve()
        if on_itself:  # an oracle (the best any temperature can do here), not a calibration: said, and recorded
            print(f"warning: --calibrate {options.calibrate} is the evaluation data itself: the fitted temperature has "
                  "seen the answers it is scored on (an upper bound, not a calibration); give a held-out labeled "
                  "split to calibrate", file=sys.stderr)
        split = embed_split(ctx.model, options.calibrate, ctx.options, progress=False)
        rows = [i for i, c in enumerate(split.labels) if c in index]
        if not rows:
            raise ConfigError(f"none of the labels of {options.calibrate} are classes of the evaluation data")
        fit_labels = torch.tensor([index[split.labels[i]] for i in rows], dtype=torch.long)
        cosines = split.image_embeds[rows] @ weights.T
        if head == "softmax":
            fitted, fitted_bias = M.fit_temperature(cosines, fit_labels), 0.0
        else:
            fitted, fitted_bias = M.fit_sigmoid(cosines, fit_labels, temperature, bias)
            out["calibrated_bias"] = fitted_bias
        after = M.reliability(logits / fitted + fitted_bias, labels, head=head)
        out |= {"calibrated_on_evaluation_data": int(on_itself),
                "calibrated_temperature": fitted, "calibration_images": len(rows), "ece_calibrated": after["ece"],
                "nll_calibrated": M.nll(logits / fitted + fitted_bias, labels, head)}
        figure["after"] = after
    return out, figure


def clip_benchmark(metrics: dict) -> dict:
    """CLIP_benchmark's zero-shot keys; acc5 is null under 5 classes, as CLIP_benchmark writes it."""
    return {"acc1": metrics["zeroshot_top1"],
            "acc5": metrics["zeroshot_top5"] if metrics["zeroshot_n_classes"] >= 5 else None,
            "mean_per_class_recall": metrics["zeroshot_mean_per_class_recall"]}
