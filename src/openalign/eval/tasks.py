"""Evaluation tasks: one signature, chosen by name from `TASKS`.

    task(model, tokenizer, data: EvalData, options: EvalOptions) -> flat metrics dict

`EvalData` holds a split's image embeddings and captions, computed once and shared by the tasks.
"""

from __future__ import annotations

import csv
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from openalign.config import ConfigError, EvalConfig
from openalign.data.loader import eval_samples
from openalign.eval import metrics as M
from openalign.eval.datasets import eval_stream, load_classnames
from openalign.model.dual_encoder import DualEncoder

# A short generic prompt set for icons and emoji (one definition: the config's default).
DEFAULT_TEMPLATES = EvalConfig().templates


@dataclass(frozen=True)
class EvalOptions:
    batch_size: int = 256
    max_length: int = 64
    templates: tuple[str, ...] = DEFAULT_TEMPLATES
    images: str = ""  # image root for Karpathy JSON / caption tables (default: beside the file)
    split: str = "test"  # Karpathy split to evaluate ("all" for every image)
    classnames: str = ""  # zero-shot: a class-names file (see datasets.load_classnames)
    class_subset: str = ""  # zero-shot: a file of labels; only these classes compete (ImageNet-R/A style)
    train_data: str = ""  # knn / linear-probe: the labeled training split (any format with labels)
    knn_k: int = 1  # knn: neighbours (1 = the paper's ImageNet KNN R@1)


@dataclass
class EvalData:
    image_embeds: torch.Tensor  # [N, D] L2-normalized
    captions: list[str]  # [M] all captions, image-major
    text_to_image: torch.Tensor  # [M] index of each caption's image
    labels: list[str]  # [N] class name of each image (json `name`), for zero-shot classification
    skipped: int = 0
    extra: dict = field(default_factory=dict)


def _device(model: DualEncoder) -> torch.device:
    return next(model.parameters()).device


