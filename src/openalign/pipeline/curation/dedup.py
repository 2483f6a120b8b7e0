"""Remove training images that are near-duplicates of evaluation images (the paper's test-set hygiene).

    openalign dedup pairs.parquet --against EVAL --out DIR [--mode phash|embedding] [--model MODEL]

EVAL is a directory of webdataset shards, a directory of image files, or a pair table (.parquet).

- `phash` (no model): a 64-bit perceptual hash (DCT, `imagehash.phash`) of every distinct training and
  evaluation image; a training image within `max_distance` bits (Hamming) of any evaluation image is
  removed. Exact nearest neighbours come from a FAISS binary index.
- `embedding`: any openalign model embeds both sides (evaluation transform); a training image whose
  cosine similarity to some evaluation image exceeds `threshold` (paper: 0.975) is removed. Exact
  inner-product search with FAISS.
- `buckets`: the paper's Appendix A detector on the same embeddings. k-means (FAISS, spherical, seeded) cuts
  the embedding space into `clusters` cells (4K at scale; at most one per evaluation image on small sets);
  every image, training or evaluation, goes to its `top_clusters` (10) nearest cells and from them into every
  `choose`-of-`top_clusters` bucket (3 of 10: 120 buckets); a training image is compared only with the
  evaluation images it shares a bucket with, and removed when one of them is closer than `threshold`. Sharing
  a bucket is sharing at least 3 of the 10 cells, which is how it is computed (an inverted list of the
  evaluation images per cell: a sparse product counts the cells each pair shares), without listing the 120
  buckets. docs/pipeline.md: recall and cost against
  `embedding`.

Writes DIR/keep.parquet (uids of the pairs whose image survives; intersect it with the filter
keep-list in `openalign shard --keep FILTER --keep DEDUP`) and DIR/dedup_report.json (counts, the
closest matches removed).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from typing import Literal
from pathlib import Path

import numpy as np

from openalign.config import ConfigError, Options
from openalign.data import images, sources
from openalign.data.engine import Engine, read_plan
from openalign.pipeline.runner import Input, Run, Stage, run_stage
from openalign.pipeline.curation.scoring import FINITE, embed_blobs, kmeans, nearest_cells, score_summary, write_scores

__all__ = ["DedupOptions", "DedupResult", "dedup"]


@dataclass(frozen=True)
class DedupOptions(Options):
    mode: Literal["phash", "embedding", "buckets"] = "phash"  # phash: a perceptual hash (no model); embedding: a
        # model's cosine against every evaluation image; buckets: against those sharing a cluster bucket (Appendix A)
    max_distance: int = 4  # phash: Hamming bits (of 64) at or below which two images are duplicates
    threshold: float = 0.975  # embedding: cosine above which two images are duplicates (paper)
    model: str = ""  # embedding, buckets: an openalign model directory
    clusters: int = 4096  # buckets: k-means cells of the embedding space (at most the number of evaluation images)
    top_clusters: int = 10  # buckets: each image's nearest cells
    choose: int = 3  # buckets: cells per bucket (every choose-of-top_clusters combination is one)
    encode_batch: int = 128  # embedding: images encoded at once
    workers: int = 0  # local engine: processes (0: all cores; embedding mode: 1 process, all cores for the model)
    examples: int = 10  # closest removed matches listed in the report
    images_per_task: int = 2_000  # the unit of distribution, retry and resume

    def cross_field_problems(self) -> list[str]:
        if self.mode != "phash" and not self.model:
            return [f"--mode {self.mode} needs --model DIR (an openalign model directory)"]
        if min(self.clusters, self.top_clusters, self.choose) < 1 or self.choose > self.top_clusters:
            return [f"--clusters, --top-clusters and --choose must be at least 1, with --choose at most "
                    f"--top-clusters (got {self.clusters}, {self.top_clusters}, {self.choose})"]
        return []


# ---------------------------------------------------------------------------------------------- inputs

def eval_images(spec: str) -> list[tuple[str, bytes | None]]:
    """(name, encoded bytes, or None where unreadable) of every evaluation image (data/sources.py layouts)."""
    return [(item.name, item.data if item.data is not None else sources.read_bytes(item.path, item.member))
            for item in sources.items(spec)]


# ---------------------------------------------------------------------------------------------- plan


def array_digest(array: np.ndarray) -> str:
    data = np.ascontiguousarray(array).tobytes() + str(array.shape).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# ---------------------------------------------------------------------------------------------- phash

def phash_bytes(data: bytes | None) -> np.ndarray | None:
    import imagehash

    if not data:
        return None
    try:
        bits = imagehash.phash(images.load_rgb(data)).hash.flatten()
    except images.BadImage:
        return None
    return np.packbits(bits)  # 8 bytes


def phash_task(plan: str, index: int, scores_path: str, eval_path: str) -> dict:
    """One task: the perceptual hash of each of its images and the Hamming distance to the closest
    evaluation image (exact, a FAISS binary index)."""
    import faiss

    rows = read_plan(plan, index)
    hashes = [phash_bytes(sources.read_bytes(r["path"], r["member"])) for r in rows]
    ok = [i for i, h in enumerate(hashes) if h is not None]
    scores, matches = [None] * len(rows), [None] * len(rows)
    if ok:
        search = faiss.IndexBinaryFlat(64)
        search.add(np.load(eval_path))
        distances, nearest = search.search(np.stack([hashes[i] for i in ok]), 1)
        for row, i in enumerate(ok):
            scores[i], matches[i] = float(distances[row, 0]), int(nearest[row, 0])
    write_scores(scores_path, rows, scores, matches)
    return {"images": len(rows), "unreadable": len(rows) - len(ok)}


# ---------------------------------------------------------------------------------------------- embedding

def embedding_task(plan: str, index: int, scores_path: str, eval_path: str, model_path: str, batch_size: int,
                   threads: int) -> dict:
    """One task: each image's cosine similarity to the closest evaluation image (exact, FAISS)."""
    import faiss

    rows = read_plan(plan, index)
    blobs = (sources.read_bytes(r["path"], r["member"]) for r in rows)
    embeds, ok = embed_blobs(model_path, blobs, batch_size, threads)
    scores, matches = [None] * len(rows), [None] * len(rows)
    if ok:
        evaluation = np.load(eval_path)
        search = faiss.IndexFlatIP(evaluation.shape[1])
        search.add(evaluation)
        similarity, nearest = search.search(np.ascontiguousarray(embeds), 1)
        for row, i in enumerate(ok):
            scores[i], matches[i] = float(similarity[row, 0]), int(nearest[row, 0])
    write_scores(scores_path, rows, scores, matches)
    return {"images": len(rows), "unreadable": len(rows) - len(ok)}


