"""`openalign study failure-modes`: where contrastive training fails, measured against what the standard teaching of
CLIP-style models states with numbers (../shared/contrastive-failure-modes.md; docs/results.md has the readings).

Each part is a function of the options and the seeds that returns its rows, its figure and its reading; `--only`
picks parts. Parts so far:

- `composition-toy`: the teaching's composition toy, as it states it. 4 colours x 5 shapes; an image is a noisy
  sum of a colour vector and a shape vector in R^32; a caption is a bag of words over 15 (4 colours, 5 shapes,
  6 fillers). 16 combinations are trained on, 4 held out (red star, green ring, blue cone, yellow ball). The text
  tower is a bag of words (the mean of word embeddings, then a projection); the image tower one linear map, or
  one hidden layer; both normalized, the log of the logit scale learned and capped at 100 (from 10), row plus
  column cross-entropy. The claim: the deeper tower fits the seen pairs better (training loss 0.05 against 0.10)
  and composes worse (85% of the held-out combinations recognised against 96%). A study-local model, not a tower
  kind of openalign's.
- `deeper-tower`: the same question with openalign's towers on the built-in shapes corpus (8 of its 64 colour-shape
  pairs never trained on): a shallower against a deeper EfficientNet (`model.vision.depth_coefficient`), each
  trained at the same budget and recipe (`depth_overrides`: 1,000 steps at peak lr 2e-3 over 200 warmup steps; under
  the demo's 5e-3 over 50 the deeper tower is still half-trained at 1,000 steps, and a trained model against an
  untrained one says nothing about composition); zero-shot top-1 on the unseen pairs against the seen ones
  (eval/compositional.py), and the final training loss.
- `generic-captions`: the PMI study's table (study/pmi.py) with generic captions added, captions that go with every
  image as often as the image occurs ("image", "photo", "click here"), half of all pairs. The claim: a dual
  encoder trained contrastively approximates PMI plus a constant, and PMI divides by p(y), so a caption that goes
  with everything scores near zero: never the best caption of an image, although it is the most frequent one for
  every image. The in-batch softmax learns this alone, as popular captions are negatives in proportion to their
  frequency.
- `rerank-cost`: pooled search against late-interaction re-ranking, measured. A model's embeddings of a collection
  with patch vectors (`embed --patches`), an exact index, then per text query: the pooled search, and FILIP's
  re-rank of the top K (each token's best patch) for several K; and the cost of embedding one image. From the
  measured constants, the query count Q* at which re-ranking the top K costs as much as embedding the collection
  once (M images): Q* = M t_image / t_rerank(K). The teaching's two-stage argument: shortlist with the dual encoder,
  re-rank a few dozen with a scorer that reads both; a fusion pass at 0.1% of the towers' cost breaks even with the
  dual encoder at about 900 queries for M = 10,000.
- `concept-frequency`: zero-shot accuracy against how often a class's words occur in training. For each (model,
  training shards, held-out shards) set: every held-out image classified among all the held-out class names (its
  own caption: emoji's CLDR name, openclipart's title), and its class's training frequency (the count of its rarest
  word in the training captions); accuracy by frequency bin, and the fitted slope per decade of frequency. The
  teaching: zero-shot accuracy follows how often a concept was seen (roughly log-linearly).
- `relations`: word order and relations. Models trained with openalign's towers on the shapes corpus's relation
  scenes ("a red circle left of a blue square"), with the paper's loss and with FILIP's; each held-out scene's
  caption against the same words with the objects swapped, by the pooled score and by late interaction (each token's
  best patch). Nothing in a pooled score compares roles, and late interaction does not either (each token picks its
  patch alone): the teaching expects both near chance (50%).
- `several-objects`: scenes of two or three shapes captioned by one of them. Held out: for each scene, how many of
  the shapes it shows its top captions name (among the 56 single-shape captions), and how the zero-shot
  probability splits between the shapes shown, by the softmax's scale: the teaching says that at scale 100 a cosine
  gap of 0.16 becomes a logit gap of 16 and the probability goes almost all to one class, although the image shows
  both.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import torch
import torch.nn.functional as F
from tqdm import tqdm

from openalign import loss as loss_lib
from openalign.config import POSITIVE, POSITIVE_INT, POSITIVE_INTS, Rule, at_least

POSITIVE_FLOATS = Rule(lambda v: len(v) > 0 and all(x > 0 for x in v), "positive numbers, at least one")
from openalign.study.report import save_figure

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("star", "ring", "cone", "ball", "cube")
FILLERS = ("a", "the", "photo", "of", "small", "picture")
HELD_OUT = (("red", "star"), ("green", "ring"), ("blue", "cone"), ("yellow", "ball"))
VOCAB = COLOURS + SHAPES + FILLERS  # 15 words
TOWERS = {"linear": "one linear map (32→8)", "hidden": "one hidden layer (32→64→8)"}
PARTS = ("composition-toy", "deeper-tower", "generic-captions", "rerank-cost", "concept-frequency", "relations",
         "several-objects")
SHARE = Rule(lambda v: 0 < v < 1, "a share of all pairs, in (0, 1)")


@dataclass(frozen=True)
class FailureOptions:
    parts: tuple[str, ...] = PARTS  # the parts to run
    toy_dim: Annotated[int, POSITIVE_INT] = 32  # composition toy: the image features' width
    toy_embed: Annotated[int, POSITIVE_INT] = 8  # composition toy: the shared embedding's width
    toy_hidden: Annotated[int, POSITIVE_INT] = 64  # composition toy: the deeper image tower's hidden width
    toy_noise: Annotated[float, POSITIVE] = 1.0  # composition toy: the image noise's norm against the colour and shape vectors' (each about 1)
    toy_steps: Annotated[int, POSITIVE_INT] = 3_000  # composition toy: Adam steps, each a batch of the 16 seen combinations
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
    scene_per_combo: Annotated[int, POSITIVE_INT] = 40  # relations, several objects: training scenes per seen combination
    scene_overrides: tuple[str, ...] = ("train.steps=300", "train.eval_every=0", "train.checkpoint_every=0",
                                        "model.vision.image_size=64", "model.vision.resize_size=72")  # their budget
    scene_scales: Annotated[tuple[int, ...], POSITIVE_INTS] = (1, 10, 30, 100)  # several objects: softmax scales
    depths: Annotated[tuple[float, ...], POSITIVE_FLOATS] = (0.25, 1.0)  # deeper tower: EfficientNet depth coefficients
    depth_overrides: tuple[str, ...] = ("train.steps=1000", "optim.lr=2e-3", "optim.warmup_steps=200")  # deeper tower: after the scenes' budget, a recipe both depths train under (at the demo's lr 5e-3 depth 1.0 does not)


# Options added after results were first written, each with the value that ran before it existed: a results.json
# from an older version is reported as it ran, not with today's defaults.
BEFORE = {"depth_overrides": ()}
QUICK = ("toy_steps=1000", "toy_test=100", "generic_steps=600", "rerank_queries=10")  # --quick: about a minute


class BagOfWords(torch.nn.Module):
    """The toy's text tower: the mean of the caption's word embeddings, then a projection."""

    def __init__(self, words: int, width: int):
        super().__init__()
        self.words = torch.nn.EmbeddingBag(words, width, mode="mean")
        self.project = torch.nn.Linear(width, width)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.project(self.words(ids, offsets))


def _captions(pairs: list[tuple[str, str]], g: torch.Generator, fillers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bag-of-words captions of (colour, shape) pairs: the two words and 0..fillers filler words, as the ids and
    offsets an EmbeddingBag takes."""
    ids, offsets = [], []
    for colour, shape in pairs:
        extra = int(torch.randint(0, fillers + 1, (1,), generator=g))
        words = [VOCAB.index(colour), VOCAB.index(shape)] + [len(COLOURS) + len(SHAPES) + int(i) for i in
                                                             torch.randint(0, len(FILLERS), (extra,), generator=g)]
        offsets.append(len(ids))
        ids += words
    return torch.tensor(ids), torch.tensor(offsets)