@contextmanager
def evaluating(model: DualEncoder):
    """Eval mode (BatchNorm running statistics, no dropout) and no autograd; restores the mode after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def encode_texts(model: DualEncoder, tokenizer, texts: list[str], options: EvalOptions) -> torch.Tensor:
    """[len(texts), D] normalized embeddings. All texts are tokenized in one call and encoded in order
    of length, so each batch is padded only to its own longest text; rows come back in input order."""
    if not texts:
        return torch.empty(0, model.cfg.embed_dim)
    ids = tokenizer(texts, truncation=True, max_length=options.max_length)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    pad = tokenizer.pad_token_id or 0
    out = torch.empty(len(texts), model.cfg.embed_dim)
    with evaluating(model):
        for start in range(0, len(order), options.batch_size):
            rows = order[start:start + options.batch_size]
            width = max(len(ids[i]) for i in rows)
            batch = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, i in enumerate(rows):
                batch[j, :len(ids[i])] = torch.tensor(ids[i])
                mask[j, :len(ids[i])] = 1
            device = _device(model)
            out[rows] = model.encode_text(batch.to(device), mask.to(device)).embeds.float().cpu()
    return out


def embed_split(model: DualEncoder, shards: str | list[str], options: EvalOptions, resize: int, crop: int,
                progress: bool = True) -> EvalData:
    """Encode every image of the evaluation data (shards, Karpathy JSON or a caption table; see
    eval/datasets.py); captions are kept as text for the tasks."""
    counter: dict = {}
    if isinstance(shards, str):
        stream = eval_stream(shards, resize, crop, counter, options.images, options.split)
    else:
        stream = eval_samples(shards, resize, crop, counter)
    embeds, captions, owner, labels, pending = [], [], [], [], []

    def flush():
        with evaluating(model):
            embeds.append(model.encode_image(torch.stack(pending).to(_device(model))).embeds.float().cpu())
        pending.clear()

    for sample in tqdm(stream, desc="embed eval images", unit="img",
                       disable=not progress, leave=False):
        index = len(labels)
        labels.append(sample.meta.get("name") or (sample.texts[0] if sample.texts else ""))
        captions += sample.texts
        owner += [index] * len(sample.texts)
        pending.append(sample.pixels)
        if len(pending) == options.batch_size:
            flush()
    if pending:
        flush()
    if not labels:
        raise ConfigError(f"no readable evaluation images in {shards}")
    return EvalData(torch.cat(embeds), captions, torch.tensor(owner), labels, counter.get("skipped", 0))


def retrieval(model: DualEncoder, tokenizer, data: EvalData, options: EvalOptions) -> dict:
    if not data.captions:
        raise ConfigError("the evaluation data has no captions (a classification set?): use --task zeroshot")
    txt = encode_texts(model, tokenizer, data.captions, options)
    metrics = M.retrieval_metrics(data.image_embeds, txt, data.text_to_image)
    chance = M.retrieval_chance(data.text_to_image, len(data.labels))
    return metrics | {f"chance_{k}": v for k, v in chance.items()}


def zeroshot(model: DualEncoder, tokenizer, data: EvalData, options: EvalOptions) -> dict:
    """Prompt-ensemble classifier over the data's labels (or a subset), top-1/top-5 on its images."""
    classes = sorted(set(data.labels))
    if options.class_subset:
        subset = {line.strip() for line in Path(options.class_subset).read_text().splitlines() if line.strip()}
        classes = [c for c in classes if c in subset]
        if not classes:
            raise ConfigError(f"none of the labels in {options.class_subset} occur in the evaluation data")
    names = load_classnames(options.classnames, classes) if options.classnames else {c: c for c in classes}
    prompts = [t.format(names[c]) for c in classes for t in options.templates]  # class-major [C*T]
    weights = M.class_weights(encode_texts(model, tokenizer, prompts, options), len(classes))  # [C, D]
    index = {c: i for i, c in enumerate(classes)}
    rows = torch.tensor([i for i, c in enumerate(data.labels) if c in index], dtype=torch.long)
    labels = torch.tensor([index[data.labels[i]] for i in rows.tolist()], dtype=torch.long)
    metrics = M.topk_accuracy(data.image_embeds[rows] @ weights.T, labels)
    return metrics | {"n_classes": len(classes), "n_images": len(rows), "chance_top1": 1 / len(classes),
                      "chance_top5": min(1.0, 5 / len(classes))}


def _train_split(model: DualEncoder, data: EvalData, options: EvalOptions, task: str):
    """Embeddings and integer labels of the labeled training split, and the test labels, for image-only tasks."""
    if not options.train_data:
        raise ConfigError(f"--task {task} needs --train-data (a labeled training split: folders, a table or shards)")
    train = embed_split(model, options.train_data, options, data.extra["resize"], data.extra["crop"], progress=False)
    classes = {c: i for i, c in enumerate(sorted(set(train.labels) | set(data.labels)))}
    to_ids = lambda labels: torch.tensor([classes[c] for c in labels], dtype=torch.long)  # noqa: E731
    return train.image_embeds, to_ids(train.labels), to_ids(data.labels), len(classes)


def knn(model: DualEncoder, tokenizer, data: EvalData, options: EvalOptions) -> dict:
    train_x, train_y, test_y, n_classes = _train_split(model, data, options, "knn")
    predicted = M.knn_predict(train_x, train_y, data.image_embeds, options.knn_k, n_classes)
    top1 = float((predicted == test_y).float().mean())
    return {"top1": top1, "k": options.knn_k, "n_train": len(train_x), "n_classes": n_classes,
            "chance_top1": 1 / n_classes}


def linear_probe(model: DualEncoder, tokenizer, data: EvalData, options: EvalOptions) -> dict:
    train_x, train_y, test_y, n_classes = _train_split(model, data, options, "linear-probe")
    metrics = M.linear_probe(train_x.double(), train_y, data.image_embeds.double(), test_y)
    return metrics | {"n_train": len(train_x), "n_classes": n_classes, "chance_top1": 1 / n_classes,
                      "chance_top5": min(1.0, 5 / n_classes)}


