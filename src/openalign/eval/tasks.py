"""The evaluation tasks: one registry, one contract (in the style of big_vision's evaluators).

Each `Task` declares its name, what it reads, whether it runs on the held-out split during training, and
its own small frozen options. Its function takes a `Context` (model, tokenizer, the shared `EvalOptions`,
and the split's features, or the path the user named) and the options, and returns `(metrics, figures)`:
flat metrics, and what the report's plots need. It mutates nothing.

    reads="features"   the split's images are embedded once (eval/features.py) and shared by these tasks
    reads="path"       the task reads --data itself (scored text pairs; images to fine-tune on)

Options are set by dotted overrides, `knn.k=5 cxc.positive_score=4 finetune.recipe.lr=0.01`, or by a value
every selected task with that field takes (`configure(..., train_data=...)`: the CLI's --train-data).
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
import sys
import time
from pathlib import Path
from typing import Callable, Literal

import torch

from openalign.config import ConfigError, leaf_keys, override
from openalign.data import sources
from openalign.eval import metrics as M
from openalign.eval import panels, probes
from openalign.eval.arithmetic import arithmetic
from openalign.eval import compositional as compositional_lib
from openalign.eval import multilingual as multilingual_lib
from openalign.eval.compositional import compositional
from openalign.eval.cxc import cxc
from openalign.eval.datasets import label_order, load_classnames, load_templates, word_pair_table
from openalign.eval.features import Context, embed_split
from openalign.eval.finetune import finetune, vtab
from openalign.eval.multilingual import multilingual
from openalign.eval.options import (DEFAULT_TEMPLATES, CompositionalOptions, CxcOptions, EvalOptions, FinetuneOptions,
                                     KnnOptions, MultilingualOptions, NoOptions, ProbeOptions, RetrievalOptions,
                                     VtabOptions, ZeroshotOptions)
from openalign.loss import late_interaction_pairs
from openalign.model.dual_encoder import DualEncoder
from openalign.model.encode import device_of


@dataclass(frozen=True)
class Task:
    name: str
    run: Callable[[Context, object], tuple[dict, dict]]
    options: type = NoOptions
    reads: Literal["features", "path"] = "features"
    held_out: bool = False  # needs nothing but the held-out split: training may run it (config eval.tasks)
    meta: tuple[str, ...] = ()  # the keys of each image's metadata it reads (EvalData.meta), kept when it runs
    # its result in CLIP_benchmark's JSON, where that has one: (CLIP_benchmark's task name, metrics -> its keys)
    clip_benchmark: tuple[str, Callable[[dict], dict]] | None = None

    @property
    def prefix(self) -> str:
        """Its metrics' prefix: retrieval's keys are bare, the others' are `zeroshot_top1`, `cxc_t2t_r1`, ..."""
        return "" if self.name == "retrieval" else self.name.replace("-", "_") + "_"


def retrieval(ctx: Context, options: RetrievalOptions = RetrievalOptions()) -> tuple[dict, dict]:
    data = ctx.data
    if not data.captions:
        raise ConfigError("the evaluation data has no captions (a classification set?): use --task zeroshot")
    txt = ctx.encode(data.captions)
    start = time.perf_counter()
    i2t, t2i = M.retrieval_ranks(data.image_embeds, txt, data.text_to_image)
    pooled_s = time.perf_counter() - start
    metrics = M.ranks_to_metrics(i2t, t2i) | M.modality_gap(data.image_embeds, txt) | {
        "shared_captions": M.shared_caption_share(data.captions, data.text_to_image)} | \
        M.threshold_spread(data.image_embeds, txt, data.text_to_image)
    if options.rerank:
        metrics |= _reranked(ctx, txt, i2t, t2i, options.rerank, pooled_s)
    chance = M.retrieval_chance(data.text_to_image, len(data.labels))
    figure = {"draw": panels.retrieval, "i2t": i2t, "t2i": t2i, "captions_per_image": torch.bincount(data.text_to_image,
                                                                          minlength=len(data.labels)), "n_texts": len(txt)}
    return metrics | {f"chance_{k}": v for k, v in chance.items()}, {"retrieval": figure}


