"""Remove training images that are near-duplicates of evaluation images (the paper's test-set hygiene).

    openalign dedup pairs.parquet --against EVAL --out DIR [--mode phash|embedding] [--model MODEL]

EVAL is a directory of webdataset shards, a directory of image files, or a pair table (.parquet).

- `phash` (no model): a 64-bit perceptual hash (DCT, `imagehash.phash`) of every distinct training and
  evaluation image; a training image within `max_distance` bits (Hamming) of any evaluation image is
  removed. Exact nearest neighbours come from a FAISS binary index.
- `embedding`: any openalign model embeds both sides (evaluation transform); a training image whose
  cosine similarity to some evaluation image exceeds `threshold` (paper: 0.975) is removed. Exact
  inner-product search with FAISS.

Writes DIR/keep.parquet (uids of the pairs whose image survives; intersect it with the filter
keep-list in `openalign shard --keep FILTER --keep DEDUP`) and DIR/dedup_report.json (counts, the
closest matches removed).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.data import images
from openalign.data.filters import write_keep_without_images
from openalign.data.ingest import IMAGE_COLUMNS, IMAGE_SUFFIXES, check_pair_table
from openalign.data.shard import SOURCES
from openalign.data.workers import process_pool


@dataclass(frozen=True)
class DedupOptions:
    mode: str = "phash"  # phash | embedding
    max_distance: int = 4  # phash: Hamming bits (of 64) at or below which two images are duplicates
    threshold: float = 0.975  # embedding: cosine above which two images are duplicates (paper)
    model: str = ""  # embedding: an openalign model directory
    batch_size: int = 128
    workers: int = 0
    examples: int = 10


# ---------------------------------------------------------------------------------------------- inputs

def train_images(pairs: Path) -> list[tuple[str, str, str | None]]:
    """(image_key, path, member) of each distinct image of the pair table, ordered by key."""
    import duckdb

    with duckdb.connect() as con:
        return con.execute("SELECT image_key, min(path), min(member) FROM read_parquet(?) GROUP BY image_key "
                           "ORDER BY image_key", [str(pairs)]).fetchall()


def eval_images(spec: str) -> Iterator[tuple[str, bytes]]:
    """(name, encoded bytes) of every evaluation image."""
    from openalign.data import shards as shard_lib

    path = Path(spec)
    if path.suffix == ".parquet" and path.is_file():
        for key, src, member in train_images(path):
            yield key, SOURCES.read(src, member)
    elif path.is_dir() and any(path.glob("*.tar")):
        for sample in shard_lib.read_samples(shard_lib.list_shards(spec)):
            try:
                yield sample["__key__"], shard_lib.image_bytes(sample)
            except shard_lib.BadSample:
                continue
    elif path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
            yield str(file), file.read_bytes()
    else:
        raise ConfigError(f"--against {spec} is not a directory of shards or images, nor a .parquet pair table")


# ---------------------------------------------------------------------------------------------- phash

def phash_bytes(data: bytes) -> np.ndarray | None:
    import imagehash

    try:
        bits = imagehash.phash(images.load_rgb(data)).hash.flatten()
    except images.BadImage:
        return None
    return np.packbits(bits)  # 8 bytes


def _phash_train(item: tuple[str, str, str | None]) -> np.ndarray | None:
    _, path, member = item
    try:
        return phash_bytes(SOURCES.read(path, member))
    except OSError:
        return None


def _pool_map(fn, items, workers: int, desc: str, progress: bool) -> list:
    workers = workers or os.cpu_count() or 1
    pool = process_pool(workers) if workers > 1 and len(items) > 64 else None
    try:
        results = pool.imap(fn, items, chunksize=16) if pool else map(fn, items)
        return list(tqdm(results, total=len(items), desc=desc, unit="img", disable=not progress, leave=False))
    finally:
        if pool:
            pool.terminate()


def phash_matches(train: list, eval_items: list[tuple[str, bytes]], options: DedupOptions, progress: bool):
    """For each training image: (distance to the closest evaluation image, its name), or None if unreadable."""
    import faiss

    eval_hashes = [(name, phash_bytes(data)) for name, data in eval_items]
    eval_hashes = [(n, h) for n, h in eval_hashes if h is not None]
    if not eval_hashes:
        raise ConfigError("none of the evaluation images could be decoded")
    index = faiss.IndexBinaryFlat(64)
    index.add(np.stack([h for _, h in eval_hashes]))
    hashes = _pool_map(_phash_train, train, options.workers, "phash train images", progress)
    ok = [i for i, h in enumerate(hashes) if h is not None]
    distances, nearest = index.search(np.stack([hashes[i] for i in ok]), 1) if ok else (np.zeros((0, 1)), None)
    matches: list = [None] * len(train)
    for row, i in enumerate(ok):
        matches[i] = (float(distances[row, 0]), eval_hashes[int(nearest[row, 0])][0])
    return matches, len(eval_hashes), lambda d: d <= options.max_distance


# ---------------------------------------------------------------------------------------------- embedding

def embedding_matches(train: list, eval_items: list[tuple[str, bytes]], options: DedupOptions, progress: bool):
    import faiss
    import torch

    from openalign.data import transforms
    from openalign.model.hub import load_pretrained

    if not options.model:
        raise ConfigError("--mode embedding needs --model DIR (an openalign model directory)")
    model, _, cfg = load_pretrained(Path(options.model))
    resize, crop = cfg.model.vision.resize_size, cfg.model.vision.image_size

    def embed(blobs: Iterator[bytes | None], total: int, desc: str) -> tuple[np.ndarray, list[int]]:
        out, kept, batch, batch_ids = [], [], [], []

        def flush():
            with torch.no_grad():
                out.append(model.encode_image(torch.stack(batch)).embeds.float().numpy())
            kept.extend(batch_ids)
            batch.clear()
            batch_ids.clear()

        for i, data in enumerate(tqdm(blobs, total=total, desc=desc, unit="img", disable=not progress, leave=False)):
            try:
                image = images.load_rgb(data) if data else None
            except images.BadImage:
                image = None
            if image is None:
                continue
            batch.append(transforms.eval_transform(image, resize, crop))
            batch_ids.append(i)
            if len(batch) == options.batch_size:
                flush()
        if batch:
            flush()
        return (np.concatenate(out) if out else np.zeros((0, cfg.model.embed_dim), np.float32)), kept

    def read(item):
        try:
            return SOURCES.read(item[1], item[2])
        except OSError:
            return None

    eval_embeds, eval_ok = embed((d for _, d in eval_items), len(eval_items), "embed eval images")
    index = faiss.IndexFlatIP(eval_embeds.shape[1])
    index.add(np.ascontiguousarray(eval_embeds))
    train_embeds, train_ok = embed((read(t) for t in train), len(train), "embed train images")
    similarity, nearest = index.search(np.ascontiguousarray(train_embeds), 1)
    matches: list = [None] * len(train)
    for row, i in enumerate(train_ok):
        matches[i] = (float(similarity[row, 0]), eval_items[eval_ok[int(nearest[row, 0])]][0])
    return matches, len(eval_ok), lambda s: s > options.threshold


# ---------------------------------------------------------------------------------------------- stage

def _percentiles(scores: list[float]) -> dict:
    if not scores:
        return {}
    return {f"p{q:g}": float(np.percentile(scores, q)) for q in (0, 1, 5, 25, 50, 75, 95, 99, 100)}


def dedup(pairs: Path, against: str, out: Path, options: DedupOptions = DedupOptions(), progress: bool = True) -> dict:
    pairs, out = Path(pairs), Path(out)
    check_pair_table(pairs, IMAGE_COLUMNS)
    if options.mode not in ("phash", "embedding"):
        raise ConfigError(f"unknown dedup mode {options.mode!r}; choose phash or embedding")
    start = time.perf_counter()
    eval_items = list(eval_images(against))
    if not eval_items:
        raise ConfigError(f"no evaluation images found in {against}")
    train = train_images(pairs)
    find = phash_matches if options.mode == "phash" else embedding_matches
    matches, n_eval, is_duplicate = find(train, eval_items, options, progress)
    removed = [(train[i], m) for i, m in enumerate(matches) if m is not None and is_duplicate(m[0])]
    removed_keys = [t[0] for t, _ in removed]
    out.mkdir(parents=True, exist_ok=True)
    removed_pairs = write_keep_without_images(pairs, removed_keys, out)
    closest = sorted(removed, key=lambda r: r[1][0], reverse=options.mode == "embedding")[:options.examples]
    report = {
        "stage": "dedup", "pairs": str(pairs), "against": str(against), "mode": options.mode,
        "rule": (f"Hamming distance <= {options.max_distance} of 64 bits" if options.mode == "phash"
                 else f"cosine > {options.threshold}"),
        "model": options.model or None, "train_images": len(train), "eval_images": n_eval,
        "unreadable_train_images": sum(m is None for m in matches), "removed_images": len(removed),
        "removed_pairs": int(removed_pairs), "keep": str(out / "keep.parquet"),
        "examples": [{"train": t[2] or t[1], "eval": m[1], "score": m[0]} for t, m in closest],
        # how close the training set comes to the evaluation set, to choose a threshold with
        "closest_score_percentiles": _percentiles([m[0] for m in matches if m is not None]),
        "seconds": round(time.perf_counter() - start, 2),
    }
    (out / "dedup_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