TASKS: dict[str, Callable[..., dict]] = {"retrieval": retrieval, "zeroshot": zeroshot, "knn": knn,
                                         "linear-probe": linear_probe}


PAIR_COLUMNS = {  # text-only tasks: (first text, second text, candidate score columns)
    "word-sim": ("word1", "word2", ("SimLex999", "score", "similarity")),  # SimLex-999 layout
    "sts": ("sentence1", "sentence2", ("score", "similarity")),  # STS / Crisscrossed-Captions STS layout
}


def text_pair_similarity(model: DualEncoder, tokenizer, path: str, task: str, options: EvalOptions) -> dict:
    """Spearman correlation between the model's cosine similarity of two texts and human scores."""
    from scipy.stats import spearmanr

    first, second, score_names = PAIR_COLUMNS[task]
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--task {task} needs --data FILE (a CSV/TSV with {first}, {second} and a score)")
    with open(file, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t" if file.suffix in (".tsv", ".txt") else ","))
    score = next((c for c in score_names if rows and c in rows[0]), None)
    if not rows or first not in rows[0] or second not in rows[0] or score is None:
        raise ConfigError(f"{path} needs the columns {first}, {second} and one of {', '.join(score_names)}")
    texts = sorted({r[first] for r in rows} | {r[second] for r in rows})
    index = {t: i for i, t in enumerate(texts)}
    embeds = encode_texts(model, tokenizer, texts, options)
    a = embeds[[index[r[first]] for r in rows]]
    b = embeds[[index[r[second]] for r in rows]]
    cosine = (a * b).sum(dim=1).tolist()
    human = [float(r[score]) for r in rows]
    return {"spearman": float(spearmanr(cosine, human).statistic), "n_pairs": len(rows)}


def run_tasks(model: DualEncoder, tokenizer, shards: str | list[str], tasks: list[str], options: EvalOptions,
              resize: int, crop: int, progress: bool = True) -> dict:
    """Flat metrics of all `tasks`; zero-shot keys are prefixed `zeroshot_`, retrieval keys are bare."""
    unknown = [t for t in tasks or [] if t not in TASKS and t not in PAIR_COLUMNS]
    if unknown:
        raise ConfigError(f"unknown eval task {unknown[0]!r}; choose from {', '.join([*TASKS, *PAIR_COLUMNS])}")
    text_only = [t for t in tasks or [] if t in PAIR_COLUMNS]
    if text_only:  # scored text pairs: no images to embed
        if len(text_only) != len(tasks) or isinstance(shards, list):
            raise ConfigError(f"--task {text_only[0]} reads a file of text pairs; run it on its own")
        return {f"{t.replace('-', '_')}_{k}": v for t in text_only
                for k, v in text_pair_similarity(model, tokenizer, shards, t, options).items()}
    data = embed_split(model, shards, options, resize, crop, progress)
    data.extra |= {"resize": resize, "crop": crop}
    tasks = tasks or (["retrieval", "zeroshot"] if data.captions else ["zeroshot"])  # default: what the data allows
    out: dict = {"n_skipped": data.skipped}
    for name in tasks:
        prefix = "" if name == "retrieval" else f"{name.replace('-', '_')}_"
        out |= {prefix + k: v for k, v in TASKS[name](model, tokenizer, data, options).items()}
    return out


def markdown_table(metrics: dict) -> str:
    rows = ["| metric | value | chance |", "|---|---|---|"]
    for key, value in metrics.items():
        if key.startswith("chance_") or "chance_" in key:
            continue
        chance = metrics.get(M.chance_key(key))
        fmt = (lambda v: f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
        rows.append(f"| {key} | {fmt(value)} | {fmt(chance) if chance is not None else ''} |")
    return "\n".join(rows) + "\n"


def write_report(metrics: dict, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown_table(metrics))