# ---------------------------------------------------------------------------------------------- buckets

def cell_incidence(cells: np.ndarray, n_cells: int):
    """Images' [N, top] nearest cells as a sparse [N, n_cells] 0/1 matrix (CSR)."""
    from scipy import sparse

    rows = np.repeat(np.arange(len(cells), dtype=np.int64), cells.shape[1])
    return sparse.csr_matrix((np.ones(len(rows), np.int16), (rows, cells.ravel())), shape=(len(cells), n_cells))


def cell_index(cells: np.ndarray, n_cells: int):
    """The evaluation images' [E, top] nearest cells as a sparse [n_cells, E] incidence matrix."""
    return cell_incidence(cells, n_cells).T.tocsr()


def bucket_pairs(cells: np.ndarray, index, choose: int) -> tuple[np.ndarray, np.ndarray]:
    """(training row, evaluation image) of every pair that shares a bucket, ordered by training row then evaluation
    image. Two images share one of the `choose`-of-`top` buckets exactly when at least `choose` of their `top`
    nearest cells are the same, so the buckets need not be listed: the training rows' cell incidence times the
    evaluation side's (`cell_index`) counts the cells each pair shares (a sparse product), and the pairs with
    `choose` or more are kept."""
    shared = (cell_incidence(cells, index.shape[0]) @ index).tocsr()
    shared.data[shared.data < choose] = 0
    shared.eliminate_zeros()
    shared.sort_indices()
    coo = shared.tocoo()
    return coo.row.astype(np.int64), coo.col.astype(np.int64)