def composition_toy_run(options: FailureOptions, tower: str, seed: int) -> dict:
    """One training of the toy: its final training loss and the held-out combinations recognised (each fresh image
    of a held-out pair classified among the 20 pairs' two-word captions)."""
    g = torch.Generator().manual_seed(seed)
    d, e = options.toy_dim, options.toy_embed
    colour_vectors = torch.randn(len(COLOURS), d, generator=g) / math.sqrt(d)
    shape_vectors = torch.randn(len(SHAPES), d, generator=g) / math.sqrt(d)
    scale_noise = options.toy_noise / math.sqrt(d)

    def images(pairs: list[tuple[str, str]]) -> torch.Tensor:
        c = torch.stack([colour_vectors[COLOURS.index(a)] for a, _ in pairs])
        s = torch.stack([shape_vectors[SHAPES.index(b)] for _, b in pairs])
        return c + s + scale_noise * torch.randn(len(pairs), d, generator=g)

    torch.manual_seed(seed)
    image_tower = torch.nn.Linear(d, e) if tower == "linear" else \
        torch.nn.Sequential(torch.nn.Linear(d, options.toy_hidden), torch.nn.ReLU(), torch.nn.Linear(options.toy_hidden, e))
    text_tower = BagOfWords(len(VOCAB), e)
    log_scale = torch.nn.Parameter(torch.tensor(math.log(10.0)))
    optimizer = torch.optim.Adam([*image_tower.parameters(), *text_tower.parameters(), log_scale], lr=options.toy_lr)
    seen = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in HELD_OUT]
    losses = []
    for _ in range(options.toy_steps):
        x = F.normalize(image_tower(images(seen)), dim=1)
        y = F.normalize(text_tower(*_captions(seen, g, options.toy_fillers)), dim=1)
        scale = log_scale.clamp(max=math.log(100.0)).exp()  # the cap: no gradient past it
        loss = loss_lib.contrastive_loss(x, y, 1 / scale, label_smoothing=0.0, implementation="naive")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    every = [(c, s) for c in COLOURS for s in SHAPES]
    with torch.no_grad():
        prompts = F.normalize(text_tower(torch.tensor([VOCAB.index(w) for p in every for w in p]),
                                         torch.arange(0, 2 * len(every), 2)), dim=1)
        right, shown = 0, 0
        for pair in HELD_OUT:
            found = (F.normalize(image_tower(images([pair] * options.toy_test)), dim=1) @ prompts.T).argmax(dim=1)
            right += int((found == every.index(pair)).sum())
            shown += options.toy_test
        seen_found = (F.normalize(image_tower(images(seen * 10)), dim=1) @ prompts.T).argmax(dim=1)
        seen_right = float((seen_found == torch.tensor([every.index(p) for p in seen * 10])).float().mean())
    tail = losses[-max(1, len(losses) // 20):]  # the last 5% of steps: a batch's loss is noisy
    return {"final_loss": statistics.fmean(tail), "heldout_accuracy": right / shown, "seen_accuracy": seen_right,
            "logit_scale": float(log_scale.detach().clamp(max=math.log(100.0)).exp()), "curve": losses[::max(1, len(losses) // 200)]}


def composition_toy(options: FailureOptions, seeds: int, progress: bool) -> dict:
    jobs = [(tower, seed) for tower in TOWERS for seed in range(seeds)]
    runs: dict = {tower: [] for tower in TOWERS}
    for tower, seed in tqdm(jobs, desc="composition toy", unit="run", disable=not progress):
        runs[tower].append(composition_toy_run(options, tower, seed))
    summary = {}
    for tower, rows in runs.items():
        keys = ("final_loss", "heldout_accuracy", "seen_accuracy", "logit_scale")
        summary[tower] = {"mean": {k: statistics.fmean(r[k] for r in rows) for k in keys},
                          "std": {k: statistics.pstdev(r[k] for r in rows) for k in keys},
                          "curves": [r["curve"] for r in rows]}
    return {"towers": summary, "claim": {"linear": {"heldout_accuracy": 0.96, "final_loss": 0.10},
                                         "hidden": {"heldout_accuracy": 0.85, "final_loss": 0.05}}}


def _toy_figure(result: dict, options: FailureOptions, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (tower, label), colour in zip(TOWERS.items(), ("tab:blue", "tab:orange")):
        for i, curve in enumerate(result["towers"][tower]["curves"]):
            steps = [j * max(1, options.toy_steps // 200) for j in range(len(curve))]
            curves.plot(steps, curve, color=colour, alpha=0.35, lw=0.8, label=label if i == 0 else None)
    curves.set(yscale="log", xlabel="step", ylabel="training loss (batch of the 16 seen pairs)",
               title="training loss")
    curves.grid(alpha=0.3)
    names = list(TOWERS)
    ours = [result["towers"][t]["mean"]["heldout_accuracy"] for t in names]
    errors = [result["towers"][t]["std"]["heldout_accuracy"] for t in names]
    claims = [result["claim"][t]["heldout_accuracy"] for t in names]
    bars.bar([i - 0.2 for i in range(len(names))], ours, 0.4, yerr=errors, capsize=3, label="openalign (this run)")
    bars.bar([i + 0.2 for i in range(len(names))], claims, 0.4, color="lightgrey", label="the teaching's figure")
    bars.set_xticks(range(len(names)), [TOWERS[t] for t in names], fontsize=8)
    bars.set(ylabel="held-out combinations recognised", ylim=(0, 1.05),
             title="composing unseen colour-shape pairs (chance 1/20)")
    bars.grid(alpha=0.3, axis="y")
    save_figure(fig, path, legend_axes=[curves, bars])


def _toy_reading(result: dict) -> list[str]:
    """The claim has two halves, read apart: the deeper tower fits the seen pairs better, and composes worse."""
    t = result["towers"]
    lin, deep = t["linear"]["mean"], t["hidden"]["mean"]
    spread = t["hidden"]["std"]["heldout_accuracy"]
    fits = deep["final_loss"] < lin["final_loss"]
    composes_worse = deep["heldout_accuracy"] < lin["heldout_accuracy"]
    return [f"Fit: the deeper image tower's training loss is {deep['final_loss']:.3f} against the linear one's "
            f"{lin['final_loss']:.3f} (the teaching: 0.05 against 0.10): "
            + ("it fits the seen pairs better, as claimed." if fits else
               "it does not fit them better here; both reach a loss near zero on the 16 seen pairs.") + " "
            f"Composition: {deep['heldout_accuracy']:.0%} of the held-out pairs against {lin['heldout_accuracy']:.0%} "
            f"(the teaching: 85% against 96%): " + (
                "the deeper tower composes worse, as claimed, and its seeds spread wider "
                f"(± {spread:.0%}): a hidden layer can carve out the seen pairs themselves, where a linear map can only "
                "add a colour direction to a shape direction, which is what an unseen pair is." if composes_worse else
                "the deeper tower does not compose worse here.")]


def _depth_reading(result: dict) -> list[str]:
    """The toy's two halves on openalign's towers, the deepest EfficientNet against the shallowest: both must fit
    the seen pairs before the unseen ones say anything about composition."""
    rows = result["depths"]
    shallow, deep = (rows[k] for k in (min(rows, key=float), max(rows, key=float)))
    s, d = shallow["mean"], deep["mean"]
    spread = max(shallow["std"]["compositional_unseen_top1"], deep["std"]["compositional_unseen_top1"])
    trained = min(s["compositional_seen_top1"], d["compositional_seen_top1"]) >= 0.9
    gap = s["compositional_unseen_top1"] - d["compositional_unseen_top1"]
    fit = (f"Fit: the deeper tower reaches {d['compositional_seen_top1']:.1%} of the seen pairs against "
           f"{s['compositional_seen_top1']:.1%}, final training loss {d['final_loss']:.3f} against "
           f"{s['final_loss']:.3f}: ")
    if not trained:
        return [fit + "one of them has not fitted the seen pairs, so this budget compares a trained model with an "
                "untrained one and says nothing about composition yet."]
    return [fit + "both fit the seen pairs. " +
            f"Composition: the unseen pairs at {d['compositional_unseen_top1']:.1%} against "
            f"{s['compositional_unseen_top1']:.1%}: " +
            (f"the deeper tower composes worse, by more than the wider seed spread (± {spread:.1%})." if gap > spread
             else f"no difference outside the seeds' spread (± {spread:.1%}).")]


def generic_captions(options: FailureOptions, seeds: int, progress: bool) -> dict:
    """The PMI study's table plus generic captions; free unit vectors trained by openalign's loss (pmi.train_scores)
    and compared with PMI: each caption's frequency and its learned score less the best constant, and how often a
    generic caption is an image's best by the learned scores, by PMI and by plain co-occurrence (the likelihood a
    captioning model would learn)."""
    import numpy as np

    from openalign.study import pmi

    table_options = pmi.PmiOptions(steps=options.generic_steps, widths=(options.generic_width,))
    counts = pmi.count_table(table_options)
    rng = np.random.default_rng(table_options.table_seed + 1)
    px = counts.sum(axis=1) / counts.sum()
    per_generic = options.generic_share / (1 - options.generic_share) * counts.sum() / options.generic
    generic = rng.poisson(np.outer(px, np.full(options.generic, per_generic))) + 1.0  # independent of the image
    table = np.concatenate([counts, generic], axis=1)
    first = counts.shape[1]
    truth = pmi.pmi_matrix(table)
    runs = []
    for seed in tqdm(range(seeds), desc="generic captions", unit="run", disable=not progress):
        scores = pmi.train_scores(table, options.generic_width, "both", table_options, seed)
        centred = scores - (scores - truth).mean()  # the one constant the loss is blind to
        runs.append({"generic_score": float(centred[:, first:].mean()), "specific_score": float(centred[:, :first].mean()),
                     "specific_best": float(centred.max(axis=1).mean()),
                     "generic_best_share": float((scores.argmax(axis=1) >= first).mean()),
                     "column_scores": centred.mean(axis=0).tolist()})
    frequency = (table.sum(axis=0) / table.sum()).tolist()
    keys = ("generic_score", "specific_score", "specific_best", "generic_best_share")
    return {"first_generic": first, "frequency": frequency, "pmi_columns": truth.mean(axis=0).tolist(),
            "pmi_generic": float(truth[:, first:].mean()), "pmi_generic_best_share": float((truth.argmax(axis=1) >=
                                                                                           first).mean()),
            "count_generic_best_share": float((table.argmax(axis=1) >= first).mean()),
            "mean": {k: statistics.fmean(r[k] for r in runs) for k in keys},
            "std": {k: statistics.pstdev(r[k] for r in runs) for k in keys},
            "column_scores": [statistics.fmean(r["column_scores"][j] for r in runs) for j in range(table.shape[1])]}


def _paired_bars(rows: dict, series: tuple[tuple[str, str], ...], ticks: list[str], chance: float, path: Path,
                 **axes) -> None:
    """Two metrics side by side for each row of a study part (`rows`: name -> {"mean", "std"}), the seeds' spread as
    error bars and chance as a dashed line; `axes` are matplotlib's axis settings (ylabel, title, ylim)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, (key, label) in enumerate(series):
        ax.bar([j + 0.4 * i for j in range(len(names))], [rows[x]["mean"][key] for x in names], 0.4,
               yerr=[rows[x]["std"][key] for x in names], capsize=3, label=label)
    ax.axhline(chance, color="k", ls="--", lw=0.8, label="chance")
    ax.set_xticks([j + 0.2 for j in range(len(names))], ticks)
    ax.set(**axes)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path, legend_axes=[ax])


def _depth_figure(result: dict, path: Path) -> None:
    """Zero-shot top-1 on the unseen and the seen colour-shape pairs, by depth coefficient, with the seeds' spread."""
    rows = result["depths"]
    _paired_bars(rows, (("compositional_unseen_top1", "unseen pairs"), ("compositional_seen_top1", "seen pairs")),
                 [f"depth {d}" for d in rows], next(iter(rows.values()))["chance"], path, ylim=(0, 1.05),
                 ylabel="zero-shot top-1 over the 64 pairs", title="composition by image-tower depth")


def _generic_figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = result["first_generic"]
    fig, ax = plt.subplots(figsize=(6, 4))
    freq, learned, pmi_cols = result["frequency"], result["column_scores"], result["pmi_columns"]
    ax.scatter(freq[:first], learned[:first], label="captions of the table: learned score", color="tab:blue")
    ax.scatter(freq[first:], learned[first:], label="generic captions: learned score", color="tab:red", marker="s")
    ax.scatter(freq, pmi_cols, label="PMI (the target)", facecolors="none", edgecolors="k", s=30)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="caption frequency p(y)", ylabel="mean over images of the score\n(less the one constant)",
           title="a caption that goes with everything scores near zero")
    ax.grid(alpha=0.3)
    save_figure(fig, path, legend_axes=[ax], legend_size=7)


def rerank_cost(options: FailureOptions, out: Path, progress: bool) -> dict:
    """The measured constants of pooled search and late-interaction re-ranking (one run: timings, not seeds)."""
    import time

    from openalign.config import ConfigError
    from openalign.index import build, search
    from openalign.index.embed import EmbedOptions, embed

    model_dir = Path(options.rerank_model)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"rerank-cost needs a model at {model_dir} (run `make demo`, or give rerank_model=DIR)")
    import os

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)  # as `search` and `serve` run (the toy parts use one)
    emb, index_dir = out / "rerank-emb", out / "rerank-index"
    start = time.perf_counter()
    manifest = embed(model_dir, [options.rerank_images], emb, EmbedOptions(patches=True), progress=progress)
    embed_seconds = time.perf_counter() - start
    fresh = manifest.resumed_parts == 0
    build.build(emb, index_dir)
    index = build.load(index_dir)
    model, tokenizer = search.load_model_for(index, str(model_dir))
    patches = search.patch_store(index)
    words = [w for row in index.meta.take(list(range(min(len(index.meta), 400)))).to_pylist()
             for w in (row.get("caption") or "").split()[:3]] or ["image"]
    queries = [" ".join(words[(7 * i) % len(words):(7 * i) % len(words) + 2]) or "image"
               for i in range(options.rerank_queries)]
    pooled, reranks = [], {k: [] for k in options.rerank_shortlists}
    deepest = max(options.rerank_shortlists)
    for text in queries:
        query = search.Query(text=text)
        t0 = time.perf_counter()
        hits = search.nearest(index, search.query_vector(model, tokenizer, query, index), deepest)
        pooled.append(time.perf_counter() - t0)
        for k in options.rerank_shortlists:
            t0 = time.perf_counter()
            search.rerank_hits(model, tokenizer, query, hits[:k], patches, k)
            reranks[k].append(time.perf_counter() - t0)
    count = index.index.ntotal
    per_image = embed_seconds / max(1, manifest.count) if fresh else None
    median = statistics.median
    result = {"images": count, "embed_seconds_per_image": per_image, "pooled_seconds": median(pooled),
              "rerank_seconds": {str(k): median(v) for k, v in reranks.items()},
              "patches_per_image": manifest.patches_per_image or None, "queries": len(queries), "threads": threads}
    if per_image:
        result["break_even_queries"] = {str(k): count * per_image / median(v) for k, v in reranks.items()}
    return result


def _rerank_figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [int(k) for k in result["rerank_seconds"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [1e3 * result["rerank_seconds"][str(k)] for k in ks], marker="o",
            label="late-interaction re-rank of the top K")
    ax.axhline(1e3 * result["pooled_seconds"], color="k", ls="--", label="pooled search (text encoding + exact scan)")
    ax.set(xscale="log", yscale="log", xlabel="K re-ranked", ylabel="ms per query",
           title=f"per-query cost over {result['images']:,} images")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.grid(alpha=0.3)
    save_figure(fig, path, legend_axes=[ax], legend_size=8)


def _words(text: str) -> list[str]:
    import re

    return [w for w in re.split(r"[^0-9a-z]+", text.lower()) if w]


def concept_frequency(options: FailureOptions, progress: bool) -> dict:
    """Per set: each held-out image's zero-shot hit (its own name ranked first among all held-out names) and its
    class's training frequency; accuracy by frequency bin and the least-squares slope per decade."""
    from collections import Counter

    import numpy as np

    import openalign
    from openalign.config import ConfigError
    from openalign.data import images as image_lib
    from openalign.data.tars import BadSample, all_texts, image_bytes, list_shards, read_samples, sample_texts

    sets = list(zip(options.frequency_models, options.frequency_train, options.frequency_eval))
    if not sets or len({len(options.frequency_models), len(options.frequency_train), len(options.frequency_eval)}) > 1:
        raise ConfigError("concept-frequency: give as many frequency_models as frequency_train and frequency_eval")
    results = {}
    for model_dir, train, evaluation in tqdm(sets, desc="concept frequency", unit="set", disable=not progress):
        if not (Path(model_dir) / "config.json").is_file():
            raise ConfigError(f"concept-frequency needs a model at {model_dir} (run `make demo`, or give "
                              "frequency_models=DIR)")
        counts = Counter(w for text in all_texts(list_shards(train)) for w in _words(text))
        images, names = [], []
        for sample in read_samples(list_shards(evaluation)):
            try:
                name, image = sample_texts(sample)[0], image_lib.load_rgb(image_bytes(sample))
            except (BadSample, image_lib.BadImage, KeyError):
                continue
            images.append(image)
            names.append(name)
        classes = sorted(set(names))
        model = openalign.load(model_dir)
        scores = model.encode_images(images) @ model.encode_texts(classes).T
        hits = (scores.argmax(dim=1) == torch.tensor([classes.index(n) for n in names])).float().numpy()
        # a class's frequency: the training count of its rarest word (the word that names it: "grinning" more than
        # "face"); the mean count of its words beside it
        frequency = np.array([min([counts.get(w, 0) for w in _words(n)] or [0]) for n in names])
        mean_count = np.array([statistics.fmean([counts.get(w, 0) for w in _words(n)] or [0]) for n in names])
        x = np.log10(1 + frequency)
        slope, intercept = np.polyfit(x, hits, 1) if x.std() > 0 else (0.0, float(hits.mean()))
        x_mean = np.log10(1 + mean_count)
        slope_mean = float(np.polyfit(x_mean, hits, 1)[0]) if x_mean.std() > 0 else 0.0
        bins = []
        for lo, hi in ((0, 1), (1, 10), (10, 100), (100, 1_000), (1_000, 10_000), (10_000, float("inf"))):  # decades
            inside = (frequency >= lo) & (frequency < hi)
            if inside.any():
                bins.append({"low": lo, "high": hi, "images": int(inside.sum()), "accuracy": float(hits[inside].mean()),
                             "centre": float(x[inside].mean())})
        results[f"{Path(evaluation).parent.name or evaluation}"] = {
            "model": str(model_dir), "images": len(names), "classes": len(classes), "chance": 1 / len(classes),
            "accuracy": float(hits.mean()), "slope_per_decade": float(slope), "intercept": float(intercept),
            "slope_per_decade_mean_count": slope_mean,
            "unseen_share": float((frequency == 0).mean()), "bins": bins}
    return {"sets": results}


def _frequency_figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in result["sets"].items():
        xs = [b["centre"] for b in row["bins"]]
        line = ax.plot(xs, [b["accuracy"] for b in row["bins"]], marker="o", label=f"{name}: binned")[0]
        ax.plot(xs, [row["intercept"] + row["slope_per_decade"] * x for x in xs], ls="--", color=line.get_color(),
                label=f"{name}: fit, {row['slope_per_decade']:+.3f} per decade")
        ax.axhline(row["chance"], color=line.get_color(), lw=0.6, ls=":")
    ax.set(xlabel="log10(1 + training count of the class's rarest word)", ylabel="zero-shot top-1",
           title="zero-shot accuracy against concept frequency")
    ax.grid(alpha=0.3)
    save_figure(fig, path, legend_axes=[ax], legend_size=7)


def _scene_model(options: FailureOptions, scene: str, loss: str, seed: int, out: Path) -> Path:
    """A model trained on the shapes corpus's `scene` scenes (resumable: study/runner.py's run_one)."""
    import dataclasses

    from openalign import config as config_lib
    from openalign import presets
    from openalign.study.runner import run_one

    cfg = config_lib.override(presets.get(options.scene_preset), [
        "data.corpus=shapes", f"data.corpus_options=scene={scene},per_combo={options.scene_per_combo}",
        f"loss.kind={loss}", *options.scene_overrides])
    run = out / f"{scene}-{loss}" / f"seed{seed}"
    run_one(dataclasses.replace(cfg, seed=seed), run)
    return run / "model"


def deeper_tower(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Shallower against deeper EfficientNets on the shapes corpus: unseen-pair and seen-pair zero-shot top-1."""
    import dataclasses

    from openalign import config as config_lib
    from openalign import presets
    from openalign.study.compositional import SHAPES_EVAL
    from openalign.study.runner import run_one

    rows: dict = {}
    jobs = [(depth, seed) for depth in options.depths for seed in range(seeds)]
    for depth, seed in tqdm(jobs, desc="deeper tower", unit="run", disable=not progress):
        cfg = config_lib.override(presets.get(options.scene_preset), [
            "data.corpus=shapes", *SHAPES_EVAL, f"model.vision.depth_coefficient={depth}",
            *options.scene_overrides, *options.depth_overrides])
        result = run_one(dataclasses.replace(cfg, seed=seed), out / "runs" / f"depth{depth:g}" / f"seed{seed}")
        rows.setdefault(f"{depth:g}", []).append(result)
    keys = ("compositional_unseen_top1", "compositional_seen_top1", "final_loss")
    return {"depths": {depth: {"mean": {k: statistics.fmean(r[k] for r in runs) for k in keys},
                               "std": {k: statistics.pstdev(r[k] for r in runs) for k in keys},
                               "chance": runs[0].get("compositional_chance_unseen_top1")}
                       for depth, runs in rows.items()}}


def _scenes(model, data_dir: Path, scene: str, per_combo: int) -> list[dict]:
    """The held-out scenes of the shapes corpus's `scene` build: (pixels, meta)."""
    from openalign.corpora import corpus_dir
    from openalign.data import images as image_lib
    from openalign.data.tars import image_bytes, list_shards, read_samples, sample_meta

    root = data_dir / corpus_dir("shapes", (f"scene={scene}", f"per_combo={per_combo}"))
    return [{"pixels": model.preprocess(image_lib.load_rgb(image_bytes(s))), "meta": sample_meta(s)}
            for s in read_samples(list_shards(str(root / "eval")))]


def relations(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Caption against swapped caption, pooled and late interaction, for the paper's loss and FILIP's."""
    import openalign
    from openalign.loss import late_interaction_pairs
    from openalign.model.encode import encode_image_tokens, encode_text_tokens

    rows: dict = {}
    jobs = [(loss, seed) for loss in ("softmax", "filip") for seed in range(seeds)]
    for loss, seed in tqdm(jobs, desc="relations", unit="run", disable=not progress):
        model = openalign.load(_scene_model(options, "relation", loss, seed, out / "runs"))
        scenes = _scenes(model, Path(model.cfg.data.data_dir), "relation", options.scene_per_combo)
        texts = [t for sc in scenes for t in (sc["meta"]["texts"][0], sc["meta"]["swapped"])]
        pooled, patches = [], []
        for start in range(0, len(scenes), 64):
            batch = torch.stack([sc["pixels"] for sc in scenes[start:start + 64]])
            embeds, cells = encode_image_tokens(model.model, batch)
            pooled.append(embeds)
            patches.append(cells)
        images, cells = torch.cat(pooled), torch.cat(patches)
        captions = model.encode_texts(texts).view(len(scenes), 2, -1)
        by_pool = (torch.einsum("nd,ncd->nc", images, captions)).numpy()
        tokens, mask = encode_text_tokens(model.model, model.tokenizer, texts, max_length=model.cfg.model.text.max_length)
        tokens, mask = tokens.view(len(scenes), 2, *tokens.shape[1:]), mask.view(len(scenes), 2, -1)
        late = late_interaction_pairs(cells[:, None], torch.ones(cells.shape[:2], dtype=torch.bool)[:, None], tokens,
                                      mask)[1][:, 0, :].numpy()  # [n, 2]: text-to-image of own and swapped
        relation = [sc["meta"]["relation"] for sc in scenes]
        row = {"pooled": float((by_pool[:, 0] > by_pool[:, 1]).mean()), "late": float((late[:, 0] > late[:, 1]).mean()),
               "pooled_ties": float((abs(by_pool[:, 0] - by_pool[:, 1]) < 1e-6).mean()), "scenes": len(scenes),
               "by_relation": {r: float((by_pool[[i for i, x in enumerate(relation) if x == r], 0] >
                                        by_pool[[i for i, x in enumerate(relation) if x == r], 1]).mean())
                               for r in sorted(set(relation))}}
        rows.setdefault(loss, []).append(row)
    keys = ("pooled", "late", "pooled_ties")
    return {"losses": {loss: {"mean": {k: statistics.fmean(r[k] for r in runs) for k in keys},
                              "std": {k: statistics.pstdev(r[k] for r in runs) for k in keys},
                              "by_relation": runs[0]["by_relation"], "scenes": runs[0]["scenes"]}
                       for loss, runs in rows.items()}}


def several_objects(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """Objects shown against the top captions, and the softmax's split of probability between them by scale."""
    import openalign
    from openalign.corpora import shapes as shapes_lib

    singles = [f"{c} {s}" for c in shapes_lib.COLOURS for s in shapes_lib.SHAPES
               if (c, s) not in shapes_lib.heldout_combos()]
    runs = []
    for seed in tqdm(range(seeds), desc="several objects", unit="run", disable=not progress):
        model = openalign.load(_scene_model(options, "objects", "softmax", seed, out / "runs"))
        scenes = _scenes(model, Path(model.cfg.data.data_dir), "objects", options.scene_per_combo)
        images = torch.cat([_embed(model, [sc["pixels"] for sc in scenes[i:i + 64]]) for i in range(0, len(scenes), 64)])
        prompts = model.encode_texts([f"a {name}" for name in singles])
        cosine = images @ prompts.T  # [n, 56]
        shown = [[singles.index(o) for o in sc["meta"]["objects"]] for sc in scenes]
        found = [len(set(cosine[i].topk(len(objs)).indices.tolist()) & set(objs)) / len(objs)
                 for i, objs in enumerate(shown)]
        temperature = float(model.model.scale()[0])
        split = {}
        for scale in [*options.scene_scales, round(1 / temperature, 1)]:
            p = torch.softmax(cosine * scale, dim=1)
            on_shown = [p[i, objs] for i, objs in enumerate(shown)]
            split[str(scale)] = {"top_share": statistics.fmean(float(v.max() / v.sum()) for v in on_shown),
                                 "shown_mass": statistics.fmean(float(v.sum()) for v in on_shown)}
        gaps = [float(cosine[i, objs].max() - cosine[i, objs].min()) for i, objs in enumerate(shown)]
        runs.append({"objects_found": statistics.fmean(found), "split": split, "learned_scale": 1 / temperature,
                     "cosine_gap": statistics.fmean(gaps), "scenes": len(scenes),
                     "chance": statistics.fmean(len(o) / len(singles) for o in shown),
                     "two": statistics.fmean(f for f, o in zip(found, shown) if len(o) == 2),
                     "three": statistics.fmean(f for f, o in zip(found, shown) if len(o) == 3)})
    first = runs[0]
    return {"objects_found": statistics.fmean(r["objects_found"] for r in runs),
            "objects_found_std": statistics.pstdev(r["objects_found"] for r in runs),
            "two": statistics.fmean(r["two"] for r in runs), "three": statistics.fmean(r["three"] for r in runs),
            "cosine_gap": statistics.fmean(r["cosine_gap"] for r in runs),
            "learned_scale": statistics.fmean(r["learned_scale"] for r in runs), "scenes": first["scenes"],
            "split": {scale: {k: statistics.fmean(r["split"][scale][k] for r in runs if scale in r["split"])
                              for k in ("top_share", "shown_mass")}
                      for scale in first["split"]}, "chance_found": first["chance"]}


def _embed(model, pixels: list) -> torch.Tensor:
    from openalign.model.encode import encode_images

    return encode_images(model.model, torch.stack(pixels))


def _relations_figure(result: dict, path: Path) -> None:
    rows = result["losses"]
    _paired_bars(rows, (("pooled", "pooled score"), ("late", "late interaction")), [f"trained with {x}" for x in rows],
                 0.5, path, ylim=(0, 1), ylabel="own caption above the swapped one",
                 title="relations: who is left of whom")


def run(options: FailureOptions, seeds: int, out: Path, progress: bool = True) -> dict:
    """Every part asked for: results.json in `out`."""
    from openalign.config import ConfigError

    unknown = [p for p in options.parts if p not in PARTS]
    if unknown:
        raise ConfigError(f"failure-modes: unknown part {unknown[0]!r}; parts: {', '.join(PARTS)}")
    if seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, not {seeds}")
    torch.set_num_threads(1)  # tiny matrices: threads cost more than they give
    try:  # the parts an earlier call ran stay (each with the options and seeds it ran with)
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        results = {}
    done = {"composition-toy": lambda: composition_toy(options, seeds, progress),
            "deeper-tower": lambda: deeper_tower(options, seeds, out, progress),
            "generic-captions": lambda: generic_captions(options, seeds, progress),
            "rerank-cost": lambda: rerank_cost(options, out, progress),
            "concept-frequency": lambda: concept_frequency(options, progress),
            "relations": lambda: relations(options, seeds, out, progress),
            "several-objects": lambda: several_objects(options, seeds, out, progress)}
    for part in options.parts:
        results[part] = done[part]() | {"options": asdict(options), "seeds": seeds}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _cell(mean: dict, std: dict, key: str, fmt: str = ".3f") -> str:
    return f"{mean[key]:{fmt}} ± {std[key]:{fmt}}"


def write_report(results: dict, out: Path) -> Path:
    """report.md and each part's PNG in `out`."""
    def ran(part: str) -> tuple[FailureOptions, int]:
        """The options and seeds a part ran with."""
        given = BEFORE | results[part]["options"]
        return FailureOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}), \
            results[part]["seeds"]

    lines = ["# openalign study: failure-modes", "", __doc__.split("\n\n", 1)[1].split("\n\n- ")[0].strip(), ""]
    if "composition-toy" in results:
        result = results["composition-toy"]
        options, seeds = ran("composition-toy")
        _toy_figure(result, options, out / "composition_toy.png")
        lines += ["## Composition: a linear against a deeper image tower (the teaching's toy)", "",
                  f"{options.toy_steps} Adam steps (lr {options.toy_lr}) of the 16 seen pairs; image noise "
                  f"{options.toy_noise} of the vectors' scale; {options.toy_test} fresh images per held-out pair; mean ± "
                  f"std over {seeds} seed{'s' * (seeds > 1)}.", "",
                  "| image tower | training loss | held-out pairs recognised | seen pairs recognised | logit scale | "
                  "the teaching: loss | the teaching: held-out |", "|---|---|---|---|---|---|---|"]
        for tower, label in TOWERS.items():
            m, s, claim = result["towers"][tower]["mean"], result["towers"][tower]["std"], result["claim"][tower]
            lines.append(f"| {label} | {_cell(m, s, 'final_loss')} | {_cell(m, s, 'heldout_accuracy', '.1%')} | "
                         f"{m['seen_accuracy']:.1%} | {m['logit_scale']:.1f} | {claim['final_loss']:.2f} | "
                         f"{claim['heldout_accuracy']:.0%} |")
        lines += ["", *_toy_reading(result), "", "![training loss and held-out pairs](composition_toy.png)", ""]
    if "deeper-tower" in results:
        result = results["deeper-tower"]
        options, seeds = ran("deeper-tower")
        lines += ["## Composition with openalign's towers: a shallower against a deeper EfficientNet on shapes", "",
                  f"The `{options.scene_preset}` preset at depth coefficients {', '.join(f'{d:g}' for d in options.depths)}"
                  f", trained on the shapes corpus at the scenes' budget ({', '.join(options.scene_overrides)})"
                  + (f" changed by the deeper tower's recipe ({', '.join(options.depth_overrides)})"
                     if options.depth_overrides else "") +
                  f"; zero-shot top-1 over the 64 pairs on fresh images; mean ± std over {seeds} "
                  f"seed{'s' * (seeds > 1)}.", "",
                  "| depth coefficient | unseen pairs top-1 | seen pairs top-1 | final training loss |",
                  "|---|---|---|---|"]
        for depth, row in result["depths"].items():
            m, sd = row["mean"], row["std"]
            lines.append(f"| {depth} | " + " | ".join(_cell(m, sd, k) for k in ("compositional_unseen_top1",
                                                                               "compositional_seen_top1",
                                                                               "final_loss")) + " |")
        _depth_figure(result, out / "deeper_tower.png")
        lines += ["", *_depth_reading(result), "", "![unseen and seen pairs by depth](deeper_tower.png)", ""]
    if "generic-captions" in results:
        result = results["generic-captions"]
        options, seeds = ran("generic-captions")
        _generic_figure(result, out / "generic_captions.png")
        m, sd = result["mean"], result["std"]
        lines += ["## Generic captions (the PMI study's table, plus captions that go with everything)", "",
                  f"{options.generic} generic captions, {options.generic_share:.0%} of all pairs, each as likely with "
                  f"every image; width {options.generic_width}, {options.generic_steps} steps; mean ± std over {seeds} "
                  f"seed{'s' * (seeds > 1)}. Scores are the learned logits less the one constant the loss is blind to.", "",
                  "| | generic captions | the table's captions |", "|---|---|---|",
                  f"| mean learned score | {m['generic_score']:.2f} ± {sd['generic_score']:.2f} | "
                  f"{m['specific_score']:.2f} ± {sd['specific_score']:.2f} (an image's best: {m['specific_best']:.2f}) |",
                  f"| mean PMI | {result['pmi_generic']:.2f} | — |",
                  f"| images whose best caption is generic: learned | {m['generic_best_share']:.0%} | |",
                  f"| ... by PMI | {result['pmi_generic_best_share']:.0%} | |",
                  f"| ... by co-occurrence count (a likelihood) | {result['count_generic_best_share']:.0%} | |", "",
                  f"The generic captions are the most frequent for {result['count_generic_best_share']:.0%} of the images, "
                  f"and the contrastive model makes them the best caption of {m['generic_best_share']:.0%}: their learned "
                  f"score, {m['generic_score']:.2f}, sits at PMI's {result['pmi_generic']:.2f} (near zero), where an image's "
                  f"best caption scores {m['specific_best']:.2f}. The claim reproduces: the in-batch negatives divide by "
                  "p(y) without being told." if m["generic_best_share"] < 0.05 else
                  "The claim does not reproduce here: the generic captions win images they should not; see the rows.",
                  "", "![caption frequency against learned score](generic_captions.png)", ""]
    if "rerank-cost" in results:
        result = results["rerank-cost"]
        options, _ = ran("rerank-cost")
        _rerank_figure(result, out / "rerank_cost.png")
        per_image = result["embed_seconds_per_image"]
        lines += ["## Pooled search against late-interaction re-ranking (measured)", "",
                  f"{options.rerank_model} over {options.rerank_images}: {result['images']:,} images with "
                  f"{result['patches_per_image']} patch vectors each; medians over {result['queries']} text queries on "
                  f"this machine ({result['threads']} threads).", "",
                  "| | ms per query | queries/s | Q*: queries whose re-ranking costs one embedding of the collection |",
                  "|---|---|---|---|",
                  f"| pooled search | {1e3 * result['pooled_seconds']:.1f} | {1 / result['pooled_seconds']:.0f} | |"]
        for k, seconds in result["rerank_seconds"].items():
            q = result.get("break_even_queries", {}).get(k)
            lines.append(f"| re-rank the top {k} | {1e3 * seconds:.1f} | {1 / seconds:.0f} | "
                         f"{f'{q:,.0f}' if q else 'embedding not timed (already done)'} |")
        lines += ["", f"Embedding one image cost {1e3 * per_image:.1f} ms." if per_image else
                  "The embeddings were already on disk, so their cost was not measured in this run.",
                  f"Re-ranking the top K costs {1e3 * min(result['rerank_seconds'].values()):.1f}–"
                  f"{1e3 * max(result['rerank_seconds'].values()):.1f} ms per query against "
                  f"{1e3 * result['pooled_seconds']:.1f} ms for the pooled search: it encodes the query's tokens once "
                  "more (a text-tower pass) and reads the shortlisted images' patch vectors, no image tower, so it "
                  "grows slowly with K. Q* is how many queries cost one embedding of the collection: re-ranking a "
                  "shortlist per query stays cheap against the towers, which is the teaching's two-stage design "
                  "(shortlist with the dual encoder, re-rank a few dozen with a scorer that reads both).", "",
                  "![per-query cost against K](rerank_cost.png)", ""]
    if "concept-frequency" in results:
        result = results["concept-frequency"]
        _frequency_figure(result, out / "concept_frequency.png")
        lines += ["## Zero-shot accuracy against concept frequency", "",
                  "Each held-out image classified among every held-out class name; its class's frequency is the "
                  "training count of the name's rarest word (the word that names it), the words' mean count beside it.",
                  "",
                  "| held-out set | model | images (classes) | zero-shot top-1 (chance) | names with a word never seen in "
                  "training | slope per decade of the rarest word's count | ... of the words' mean count |",
                  "|---|---|---|---|---|---|---|"]
        for name, row in result["sets"].items():
            lines.append(f"| {name} | {row['model']} | {row['images']:,} ({row['classes']:,}) | {row['accuracy']:.3f} "
                         f"({row['chance']:.4f}) | {row['unseen_share']:.0%} | {row['slope_per_decade']:+.3f} | "
                         f"{row.get('slope_per_decade_mean_count', float('nan')):+.3f} |")
        lines += ["", "| held-out set | training count of the rarest word | images | zero-shot top-1 |", "|---|---|---|---|"]
        for name, row in result["sets"].items():
            for b in row["bins"]:
                span = "0 (never)" if b["high"] == 1 else f"{b['low']:,}–{b['high'] - 1:,}" if b["high"] != float("inf") \
                    else f"{b['low']:,} or more"
                lines.append(f"| {name} | {span} | {b['images']} | {b['accuracy']:.3f} |")
        lines += ["", "![zero-shot accuracy against concept frequency](concept_frequency.png)", ""]
    if "relations" in results:
        result = results["relations"]
        options, seeds = ran("relations")
        _relations_figure(result, out / "relations.png")
        lines += ["## Relations and word order: a caption against its objects swapped", "",
                  f"Models of the `{options.scene_preset}` preset trained on the shapes corpus's relation scenes "
                  f"({options.scene_per_combo} per seen combination; {', '.join(options.scene_overrides)}); each "
                  f"held-out scene's caption against the same words with the two objects swapped; mean ± std over "
                  f"{seeds} seed{'s' * (seeds > 1)}. Chance: 50%.", "",
                  "| loss | scenes | own caption scored above the swapped: pooled | ... late interaction |",
                  "|---|---|---|---|"]
        for loss, row in result["losses"].items():
            m, sd = row["mean"], row["std"]
            lines.append(f"| {loss} | {row['scenes']} | {_cell(m, sd, 'pooled', '.1%')} | {_cell(m, sd, 'late', '.1%')} |")
        lines += ["", "A pooled score is a sum over what the image holds and what the caption says; swapping the "
                  "roles leaves both sums as they were, up to the position words' own vectors and word order in the "
                  "text tower. Late interaction matches each token to its best patch alone, so it compares no roles "
                  "either. Where either is far from 50%, the text tower's word order carries it.", "",
                  "![own against swapped caption](relations.png)", ""]
    if "several-objects" in results:
        result = results["several-objects"]
        options, seeds = ran("several-objects")
        lines += ["## Several objects: what the top captions name, and the softmax's split", "",
                  f"A model of the `{options.scene_preset}` preset trained on scenes of two or three shapes, each "
                  f"captioned by one of them; {result['scenes']} held-out scenes; mean over {seeds} seed"
                  f"{'s' * (seeds > 1)}.", "",
                  f"- Of the shapes a scene shows, its top-n captions (n shapes) name {result['objects_found']:.1%} "
                  f"(chance {result['chance_found']:.1%}; two shapes {result['two']:.1%}, three {result['three']:.1%}).",
                  f"- The cosine gap between the best- and worst-scored shape shown: {result['cosine_gap']:.3f} (the "
                  f"teaching's example: 0.16); the model learned a scale of {result['learned_scale']:.1f}.", "",
                  "| softmax scale | the top shape's share of the shapes' probability | probability on the shapes shown |",
                  "|---|---|---|"]
        for scale, row in result["split"].items():
            lines.append(f"| {scale} | {row['top_share']:.1%} | {row['shown_mass']:.1%} |")
        lines += ["", "As the scale grows the probability on the shapes shown concentrates on one of them, though the "
                  "image shows all: a softmax over prompts answers one class by construction.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
