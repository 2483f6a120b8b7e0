"""Queries against an index: text, image, and image +/- weighted texts (the paper's Section 7).

    q = normalize(w_image * e(image) + w_text * (e(text) + sum e(plus) - sum e(minus)))

with the paper's weights: text 2, image 1. A text-only query is just e(text). Results are the top-k
by cosine with the index's metadata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from openalign.config import ConfigError
from openalign.data import images as image_lib
from openalign.data import transforms
from openalign.index.opened import Loaded
from openalign.index.options import IMAGE_WEIGHT, TEXT_WEIGHT, Query  # a search's names
from openalign.index.parts import PATCHES, Parts, read_manifest
from openalign.loss import late_interaction_pairs
from openalign.model.encode import encode_images, encode_text_tokens, encode_texts

__all__ = ["Hit", "Query", "SearchResult", "search"]



@dataclass
class Hit:
    rank: int
    score: float
    id: int
    meta: dict = field(default_factory=dict)


def image_embedding(model, image_bytes: bytes) -> np.ndarray:
    cfg = model.cfg.vision
    try:
        image = image_lib.load_rgb(image_bytes, alpha=cfg.alpha)
    except image_lib.BadImage as err:
        raise ConfigError(f"the query image is not a readable image ({err.reason})") from None
    return encode_images(model, transforms.vision_transform(cfg)(image)[None]).numpy()[0]


def query_vector(model, tokenizer, query: Query, index: Loaded | None = None) -> np.ndarray:
    texts = [t for t in (query.text, *query.plus, *query.minus) if t]
    signs = ([1.0] if query.text else []) + [1.0] * len(query.plus) + [-1.0] * len(query.minus)
    image = None
    if query.image is not None:
        image = image_embedding(model, query.image)
    elif query.image_id is not None:
        if index is None or not 0 <= query.image_id < index.index.ntotal:
            raise ConfigError(f"no image with id {query.image_id} in the index")
        if index.is_deleted(int(query.image_id)):
            raise ConfigError(f"image {query.image_id} was deleted from the index")
        image = index.vector(int(query.image_id))
    if image is None and not texts:
        raise ConfigError("a query needs a text, an image or an image id")
    embeds = encode_texts(model, tokenizer, texts, max_length=model.cfg.text.max_length).numpy() if texts \
        else np.zeros((0, model.cfg.embed_dim))
    return combine(None if image is None else image[None], embeds[None], np.asarray(signs, dtype=np.float32)[None],
                   query.image_weight, query.text_weight)[0]


def combine(images: np.ndarray | None, texts: np.ndarray, signs: np.ndarray, image_weight: float = IMAGE_WEIGHT,
            text_weight: float = TEXT_WEIGHT) -> np.ndarray:
    """Queries from embeddings: normalize(w_image * image + w_text * sum(sign * text)), for a batch:
    images [Q, D] (or None: text only, weight 1), texts [Q, T, D], signs [Q, T] (+1 plus, -1 minus)."""
    signs = np.asarray(signs, dtype=np.float32)
    total = (signs[:, :, None] * texts).sum(axis=1, dtype=np.float32)
    # the size of what was added up: a sum far smaller is terms cancelling, up to float rounding (`red - red`
    # leaves ~1e-8, which normalizing would turn into an arbitrary direction)
    scale = np.abs(signs).sum(axis=1, keepdims=True)
    if images is not None:
        total = text_weight * total + image_weight * images
        scale = text_weight * scale + image_weight
    norm = np.linalg.norm(total, axis=1, keepdims=True)
    if not np.isfinite(norm).all():
        raise ConfigError("the query is not a finite vector (a weight or an embedding is NaN or infinite); give "
                          "finite weights, or check the model")
    if (norm <= 1e-5 * scale).any() or (norm == 0.0).any():
        raise ConfigError("the query terms cancel out (a zero vector); change the terms or their weights")
    return (total / norm).astype(np.float32)


def patch_store(index: Loaded) -> Parts:
    """The patch vectors (embed --patches) of the rows of `index`, memory-mapped, for re-ranking."""
    emb = Path(index.info.get("embeddings", ""))
    try:
        manifest = read_manifest(emb)
    except ConfigError:
        manifest = {}
    if not manifest.get("patches"):
        raise ConfigError(f"re-ranking needs the images' patch vectors, and {emb} has none; embed again with "
                          "`openalign embed ... --patches` and rebuild the index")
    if index.info.get("weights") and manifest.get("weights") != index.info["weights"]:
        raise ConfigError(f"{emb} was embedded again with another model since this index was built; rebuild the "
                          "index from it")
    return Parts([emb / f"{PATCHES}-{int(i):06d}.npy" for i in sorted(manifest["parts"], key=int)])


def rerank_hits(model, tokenizer, query: Query, hits: list[Hit], patches: Parts, k: int) -> list[Hit]:
    """The pooled shortlist `hits` re-ordered by late interaction with the query text's tokens (FILIP's
    text-to-image score: the mean over its tokens of the best patch), the top k of it; each hit's score is its
    late-interaction score, its pooled one is kept in meta["pooled_score"]."""
    if query.image is not None or query.image_id is not None or query.plus or query.minus or not query.text:
        raise ConfigError("re-ranking compares a text's tokens with each image's patches: it takes a text query "
                          "alone (no image, no plus or minus terms)")
    if not hits:
        return []
    tokens, mask = encode_text_tokens(model, tokenizer, [query.text], max_length=model.cfg.text.max_length)
    cells = torch.from_numpy(patches.take(np.array([h.id for h in hits], dtype=np.int64)))  # [K, P, D]
    scores = late_interaction_pairs(cells[None], torch.ones(cells.shape[:2], dtype=torch.bool)[None], tokens[None],
                                    mask[None])[1][0, :, 0].tolist()
    order = sorted(range(len(hits)), key=lambda i: -scores[i])[:k]
    return [Hit(rank + 1, scores[i], hits[i].id, hits[i].meta | {"pooled_score": hits[i].score})
            for rank, i in enumerate(order)]


def nearest(index: Loaded, vector: np.ndarray, k: int = 10, min_score: float | None = None,
            metadata: int | None = None) -> list[Hit]:
    """The top k by cosine; with `min_score`, only those scoring at least that (possibly fewer than k). The first
    `metadata` hits (default: all) carry their metadata; the rest, an empty `meta`."""
    scores, ids = index.search(vector[None].astype(np.float32), k)
    if abs(float(np.linalg.norm(vector)) - 1) < 1e-3:  # a unit query's scores are cosines: 8-bit or PQ codes
        scores = np.clip(scores, -1.0, 1.0)  # overshoot (an image's own score read 1.0005), a cosine never does
    found = [(float(s), int(i)) for s, i in zip(scores[0].tolist(), ids[0].tolist())
             if i >= 0 and (min_score is None or s >= min_score)]  # id -1: fewer than k in the index
    rows = index.meta.take([i for _, i in found[:metadata]]).to_pylist()  # ids are row numbers of the metadata
    rows += [{}] * (len(found) - len(rows))
    return [Hit(rank + 1, score, i, {k: v for k, v in row.items() if k != "id"})
            for rank, ((score, i), row) in enumerate(zip(found, rows))]


THRESHOLD_KEY = "t2i_threshold_median"  # eval's retrieval: the shared threshold of text queries over images


def score_floor(spec: str | float | None, weights: str | None = None) -> float | None:
    """A score floor from `--min-score`: a number, or the metrics JSON `openalign eval` wrote for this model
    (its retrieval's THRESHOLD_KEY: the median of each text query's best threshold between its matching and
    other images). `weights` (the index's model fingerprint) must match the JSON's `model_weights`."""
    if spec is None or spec == "":
        return None
    try:
        value = float(spec)
    except ValueError:
        path = Path(str(spec))
        if not path.is_file():
            raise ConfigError(f"--min-score {spec} is neither a number nor a metrics JSON file from `openalign eval`"
                              ) from None
        try:
            metrics = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ConfigError(f"{path} is not a JSON file; give --min-score a number or `openalign eval`'s "
                              "metrics JSON") from None
        if not isinstance(metrics, dict) or not isinstance(metrics.get(THRESHOLD_KEY), (int, float)):
            raise ConfigError(f"{path} has no {THRESHOLD_KEY}; run `openalign eval MODEL --data LABELLED_PAIRS "
                              "--task retrieval --out FILE` and pass that file") from None
        if weights and metrics.get("model_weights") and metrics["model_weights"] != weights:
            raise ConfigError(f"{path} was measured on another model than this index's; rerun `openalign eval` on "
                              "the index's model") from None
        value = float(metrics[THRESHOLD_KEY])
    if not -1.0 <= value <= 1.0:
        raise ConfigError(f"--min-score {value:g} is not a cosine similarity; give a number in [-1, 1]")
    return value


def load_model_for(index: Loaded, model_dir: str | None):
    from openalign.model.hub import load_pretrained

    path = Path(model_dir or index.info.get("model", ""))
    model, tokenizer, _ = load_pretrained(path)
    if tokenizer is None:
        raise ConfigError(f"{path} has no tokenizer; pass --model with the model the index was embedded with")
    check_model_for(index, path, model)
    return model, tokenizer


def check_model_for(index: Loaded, path: str | Path, model) -> None:
    """`model` (loaded from `path`) is the one `index` was embedded with: its weights, and its width."""
    from openalign.model.hub import weights_fingerprint

    if index.info.get("weights") and weights_fingerprint(Path(path)) != index.info["weights"]:
        raise ConfigError(f"{path} is not the model this index was embedded with (its weights differ); rerun "
                          "`openalign embed` and `openalign index`, or pass --model with the original model")
    if model.cfg.embed_dim != index.info["dim"]:
        raise ConfigError(f"{path} embeds to {model.cfg.embed_dim} dimensions, the index holds {index.info['dim']}")


@dataclass(frozen=True)
class SearchResult:
    """A search's hits, best first, and how they were chosen; iterates (and indexes) as its hits."""

    hits: list[Hit]
    min_score: float | None = None  # the floor applied: as given, or a calibrated threshold from a metrics JSON
    rerank_ms: float | None = None  # the late-interaction re-ranking's time (rerank > 0)

    def __iter__(self):
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, i):
        return self.hits[i]