def bucket_best(embeds: np.ndarray, evaluation: np.ndarray, cells: np.ndarray, index, choose: int,
                rows_per_chunk: int = 2048) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each training row: the highest cosine to an evaluation image it shares a bucket with (NaN: none), that
    image (-1: none), and how many evaluation images it was compared with."""
    best = np.full(len(embeds), np.nan)
    match = np.full(len(embeds), -1, np.int64)
    compared = np.zeros(len(embeds), np.int64)
    for start in range(0, len(embeds), rows_per_chunk):
        rows, found = bucket_pairs(cells[start:start + rows_per_chunk], index, choose)
        if not len(rows):
            continue
        sims = np.einsum("ij,ij->i", embeds[start + rows], evaluation[found])
        order = np.lexsort((found, -sims, rows))  # per row: the highest cosine first, ties to the lower image
        first = np.r_[True, rows[order][1:] != rows[order][:-1]]
        best[start + rows[order][first]] = sims[order][first]
        match[start + rows[order][first]] = found[order][first]
        compared[start:start + rows_per_chunk] = np.bincount(rows, minlength=min(rows_per_chunk, len(embeds) - start))
    return best, match, compared


def bucket_task(plan: str, index: int, scores_path: str, eval_path: str, model_path: str, batch_size: int,
                threads: int, buckets_path: str) -> dict:
    """One task: each image's cosine similarity to the closest evaluation image it shares a bucket with (none
    shared: no score, counted as `unbucketed`)."""
    rows = read_plan(plan, index)
    blobs = (sources.read_bytes(r["path"], r["member"]) for r in rows)
    embeds, ok = embed_blobs(model_path, blobs, batch_size, threads)
    evaluation, saved = np.load(eval_path), np.load(buckets_path)
    cells = nearest_cells(embeds, saved["centroids"], int(saved["top"]))
    index = cell_index(saved["cells"], len(saved["centroids"]))
    best, match, compared = bucket_best(embeds, evaluation, cells, index, int(saved["choose"]))
    scores, matches = [None] * len(rows), [None] * len(rows)
    for row, i in enumerate(ok):
        if match[row] >= 0:
            scores[i], matches[i] = float(best[row]), int(match[row])
    write_scores(scores_path, rows, scores, matches)
    return {"images": len(rows), "unreadable": len(rows) - len(ok), "unbucketed": int((match < 0).sum()),
            "compared": int(compared.sum())}


# ---------------------------------------------------------------------------------------------- stage


@dataclass(frozen=True)
class DedupResult:
    """What `dedup` removed (its report, OUT/dedup_report.json, holds the same and more: examples, percentiles)."""

    keep: Path  # OUT/keep.parquet: the uids of the pairs whose image is no near-duplicate
    rule: str  # what counts as a near-duplicate, with its threshold
    train_images: int  # distinct training images compared
    eval_images: int
    removed_images: int  # training images that are near-duplicates of an evaluation image
    removed_pairs: int  # their pairs
    unreadable_images: int  # training images that could not be read (kept: nothing decided them)
    resumed_tasks: int  # tasks a rerun did not redo
    seconds: float
    report: dict  # the report as written


@dataclass(frozen=True)
class DedupReport:
    """OUT/dedup_report.json, after `stage` and `pairs` (buckets mode adds its three counts at the end)."""

    against: str
    mode: str
    engine: str
    rule: str
    model: str | None
    train_images: int
    eval_images: int
    unreadable_train_images: int  # kept: nothing decided them
    removed_images: int
    removed_pairs: int
    keep: str
    resumed_tasks: int
    examples: list  # the closest removed matches: {train, eval, score}
    closest_score_percentiles: dict  # how close the training set comes to the evaluation set, to choose a threshold
    nonfinite_scores: int  # counted, never removed: a NaN or infinite score decides nothing
    buckets: dict = field(default_factory=dict)  # buckets mode: clusters, unbucketed_train_images,
        # comparisons_per_train_image (written as the report's own keys)

    def layout(self, head: dict, seconds: float) -> dict:
        fields_ = asdict(self)
        buckets = fields_.pop("buckets")  # buckets mode's counts: the report's own keys, after the others
        return {**head, **fields_, **buckets, "seconds": seconds}

    @property
    def unreadable_images(self) -> int:
        return self.unreadable_train_images


class Dedup(Stage):
    name = "dedup"
    options = DedupOptions
    result = DedupResult
    inputs = (Input("against", "the evaluation images: shards, an image folder, a Karpathy JSON, a caption table or "
                               "a pair table"),)

    def __init__(self, against: str):
        self.against = str(against)

    def engine(self, options: DedupOptions, engine: Engine) -> Engine:
        if engine.name == "local":  # the options' processes, else the engine's; embedding: 1 (its model, every core)
            return Engine(workers=options.workers or engine.workers or (1 if options.mode == "embedding" else 0),
                          retries=engine.retries)
        return engine

    def check(self, run: Run) -> None:
        self.eval_items = list(eval_images(self.against))
        if not self.eval_items:
            raise ConfigError(f"no evaluation images found in {self.against}")

    def plan(self, run: Run) -> list:
        options, engine = run.options, run.engine
        run.work.mkdir(exist_ok=True)
        eval_path = str(run.work / "eval.npy")
        if options.mode == "phash":
            hashes = [(name, phash_bytes(data)) for name, data in self.eval_items]
            self.names = [n for n, h in hashes if h is not None]
            if not self.names:
                raise ConfigError("none of the evaluation images could be decoded")
            evaluation = np.stack([h for _, h in hashes if h is not None])
            fn, args = phash_task, (eval_path,)
            self.where, self.order = f"score <= {int(options.max_distance)}", "ASC"
            weights = None
        else:
            threads = max(1, (os.cpu_count() or 1) // max(1, engine.workers)) if engine.name == "local" else 1
            embeds, ok = embed_blobs(options.model, (d for _, d in self.eval_items), options.encode_batch)
            self.names = [self.eval_items[i][0] for i in ok]
            evaluation = np.ascontiguousarray(embeds)
            fn, args = embedding_task, (eval_path, str(Path(options.model).resolve()), options.encode_batch, threads)
            if options.mode == "buckets":  # the cells and the evaluation images' buckets, once, for every task
                self.centroids = kmeans(evaluation, options.clusters)
                top = min(options.top_clusters, len(self.centroids))
                choose = min(options.choose, options.top_clusters, len(self.centroids))
                buckets_path = str(run.work / "buckets.npz")
                np.savez(buckets_path, centroids=self.centroids, cells=nearest_cells(evaluation, self.centroids, top),
                         top=top, choose=choose)
                fn, args = bucket_task, args + (buckets_path,)
            self.where, self.order = f"{FINITE} AND score > {float(options.threshold)!r}", "DESC"
            from openalign.model.hub import model_fingerprint  # torch and transformers: only when a model is used

            weights = model_fingerprint(Path(options.model))
        np.save(eval_path, evaluation)
        # the evaluation set by content: eval.npy is written again by every run, so its time would defeat resuming
        key = asdict(options) | {"workers": 0, "eval": array_digest(evaluation), "model_weights": weights}
        if options.mode == "buckets":  # the cells are part of every task's input
            key["centroids"] = array_digest(self.centroids)
        return run.image_jobs(fn, args, key, options.images_per_task)

    def merge(self, run: Run, results: dict) -> DedupReport:
        options = run.options
        removed_images, examples, percentiles, nonfinite = score_summary(
            run.out, run.score_files, self.where, self.order, options.examples, engine=run.engine)
        removed_pairs = run.keep_without(self.where)
        rule = (f"Hamming distance <= {options.max_distance} of 64 bits" if options.mode == "phash"
                else f"cosine > {options.threshold}" + (
                    f" with an evaluation image sharing a bucket ({options.choose} of each image's "
                    f"{options.top_clusters} nearest of {options.clusters} k-means cells)"
                    if options.mode == "buckets" else ""))
        buckets = {}
        if options.mode == "buckets":
            buckets = {"clusters": int(len(self.centroids)),
                       "unbucketed_train_images": sum(r["unbucketed"] for r in results.values()),
                       "comparisons_per_train_image": round(sum(r["compared"] for r in results.values())
                                                            / max(1, run.images), 2)}
        return DedupReport(
            against=self.against, mode=options.mode, engine=run.engine.name, rule=rule, model=options.model or None,
            train_images=run.images, eval_images=len(self.names),
            unreadable_train_images=sum(r["unreadable"] for r in results.values()), removed_images=removed_images,
            removed_pairs=removed_pairs, keep=str(run.keep), resumed_tasks=run.resumed,
            examples=[{"train": train, "eval": self.names[match], "score": score} for train, match, score in examples],
            closest_score_percentiles=percentiles, nonfinite_scores=nonfinite, buckets=buckets)

    def summary(self, result: DedupResult, options: DedupOptions) -> list[str]:
        return [f"{result.removed_images:,} of {result.train_images:,} training images ({result.removed_pairs:,} "
                f"pairs) are near-duplicates of the {result.eval_images:,} evaluation images ({result.rule})"]


def dedup(pairs: Path, against: str, out: Path, options: DedupOptions = DedupOptions(), progress: bool = True,
          engine: Engine = Engine()) -> DedupResult:
    """Score every training image against the evaluation images in tasks of `images_per_task` (local
    processes or Spark), then write the keep-list of the pairs whose image is not a near-duplicate."""
    return run_stage(Dedup(against), pairs, out, options, progress, engine)
