"""Scoring every distinct image of a pair table in jobs, then keeping the pairs whose image passes: what dedup
(closeness to an evaluation set) and screen (a user's classifier) share.

    OUT/_work/plan.parquet            the distinct images, ordered by key and cut into jobs (DuckDB or Spark)
    OUT/_work/scores-ID.parquet       each job's (image_key, score, match), written by the stage's job function
    OUT/_work/_status/ID.json         each job's status (data/engine.py): a rerun redoes only what changed

A score decides only when it is finite (`FINITE`); the summary counts the rest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign import host
from openalign.data import sources
from openalign.data.engine import Engine, engine_sql, plan_glob
from openalign.outputs import staged
from openalign.pipeline.runner import WORK

_MODELS: dict = {}  # per process: a worker loads the model once for the tasks of one command
host.command_cache(_MODELS.clear)


def model_for(path: str, threads: int):
    """(model, tokenizer, config) of an openalign model directory, loaded once per process, on the CPU."""
    from openalign.model.encode import load_for_inference

    if threads:
        host.set_threads(threads)
    if path not in _MODELS:
        _MODELS[path] = load_for_inference(Path(path), "cpu")
    return _MODELS[path]


def usable(vectors: np.ndarray) -> np.ndarray:
    """Which rows of `vectors` say something of their input: finite and not all zero (a diverged model's are NaN,
    and a zero vector's cosine, 0, would rank as a score). Their images and texts are left out of scores and
    clusters, and counted."""
    if vectors is None or vectors.ndim != 2 or not len(vectors):  # nothing embedded
        return np.zeros(0 if vectors is None else len(vectors), bool)
    return np.isfinite(vectors).all(axis=1) & (np.abs(vectors).sum(axis=1) > 0)


def embed_blobs(model_path: str, blobs, batch_size: int, threads: int = 0) -> tuple[np.ndarray, list[int]]:
    """Embeddings of the decodable images among `blobs` (evaluation transform), and their positions."""
    from openalign.data import transforms
    from openalign.model.encode import encode_image_stream

    model, _, cfg = model_for(model_path, threads)
    transform = transforms.vision_transform(cfg.model.vision)
    items = (sources.Item(str(i), "", data=data or b"") for i, data in enumerate(blobs))
    pixels = ((int(item.key), transform(image))
              for item, image in sources.decoded(items, alpha=cfg.model.vision.alpha))
    out, kept = [], []
    for positions, embeds in encode_image_stream(model, pixels, batch_size):
        out.append(embeds.numpy())
        kept.extend(positions)
    return (np.concatenate(out) if out else np.zeros((0, cfg.model.embed_dim), np.float32)), kept


def kmeans(vectors: np.ndarray, clusters: int, seed: int = 0) -> np.ndarray:
    """[k, D] unit-norm centroids of `vectors` (spherical k-means, FAISS, 20 iterations, seeded), k = min(clusters,
    number of vectors)."""
    import faiss

    k = max(1, min(clusters, len(vectors)))
    km = faiss.Kmeans(vectors.shape[1], k, niter=20, seed=seed, spherical=True, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=1 << 20)
    km.train(np.ascontiguousarray(vectors, dtype=np.float32))
    return km.centroids / np.linalg.norm(km.centroids, axis=1, keepdims=True).clip(min=1e-12)


def nearest_cells(vectors: np.ndarray, centroids: np.ndarray, top: int) -> np.ndarray:
    """[N, top] each vector's `top` nearest centroids by cosine (an exact FAISS search of the centroids)."""
    import faiss

    cells = faiss.IndexFlatIP(centroids.shape[1])
    cells.add(np.ascontiguousarray(centroids, dtype=np.float32))
    return cells.search(np.ascontiguousarray(vectors, dtype=np.float32), min(top, len(centroids)))[1].astype(np.int64)


def check_model(model: str, stage: str, texts: bool = False) -> str:
    """The model directory a stage encodes with, checked before any job: given, a directory openalign loads, with
    tokenizer files where `texts` are encoded too; one sentence otherwise. Returns its fingerprint."""
    from openalign.config import ConfigError

    if not model:
        raise ConfigError(f"{stage} needs --model DIR (a model directory openalign loads: its own, or a CLIP, SigLIP "
                          "or OpenCLIP checkpoint)")
    if not Path(model).is_dir():
        raise ConfigError(f"--model {model} is not a directory; give an openalign model directory")
    from openalign.model.hub import has_tokenizer, load_config, model_fingerprint  # torch, transformers: only now

    load_config(Path(model))
    if texts and not has_tokenizer(Path(model)):
        raise ConfigError(f"{model} has no tokenizer files, and a pair's text is encoded through them")
    return model_fingerprint(Path(model))


def write_scores(path: str, rows: list[dict], scores: list[float | None], matches: list[int | None]) -> None:
    table = pa.table({"image_key": [r["image_key"] for r in rows], "score": pa.array(scores, pa.float64()),
                      "match": pa.array(matches, pa.int64())})
    with staged(Path(path), tmp=Path(path + ".tmp")) as tmp:
        pq.write_table(table, tmp)


PERCENTILES = (0, 1, 5, 25, 50, 75, 95, 99, 100)


# A score decides only when it is a finite number: DuckDB and Spark order NaN above every number (a classifier
# returning NaN removed 752 of 752 images), and an infinite score is no measurement either.
FINITE = "score BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308"


def score_summary(out: Path, scores: list[str], where: str, order: str, n_examples: int,
                  engine: Engine) -> tuple[int, list, dict, int]:
    """From the tasks' score files, on the engine (Spark SQL, or DuckDB on the driver): how many images the rule
    removes and how many scores were NaN or infinite (one aggregate), the first examples in `order` (a small ordered
    LIMIT), and the percentiles of every finite score (exact, numpy's linear interpolation, selected in passes
    without a sort: ranks.py)."""
    from openalign.pipeline.curation import ranks

    plan = plan_glob(out / WORK / "plan.parquet")
    with engine_sql(engine, out / WORK, *scores, plan) as sql:
        sql.source("s", scores)
        sql.source("plan", plan)
        removed, nonfinite = sql.rows(f"SELECT count(*) FILTER (WHERE {where}), count(*) FILTER (WHERE score IS NOT "
                                      f"NULL AND NOT ({FINITE})) FROM s")[0]
        examples = [tuple(r) for r in sql.rows(
            f"""SELECT coalesce(p.member, p.path), s.match, s.score FROM s JOIN plan p ON s.image_key = p.image_key
                WHERE {where} ORDER BY s.score {order}, s.image_key LIMIT {int(n_examples)}""")]
        percentiles = ranks.percentiles(ranks.engine_view(sql, f"SELECT score, image_key AS uid FROM s WHERE "
                                                               f"{FINITE}"), PERCENTILES)
    return int(removed or 0), examples, percentiles, int(nonfinite or 0)