def _reranked(ctx: Context, txt: torch.Tensor, i2t: torch.Tensor, t2i: torch.Tensor, k: int, pooled_s: float
              ) -> dict:
    """R@K after re-ranking each query's pooled top k by late interaction, and the time per query of the
    pooled ranking and of the re-rank (scoring only: the encoders' time is the same for both)."""
    data = ctx.data
    if data.image_patches is None:
        raise ConfigError("retrieval.rerank needs the images' patch vectors; evaluate through run_tasks")
    tokens, mask = ctx.encode_tokens(data.captions)
    patches = data.image_patches
    patch_mask = torch.ones(patches.shape[:2], dtype=torch.bool)
    start = time.perf_counter()

    def image_queries(rows, top):  # each image against its shortlisted texts: mean over patches of max over tokens
        return late_interaction_pairs(patches[rows][:, None], patch_mask[rows][:, None], tokens[top], mask[top])[0][:, 0]

    def text_queries(rows, top):  # each text against its shortlisted images: mean over tokens of max over patches
        return late_interaction_pairs(patches[top], patch_mask[top], tokens[rows][:, None], mask[rows][:, None])[1][..., 0]

    img = data.image_embeds
    i2t_late = M.reranked_ranks(img, txt, M.captions_by_image(data.text_to_image, len(img)), i2t, image_queries, k)
    t2i_late = M.reranked_ranks(txt, img, data.text_to_image[:, None], t2i, text_queries, k)
    late_s = time.perf_counter() - start
    queries = len(img) + len(txt)
    reranked = {f"{key}_rerank": value for key, value in M.ranks_to_metrics(i2t_late, t2i_late).items()
                if not key.startswith("n_")}
    return reranked | {"rerank_k": k, "ms_per_query": 1000 * pooled_s / queries,
                       "rerank_ms_per_query": 1000 * (pooled_s + late_s) / queries,
                       "patches_per_image": patches.shape[1]}


SINGLE_PROMPT = "a photo of a {}."  # CLIP's default prompt: the one the paper's +2.9% of ensembling is measured against


def zeroshot(ctx: Context, options: ZeroshotOptions = ZeroshotOptions()) -> tuple[dict, dict]:
    """Prompt-ensemble classifier over the data's labels (or a subset), top-1/top-5 on its images; with several
    templates also the top-1 of SINGLE_PROMPT alone and the ensemble's gain over it (`top1_single_prompt`,
    `ensemble_gain`)."""
    data = ctx.data
    classes = label_order(data.labels)
    options, every_class = _dataset_files(ctx.path, options)
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
    if ctx.model is not None:  # probabilities at the model's own scale and head: softmax(cos / T) or sigmoid(cos / T + b)
        calibration, figures["calibration"] = _calibration(ctx, options, logits, labels, weights, index)
        metrics |= calibration
    return metrics | {"n_classes": len(classes), "n_images": len(rows), "chance_top1": 1 / len(classes),
                      "chance_top5": min(1.0, 5 / len(classes)), "chance_mean_per_class_recall": 1 / len(classes)}, figures


def _dataset_files(path: str, options: ZeroshotOptions) -> tuple[ZeroshotOptions, list[str]]:
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


def _calibration(ctx: Context, options: ZeroshotOptions, logits, labels, weights, index) -> tuple[dict, dict]:
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


def _train_split(ctx: Context, train_data: str, task: str, crop: int = 0):
    """Embeddings and integer labels of the labeled training split (at the evaluation's image size, or at `crop`
    with the evaluation's resize-to-crop ratio), and the test labels, for image-only tasks."""
    if not train_data:
        raise ConfigError(f"--task {task} needs --train-data (a labeled training split: folders, a table or shards)")
    data, common = ctx.data, ctx.options
    if crop and crop != common.crop:
        ratio = common.resize / common.crop if common.crop else 1.0
        common = dataclasses.replace(common, crop=crop, resize=max(crop, round(crop * ratio)))
    train = embed_split(ctx.model, train_data, common, progress=False)
    classes = {c: i for i, c in enumerate(sorted(set(train.labels) | set(data.labels)))}
    to_ids = lambda labels: torch.tensor([classes[c] for c in labels], dtype=torch.long)  # noqa: E731
    return train.image_embeds, to_ids(train.labels), to_ids(data.labels), len(classes)


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
        train_x, train_y, test_y, n_classes = _train_split(ctx, options.train_data, "knn")
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


def linear_probe(ctx: Context, options: ProbeOptions = ProbeOptions()) -> tuple[dict, dict]:
    """A linear classifier on the frozen image embeddings of the training split, scored on the evaluation split's:
    CLIP's L-BFGS (eval/probes.linear_probe, the default) or the paper's SGD recipe (eval/probes.sgd_probe). The
    training features are computed at `train_crop` when given (and cached under --cache like the evaluation's)."""
    train_x, train_y, test_y, n_classes = _train_split(ctx, options.train_data, "linear-probe", options.train_crop)
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


PAIR_COLUMNS = {  # text-only tasks: (first text, second text, candidate score columns)
    "sts": ("sentence1", "sentence2", ("score", "similarity")),  # STS / Crisscrossed-Captions STS layout
}


