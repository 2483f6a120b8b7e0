"""Evaluation tasks, chosen by name from `TASKS` or `PATH_TASKS`.

    task(model, tokenizer, data: EvalData, options: EvalOptions) -> flat metrics dict    (TASKS)
    task(model, tokenizer, path: str, options: EvalOptions) -> flat metrics dict         (PATH_TASKS)

`EvalData` holds a split's image embeddings and captions, computed once and shared by the tasks;
path tasks read their own data (scored text pairs, or images to fine-tune on).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Callable

import torch

from openalign.config import ConfigError
from openalign.eval import metrics as M
from openalign.eval.arithmetic import arithmetic
from openalign.eval.compositional import compositional
from openalign.eval.cxc import cxc
from openalign.eval.datasets import load_classnames, word_pairs
from openalign.eval.features import EvalData, EvalOptions, embed_split
from openalign.model.encode import encode_texts
from openalign.eval.finetune import finetune, vtab
from openalign.eval.multilingual import multilingual
from openalign.model.dual_encoder import DualEncoder


def retrieval(model: DualEncoder, tokenizer, data: EvalData, options: EvalOptions) -> dict:
    if not data.captions:
        raise ConfigError("the evaluation data has no captions (a classification set?): use --task zeroshot")
    txt = encode_texts(model, tokenizer, data.captions, options.batch_size, options.max_length)
    i2t = M.i2t_ranks(data.image_embeds, txt, data.text_to_image)
    t2i = M.t2i_ranks(data.image_embeds, txt, data.text_to_image)
    metrics = M.ranks_to_metrics(i2t, t2i) | M.modality_gap(data.image_embeds, txt) | {
        "shared_captions": M.shared_caption_share(data.captions, data.text_to_image)}
    chance = M.retrieval_chance(data.text_to_image, len(data.labels))
    data.figures["retrieval"] = {"i2t": i2t, "t2i": t2i, "captions_per_image": torch.bincount(
        data.text_to_image, minlength=len(data.labels)), "n_texts": len(txt)}
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
    weights = M.class_weights(encode_texts(model, tokenizer, prompts, options.batch_size, options.max_length), len(classes))  # [C, D]
    index = {c: i for i, c in enumerate(classes)}
    rows = torch.tensor([i for i, c in enumerate(data.labels) if c in index], dtype=torch.long)
    labels = torch.tensor([index[data.labels[i]] for i in rows.tolist()], dtype=torch.long)
    logits = data.image_embeds[rows] @ weights.T
    metrics = M.topk_accuracy(logits, labels)
    data.figures["zeroshot"] = {"true": labels, "predicted": logits.argmax(dim=1), "classes": [names[c] for c in classes]}
    return metrics | {"n_classes": len(classes), "n_images": len(rows), "chance_top1": 1 / len(classes),
                      "chance_top5": min(1.0, 5 / len(classes))}


def _train_split(model: DualEncoder, data: EvalData, options: EvalOptions, task: str):
    """Embeddings and integer labels of the labeled training split, and the test labels, for image-only tasks."""
    if not options.train_data:
        raise ConfigError(f"--task {task} needs --train-data (a labeled training split: folders, a table or shards)")
    train = embed_split(model, options.train_data, options, options.resize, options.crop, progress=False)
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
                                         "linear-probe": linear_probe, "cxc": cxc,
                                         "multilingual": multilingual, "arithmetic": arithmetic,
                                         "compositional": compositional}
# tasks that need nothing but the held-out split: what training may run (config eval.tasks)
HELD_OUT_TASKS = ("retrieval", "zeroshot", "multilingual", "arithmetic", "compositional")


PAIR_COLUMNS = {  # text-only tasks: (first text, second text, candidate score columns)
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
    embeds = encode_texts(model, tokenizer, texts, options.batch_size, options.max_length)
    a = embeds[[index[r[first]] for r in rows]]
    b = embeds[[index[r[second]] for r in rows]]
    cosine = (a * b).sum(dim=1).tolist()
    human = [float(r[score]) for r in rows]
    return {"spearman": float(spearmanr(cosine, human).statistic), "n_pairs": len(rows)}


def word_sim(model: DualEncoder, tokenizer, path: str, options: EvalOptions) -> dict:
    """Spearman correlation on the pairs the vocabulary covers: a word whose pieces are all [UNK] has no
    embedding of its own (every such word embeds alike), so its pairs are reported, not scored."""
    from scipy.stats import spearmanr

    file = Path(path)
    if not file.is_file():
        raise ConfigError("--task word-sim needs --data FILE (SimLex-999, WordSim-353, MEN or RW, as released)")
    pairs = word_pairs(file)
    words = sorted({w for a, b, _ in pairs for w in (a, b)})
    unk = tokenizer.unk_token_id
    known = {w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"])
             if any(i != unk for i in ids)}
    covered = [(a, b, s) for a, b, s in pairs if a in known and b in known]
    out = {"n_pairs": len(pairs), "n_covered": len(covered), "n_out_of_vocabulary": len(pairs) - len(covered)}
    if len(covered) < 2:
        raise ConfigError(f"only {len(covered)} of the {len(pairs)} pairs of {path} have words the tokenizer knows "
                          "(all-[UNK] words are not a measurement); the model's vocabulary does not cover this set")
    index = {w: i for i, w in enumerate(sorted({w for a, b, _ in covered for w in (a, b)}))}
    embeds = encode_texts(model, tokenizer, list(index), options.batch_size, options.max_length)
    a = embeds[[index[p[0]] for p in covered]]
    b = embeds[[index[p[1]] for p in covered]]
    return out | {"spearman": float(spearmanr((a * b).sum(dim=1).tolist(), [s for _, _, s in covered]).statistic)}


def sts(model: DualEncoder, tokenizer, path: str, options: EvalOptions) -> dict:
    return text_pair_similarity(model, tokenizer, path, "sts", options)


# Tasks that read --data themselves (text pairs; training on images): task(model, tokenizer, path, options).
PATH_TASKS: dict[str, Callable[..., dict]] = {"word-sim": word_sim, "sts": sts, "finetune": finetune, "vtab": vtab}


def run_tasks(model: DualEncoder, tokenizer, shards: str | list[str], tasks: list[str], options: EvalOptions,
              resize: int, crop: int, progress: bool = True, figures: dict | None = None) -> dict:
    """Flat metrics of all `tasks`: retrieval keys are bare, every other task's are prefixed with its name
    (`zeroshot_top1`, `cxc_t2t_r1`, `vtab_mean_top1`). Images are embedded once for the tasks in `TASKS`.
    `figures`, when given, receives what the report's plots need (eval/report.py)."""
    unknown = [t for t in tasks or [] if t not in TASKS and t not in PATH_TASKS]
    if unknown:
        raise ConfigError(f"unknown eval task {unknown[0]!r}; choose from {', '.join([*TASKS, *PATH_TASKS])}")
    options = dataclasses.replace(options, resize=resize, crop=crop)
    prefix = lambda name: "" if name == "retrieval" else f"{name.replace('-', '_')}_"  # noqa: E731
    out: dict = {}
    for name in [t for t in tasks or [] if t in PATH_TASKS]:
        if isinstance(shards, list):
            raise ConfigError(f"--task {name} reads its own --data file or directory")
        out |= {prefix(name) + k: v for k, v in PATH_TASKS[name](model, tokenizer, shards, options).items()}
    if tasks and all(t in PATH_TASKS for t in tasks):
        return out
    data = embed_split(model, shards, options, resize, crop, progress)
    data.extra |= {"source": shards if isinstance(shards, str) else ""}
    if figures is not None:
        data.figures = figures
    tasks = tasks or (["retrieval", "zeroshot"] if data.captions else ["zeroshot"])  # default: what the data allows
    out["n_skipped"] = data.skipped
    for name in [t for t in tasks if t in TASKS]:
        out |= {prefix(name) + k: v for k, v in TASKS[name](model, tokenizer, data, options).items()}
    return out
