"""KNN classification of the frozen image embeddings (the paper's ImageNet KNN R@1 at k=1)."""

from __future__ import annotations

import sys

import torch

from openalign.config import ConfigError
from openalign.eval import metrics as M
from openalign.eval.features import Context, train_split
from openalign.eval.options import KnnOptions

__all__ = ["KNN_GROUP", "knn", "split_by_class"]


KNN_GROUP = "family"  # the emoji corpus' held-out images: classes of variants (skin tones, genders) of one emoji


def split_by_class(data, group: str = "") -> tuple[list[int], list[int], list[str]]:
    """(train rows, test rows, class of every row) of one labelled split made its own KNN pair: each class's images,
    in split order, dealt alternately to train and test (the first to train), as `corpus emoji-eval` deals its
    class folders. The classes are the metadata `group` values (default: `family` where every image has one), else
    the labels; a class of one image has no neighbour to be found by, and is left out."""
    meta = data.meta or [{}] * len(data.labels)
    key = group or (KNN_GROUP if meta and all(m.get(KNN_GROUP) for m in meta) else "")
    if key and not all(m.get(key) for m in meta):
        raise ConfigError(f"knn.group={key}: not every image of the split has that metadata")
    classes = [str(m[key]) for m in meta] if key else list(data.labels)
    members: dict[str, list[int]] = {}
    for row, name in enumerate(classes):
        members.setdefault(name, []).append(row)
    train = [row for rows in members.values() if len(rows) > 1 for row in rows[0::2]]
    test = [row for rows in members.values() if len(rows) > 1 for row in rows[1::2]]
    return train, test, classes


def knn(ctx: Context, options: KnnOptions = KnnOptions()) -> tuple[dict, dict]:
    """KNN top-1 (the paper's ImageNet KNN R@1 at k=1) of the evaluated images against a labelled training split's,
    or, without one, within the evaluated split (`split_by_class`: what training's held-out evaluation runs)."""
    if options.train_data:
        train_x, train_y, test_y, n_classes = train_split(ctx, options.train_data, "knn")
        test_x, how = ctx.data.image_embeds, "train_data"
    else:
        train, test, classes = split_by_class(ctx.data, options.group)
        if not test:
            print("knn: no class of the evaluated split has two images, so no image has a neighbour of its class to "
                  "be found by; give labelled data (class folders) or --train-data", file=sys.stderr)
            return {}, {}
        index = {c: i for i, c in enumerate(dict.fromkeys(classes[r] for r in train))}
        to_ids = lambda rows: torch.tensor([index[classes[r]] for r in rows], dtype=torch.long)  # noqa: E731
        train_x, train_y, test_x, test_y = ctx.data.image_embeds[train], to_ids(train), ctx.data.image_embeds[test], \
            to_ids(test)
        n_classes, how = len(index), "split"
    predicted = M.knn_predict(train_x, train_y, test_x, options.k, n_classes)
    top1 = float((predicted == test_y).float().mean())
    return {"top1": top1, "k": options.k, "n_train": len(train_x), "n_test": len(test_x), "n_classes": n_classes,
            "pairs_from": how, "chance_top1": 1 / n_classes}, {}