def text_pair_similarity(ctx: Context, task: str) -> dict:
    """Spearman correlation between the model's cosine similarity of two texts and human scores."""
    from scipy.stats import spearmanr

    first, second, score_names = PAIR_COLUMNS[task]
    path = ctx.path
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
    embeds = ctx.encode(texts)
    a = embeds[[index[r[first]] for r in rows]]
    b = embeds[[index[r[second]] for r in rows]]
    cosine = (a * b).sum(dim=1).tolist()
    human = [float(r[score]) for r in rows]
    return {"spearman": float(spearmanr(cosine, human).statistic), "n_pairs": len(rows)}


def word_sim(ctx: Context, _=None) -> tuple[dict, dict]:
    """Spearman correlation on the pairs the vocabulary covers: a word whose pieces are all [UNK] has no
    embedding of its own (every such word embeds alike), so its pairs are reported, not scored. A SimLex-999 file
    with its POS, concQ and SimAssoc333 columns also gives the paper's Appendix B sub-tasks (`spearman_nouns`,
    `spearman_conc_q1`, `spearman_hard`, ...: eval/datasets.SIMLEX_SUBTASKS), each on its covered pairs."""
    from scipy.stats import spearmanr

    path, tokenizer = ctx.path, ctx.tokenizer
    file = Path(path)
    if not file.is_file():
        raise ConfigError("--task word-sim needs --data FILE (SimLex-999, WordSim-353, MEN or RW, as released)")
    pairs, subtasks = word_pair_table(file)
    words = sorted({w for a, b, _ in pairs for w in (a, b)})
    unk = tokenizer.unk_token_id
    known = {w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"])
             if any(i != unk for i in ids)}
    covered = [i for i, (a, b, _) in enumerate(pairs) if a in known and b in known]
    out = {"n_pairs": len(pairs), "n_covered": len(covered), "n_out_of_vocabulary": len(pairs) - len(covered)}
    if len(covered) < 2:
        raise ConfigError(f"only {len(covered)} of the {len(pairs)} pairs of {path} have words the tokenizer knows "
                          "(all-[UNK] words are not a measurement); the model's vocabulary does not cover this set")
    index = {w: i for i, w in enumerate(sorted({w for i in covered for w in pairs[i][:2]}))}
    embeds = ctx.encode(index)
    cosine = {i: float(embeds[index[pairs[i][0]]] @ embeds[index[pairs[i][1]]]) for i in covered}

    def spearman(rows: list[int]) -> float:
        return float(spearmanr([cosine[i] for i in rows], [pairs[i][2] for i in rows]).statistic)

    out["spearman"] = spearman(covered)
    for name, rows in subtasks.items():
        scored = [i for i in rows if i in cosine]
        if name != "all" and len(scored) >= 2:
            out[f"spearman_{name}"] = spearman(scored)
            out[f"n_covered_{name}"] = len(scored)
    return out, {}


def sts(ctx: Context, _=None) -> tuple[dict, dict]:
    return text_pair_similarity(ctx, "sts"), {}


def retrieval_clip_benchmark(metrics: dict) -> dict:
    """CLIP_benchmark's retrieval keys: image_retrieval_recall@K is text -> image (t2i), text_retrieval_recall@K
    image -> text (i2t: a hit when any of the image's captions is in the top K, as ours)."""
    return {f"{name}_retrieval_recall@{k}": metrics[f"{way}_r{k}"]
            for name, way in (("image", "t2i"), ("text", "i2t")) for k in M.KS}


def zeroshot_clip_benchmark(metrics: dict) -> dict:
    """CLIP_benchmark's zero-shot keys; acc5 is null under 5 classes, as CLIP_benchmark writes it."""
    return {"acc1": metrics["zeroshot_top1"],
            "acc5": metrics["zeroshot_top5"] if metrics["zeroshot_n_classes"] >= 5 else None,
            "mean_per_class_recall": metrics["zeroshot_mean_per_class_recall"]}


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("retrieval", retrieval, RetrievalOptions, held_out=True,
         clip_benchmark=("zeroshot_retrieval", retrieval_clip_benchmark)),
    Task("zeroshot", zeroshot, ZeroshotOptions, held_out=True,
         clip_benchmark=("zeroshot_classification", zeroshot_clip_benchmark)),
    Task("knn", knn, KnnOptions, held_out=True, meta=(KNN_GROUP,)),
    Task("linear-probe", linear_probe, ProbeOptions),
    Task("cxc", cxc, CxcOptions),
    Task("multilingual", multilingual, MultilingualOptions, held_out=True, meta=(multilingual_lib.META,)),
    Task("arithmetic", arithmetic, held_out=True),
    Task("compositional", compositional, CompositionalOptions, held_out=True, meta=(compositional_lib.META,)),
    Task("word-sim", word_sim, reads="path"),
    Task("sts", sts, reads="path"),
    Task("finetune", finetune, FinetuneOptions, reads="path"),
    Task("vtab", vtab, VtabOptions, reads="path"),
)}
HELD_OUT_TASKS = tuple(name for name, task in TASKS.items() if task.held_out)


