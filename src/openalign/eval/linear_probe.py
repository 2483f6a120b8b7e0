"""The linear probe: a classifier trained on the frozen image embeddings of a labelled split (eval/probes.py)."""

from __future__ import annotations

import torch

from openalign.eval import probes
from openalign.eval.features import Context, train_split
from openalign.eval.options import ProbeOptions
from openalign.model.encode import device_of

__all__ = ["linear_probe"]


def linear_probe(ctx: Context, options: ProbeOptions = ProbeOptions()) -> tuple[dict, dict]:
    """A linear classifier on the frozen image embeddings of the training split, scored on the evaluation split's:
    CLIP's L-BFGS (eval/probes.linear_probe, the default) or the paper's SGD recipe (eval/probes.sgd_probe). The
    training features are computed at `train_crop` when given (and cached under --cache like the evaluation's)."""
    train_x, train_y, test_y, n_classes = train_split(ctx, options.train_data, "linear-probe", options.train_crop)
    device = device_of(ctx.model)  # on the model's accelerator: a full-batch fit of ImageNet's 1.28M rows is GEMMs
    train_x, train_y = train_x.to(device, torch.float32), train_y.to(device)
    test_x, test_y = ctx.data.image_embeds.to(device, torch.float32), test_y.to(device)
    if options.solver == "sgd":
        recipe = options.sgd
        metrics = probes.sgd_probe(train_x, train_y, test_x, test_y, recipe, options.seed)
        metrics |= {"lr": recipe.lr, "epochs": recipe.epochs, "batch_size": recipe.batch_size}
    else:
        metrics = probes.linear_probe(train_x, train_y, test_x, test_y, seed=options.seed)
    return metrics | {"solver": options.solver, "train_resolution": options.train_crop or ctx.options.crop,
                      "eval_resolution": ctx.options.crop, "n_train": len(train_x), "n_classes": n_classes,
                      "chance_top1": 1 / n_classes, "chance_top5": min(1.0, 5 / n_classes)}, {}
