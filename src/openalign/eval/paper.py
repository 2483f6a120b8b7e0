"""The paper's figures (Jia et al. 2021, Tables 1-11) beside ours: one data file, `paper_tables.csv`, with each
cell's table, row, column, the model it belongs to, its value (in %) and, where the paper gives one, its std.

`beside(metrics, tasks, data, protocol)` maps an evaluation's metrics onto the cells they correspond to: by the
protocol when one was named (`--protocol imagenet-probe` is Table 5's frozen-feature column whatever the data is
called), else by the task and the dataset the --data path names (Flickr30K, MSCOCO, ImageNet and its -R/-A/-V2
variants, the four fine-grained sets, Multi30k). The studies read their rows of Tables 8-10 from the same file.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from openalign.data import tables
from openalign.eval.metrics import KS

__all__ = ["CITATION", "Cell", "beside", "cell", "cells", "dataset", "lines", "row_values"]

CITATION = "Jia et al. 2021 (ALIGN)"


@dataclass(frozen=True)
class Cell:
    table: int
    row: str
    column: str
    model: str
    value: float  # in %, as printed
    std: float | None = None

    @property
    def label(self) -> str:
        return f"Table {self.table}, {self.row}, {self.column} ({self.model})"

    def as_fraction(self) -> dict:
        """The cell in our units (fractions, as our metrics), with where it comes from."""
        return {"value": round(self.value / 100, 6), "std": None if self.std is None else round(self.std / 100, 6),
                "cell": self.label}


@functools.cache
def cells() -> tuple[Cell, ...]:
    return tuple(Cell(int(r["table"]), r["row"], r["column"], r["model"], float(r["value"]),
                      float(r["std"]) if r["std"] else None)
                 for r in tables.dicts(Path(__file__).with_name("paper_tables.csv"), ","))


def cell(table: int, row: str, column: str, model: str = "") -> Cell:
    found = [c for c in cells() if (c.table, c.row, c.column) == (table, row, column) and model in ("", c.model)]
    if len(found) != 1:
        raise KeyError(f"Table {table}: {row!r} / {column!r} / {model!r} names {len(found)} cells")
    return found[0]


def row_values(table: int, row: str, model: str = "") -> dict[str, float]:
    """{column: value in %} of one row (of one model, where a table has rows of several)."""
    return {c.column: c.value for c in cells() if (c.table, c.row) == (table, row) and model in ("", c.model)}


FINE_GRAINED = {"flowers": "Oxford Flowers", "pets": "Oxford Pets", "pet": "Oxford Pets", "cars": "Stanford Cars",
                "food": "Food101", "food101": "Food101"}


def dataset(path: str) -> str:
    """The paper's dataset that a --data path names ('' for none): its words, lower-cased."""
    words = set(re.split(r"[^a-z0-9]+", str(path).lower()))
    text = str(path).lower()
    if "flickr30k" in text or "flickr" in words:
        return "Flickr30K"
    if "coco" in text:
        return "MSCOCO"
    if "multi30k" in text:
        return "Multi30k"
    if "imagenet" in text:
        if re.search(r"imagenet[-_]?(r|rendition)\b", text):
            return "ImageNet-R"
        if re.search(r"imagenet[-_]?(a|adversarial)\b", text):
            return "ImageNet-A"
        if re.search(r"imagenet[-_]?v2", text):
            return "ImageNet-V2"
        return "ImageNet"
    return next((name for word, name in FINE_GRAINED.items() if word in words), "")


def beside(metrics: dict, data: str, protocol: str = "") -> dict[str, list[dict]]:
    """{our metric key: [the paper's cells it corresponds to, as fractions]} for the metrics present."""
    name = dataset(data)
    out: dict[str, list[Cell]] = {}

    def add(key: str, *found: Cell) -> None:
        if key in metrics and isinstance(metrics[key], (int, float)):
            out[key] = list(found)

    if protocol:  # the protocol says which cells its numbers are read against, whatever the data is called
        if protocol == "imagenet-probe":
            add("linear_probe_top1", cell(5, "ALIGN", "Acc@1 w/ frozen features"))
        elif protocol == "imagenet-finetune":
            add("finetune_top1", cell(5, "ALIGN", "Acc@1"))
            add("finetune_top5", cell(5, "ALIGN", "Acc@5"))
        elif protocol == "fine-grained":
            columns = [name] if name in FINE_GRAINED.values() else list(dict.fromkeys(FINE_GRAINED.values()))
            add("finetune_top1", *(cell(7, "ALIGN", c) for c in columns))
    elif name in ("Flickr30K", "MSCOCO"):
        for k in KS:
            add(f"i2t_r{k}", cell(1, "ALIGN zero-shot", f"{name} image-text R@{k}"))
            add(f"t2i_r{k}", cell(1, "ALIGN zero-shot", f"{name} text-image R@{k}"))
        if name == "MSCOCO":
            for ours, theirs in (("i2t", "image-text"), ("t2i", "text-image"), ("t2t", "text-text"),
                                 ("i2i", "image-image")):
                for k in KS:
                    add(f"cxc_{ours}_r{k}", cell(2, "ALIGN", f"{theirs} R@{k}"))
            for kind in ("sts", "sis", "sits"):
                add(f"cxc_{kind}_spearman_boot_mean", cell(3, "ALIGN", kind.upper()))
            add("cxc_mean_spearman", cell(3, "ALIGN", "Mean Avg"))
    elif name.startswith("ImageNet"):
        add("zeroshot_top1", cell(4, "ALIGN", name))
        if name == "ImageNet":
            add("linear_probe_top1", cell(5, "ALIGN", "Acc@1 w/ frozen features"))
            add("finetune_top1", cell(5, "ALIGN", "Acc@1"))
            add("finetune_top5", cell(5, "ALIGN", "Acc@5"))
            add("knn_top1", cell(8, "B5 + BERT-base", "ImageNet KNN R@1"))
    elif name in FINE_GRAINED.values():
        add("finetune_top1", cell(7, "ALIGN", name))
    if "vtab_mean_top1" in metrics:
        add("vtab_mean_top1", cell(6, "ALIGN", "All tasks"))
        for group in ("natural", "specialized", "structured"):
            add(f"vtab_{group}_top1", cell(6, "ALIGN", group.capitalize()))
    for language in ("en", "de", "fr", "cs"):
        add(f"multilingual_{language}_mean_recall", cell(11, "ALIGN-mling zero-shot", language))
    return {key: [c.as_fraction() for c in found] for key, found in out.items()}


def lines(paper: dict[str, list[dict]], metrics: dict) -> list[str]:
    """The terminal's block: each metric that has a paper figure, ours beside it."""
    if not paper:
        return []
    width = max(len(k) for k in paper)
    out = [f"  beside the paper ({CITATION}; its full-scale models: read the distance, not a pass/fail):"]
    for key, found in paper.items():
        theirs = "; ".join(f"{c['value']:.4f}" + (f" ± {c['std']:.4f}" if c["std"] else "") + f" ({c['cell']})"
                           for c in found)
        out.append(f"    {key:<{width}}  {metrics[key]:.4f}   paper {theirs}")
    return out