def clip_benchmark_metrics(metrics: dict, names: list[str]) -> dict[str, dict]:
    """{CLIP_benchmark task name: its metrics} of the tasks that ran (`names`, or the default pair) and have a form
    in CLIP_benchmark's result JSON; a task named that has none is refused in one sentence."""
    tasks = [_task(name) for name in names]
    without = [t.name for t in tasks if t.clip_benchmark is None]
    if without:
        raise ConfigError(f"CLIP_benchmark's result format holds zero-shot classification and retrieval; --task "
                          f"{', '.join(without)} has no place in it: write those with --format openalign")
    results = {}
    for task in tasks or [t for t in TASKS.values() if t.clip_benchmark]:
        name, convert = task.clip_benchmark
        try:
            results[name] = convert(metrics)
        except KeyError:  # not run (a default task the data had no use for)
            continue
    return results


def _task(name: str) -> Task:
    found = TASKS.get(name) or TASKS.get(name.replace("_", "-"))
    if found is None:
        raise ConfigError(f"unknown eval task {name!r}; choose from {', '.join(TASKS)}")
    return found


def configure(names: list[str], overrides: list[str] = (), **shared) -> dict[str, object]:
    """Each named task's options: its defaults, then every `shared` value whose name is one of its fields
    (a value that is None is not given), then the dotted overrides `task.key=value` aimed at it. A given value
    that no selected task takes is refused in one sentence (it would be ignored without a word)."""
    selected = [_task(name) for name in names]
    for key, value in shared.items():
        takers = [t.name for t in TASKS.values() if key in {f.name for f in dataclasses.fields(t.options)}]
        if value is not None and takers and not any(t.name in takers for t in selected):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} is an option of --task {' / '.join(takers)}, which is not selected "
                              f"(--task {' '.join(t.name for t in selected)}); add that task or drop {flag}")
    options = {}
    for name in names:
        task = _task(name)
        fields = {f.name for f in dataclasses.fields(task.options)}
        options[task.name] = task.options(**{k: v for k, v in shared.items() if k in fields and v is not None})
    for item in overrides:
        head, dot, rest = item.partition(".")
        task = _task(head) if dot else None
        if task is None or task.name not in options:
            raise ConfigError(f"eval override {item!r} names no selected task; write TASK.key=value for one of "
                              f"{', '.join(options) or 'the --task tasks'}")
        keys = leaf_keys(task.options)
        options[task.name] = override(options[task.name], [rest], help_hint=f"{task.name}'s options are "
                                      + (", ".join(keys) if keys else "none"))
    return options


def run_tasks(model: DualEncoder, tokenizer, data: str | list[str], names: list[str], common: EvalOptions,
              options: dict[str, object] | None = None, progress: bool = True) -> tuple[dict, dict]:
    """(flat metrics, figures) of the tasks `names` (none: retrieval and zero-shot, or zero-shot alone for a
    set without captions). The split's images are embedded once for every task that reads features."""
    tasks = [_task(n) for n in names]
    options = options or configure([t.name for t in tasks])
    path = data if isinstance(data, str) else ""
    metrics, figures = {}, {}

    def collect(task: Task, ctx: Context) -> None:
        found, drawn = task.run(ctx, options.get(task.name, task.options()))
        metrics.update({task.prefix + k: v for k, v in found.items()})
        figures.update(drawn)

    for task in (t for t in tasks if t.reads == "path"):
        if not path:
            raise ConfigError(f"--task {task.name} reads its own --data file or directory")
        collect(task, Context(model, tokenizer, common, path=path))
    if tasks and all(t.reads == "path" for t in tasks):
        return metrics, figures
    patches = any(getattr(options.get(t.name), "rerank", 0) for t in tasks)  # late interaction needs them
    meta = tuple(sorted({key for t in tasks for key in t.meta}))
    split = embed_split(model, data, common, progress, patches, meta)
    if not tasks:
        tasks = [TASKS["retrieval"], TASKS["zeroshot"]] if split.captions else [TASKS["zeroshot"]]
    metrics["n_skipped"] = split.skipped
    for task in (t for t in tasks if t.reads == "features"):
        collect(task, Context(model, tokenizer, common, split, path))
    return metrics, figures