def search(index: Loaded | str | Path, query: Query | str, k: int = 10, *, model=None,
           min_score: str | float | None = None, rerank: int = 0) -> SearchResult:
    """The top `k` of `index` (an index directory, or one `open_index` opened) for `query`: a text, or a `Query`
    (a text, image bytes or an indexed image's id, plus and minus texts with the paper's weights).

    model: the model the index was embedded with (default: the one it records; a directory, or an `openalign.Model`
    of the same width). min_score: leave out hits below this cosine, or `openalign eval`'s metrics JSON for this
    model (its calibrated threshold). rerank: re-order the top `rerank` by late interaction (a text query of an
    index whose embeddings kept their patch vectors, `embed --patches`)."""
    import time

    if rerank < 0:
        raise ConfigError(f"--rerank {rerank} must be 0 (off) or a shortlist size K >= 1")
    if k < 1:
        raise ConfigError(f"-k {k} must be at least 1 (the number of results to show)")
    from openalign.index.opened import load

    index = index if isinstance(index, Loaded) else load(Path(index))
    query = Query(text=query) if isinstance(query, str) else query
    if model is None or isinstance(model, (str, Path)):
        encoder, tokenizer = load_model_for(index, None if model is None else str(model))
    else:  # an openalign.Model
        encoder, tokenizer = model.model, model.tokenizer
        if model.cfg.model.embed_dim != index.info["dim"]:
            raise ConfigError(f"the model embeds to {model.cfg.model.embed_dim} dimensions, the index holds "
                              f"{index.info['dim']}")
    floor = score_floor(min_score, index.info.get("weights"))
    patches = patch_store(index) if rerank else None
    hits = nearest(index, query_vector(encoder, tokenizer, query, index), max(k, rerank), floor)
    if patches is None:  # not re-ranking
        return SearchResult(hits=hits, min_score=floor)
    start = time.perf_counter()
    hits = rerank_hits(encoder, tokenizer, query, hits, patches, k)
    return SearchResult(hits=hits, min_score=floor, rerank_ms=1000 * (time.perf_counter() - start))


def stored_vectors(index: Loaded, ids: list[int]) -> np.ndarray:
    """The indexed vectors of rows `ids` [len(ids), d], as stored (see Loaded.vector)."""
    if not ids:
        return np.zeros((0, index.info["dim"]), np.float32)
    return np.stack([index.vector(int(i)) for i in ids]).astype(np.float32)


def near_duplicates(vectors: np.ndarray, threshold: float) -> list[int]:
    """Positions of `vectors` (a ranked result list) to drop as near-duplicates, as clip-retrieval's `deduplicate`:
    vectors (normalized) whose cosine is above `threshold` are linked, and each connected group keeps its first
    (best-ranked) member."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.where(norms == 0, 1, norms)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    lims, _, found = flat.range_search(vectors, threshold)
    parent = list(range(len(vectors)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(vectors)):
        for j in found[lims[i]:lims[i + 1]].tolist():
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)  # a group's root is its best-ranked member
    return [i for i in range(len(vectors)) if root(i) != i]
