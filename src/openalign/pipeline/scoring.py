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
from openalign.data.engine import Engine, Job, duckdb_plan, job_id, run_jobs, spark_plan, spark_session
from openalign.data.pairs import first_source, spark_first_source, sql_path
from openalign.outputs import sources_key, staged

WORK = "_work"  # the plan, the evaluation hashes or embeddings, each task's scores and status


IMAGE_QUERY = f"""SELECT image_key, s.place AS place, s.path AS path, s.member AS member FROM (
                      SELECT image_key, {first_source()} AS s FROM read_parquet(?) GROUP BY image_key)"""
# with_pairs: each image's pairs too, as two lists in uid order (a uid the table repeats, once)
PAIRS_QUERY = f"""WITH images AS ({IMAGE_QUERY}),
                       pairs AS (SELECT image_key, list(uid ORDER BY uid) AS uids, list(text ORDER BY uid) AS texts
                                 FROM (SELECT DISTINCT image_key, uid, text FROM read_parquet(?)) GROUP BY image_key)
                  SELECT * FROM images JOIN pairs USING (image_key)"""
PLAN_ORDER = ("place", "image_key")  # by source: a task reads a few neighbouring tars, not every one


def plan_images(pairs: str, plan: Path, per_task: int, engine: Engine, with_pairs: bool = False) -> int:
    """Every distinct image of the pair table, ordered by key and cut into tasks of `per_task` images (the
    local engine plans with DuckDB, the Spark engine with Spark SQL); returns the count. `with_pairs`: each
    image's pairs too (`uids`, `texts`: lists in uid order)."""
    if engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_session(engine.master, retries=engine.retries, memory=engine.memory)
        table = spark.read.parquet(pairs)
        frame = (table.groupBy("image_key").agg(spark_first_source().alias("s"))
                 .select("image_key", *(F.col(f"s.{c}").alias(c) for c in ("place", "path", "member"))))
        if with_pairs:
            listed = (table.select("image_key", "uid", "text").distinct().groupBy("image_key")
                      .agg(F.sort_array(F.collect_list(F.struct("uid", "text"))).alias("p"))
                      .select("image_key", F.col("p.uid").alias("uids"), F.col("p.text").alias("texts")))
            frame = frame.join(listed, "image_key")
        return spark_plan(frame, PLAN_ORDER, per_task, plan)
    import duckdb

    with duckdb.connect() as con:
        query, params = (PAIRS_QUERY, [str(pairs)] * 2) if with_pairs else (IMAGE_QUERY, [str(pairs)])
        return duckdb_plan(con, query, params, PLAN_ORDER, per_task, plan)


def plan_image_jobs(pairs: str, out: Path, fn, args: tuple, key: dict, per_task: int, engine: Engine,
                    with_pairs: bool = False) -> tuple[int, list[Job], list[str]]:
    """Plan the images (`with_pairs`: and their pairs) into jobs `fn(plan, index, scores_path, *args)`, each writing
    its scores to OUT/_work/scores-ID.parquet; returns (images, the jobs, the score files of this plan: files a
    killed run of another plan left are never read). A job's key covers the pair table (size and time), `key`,
    the plan's cut and its index."""
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    plan = work / "plan.parquet"
    count = plan_images(pairs, plan, per_task, engine, with_pairs)
    n_jobs = -(-count // per_task)
    inputs = sources_key(pairs if "://" in str(pairs) else str(Path(pairs).resolve()), key, per_task, count, PLAN_ORDER)
    scores = [str(work / f"scores-{job_id(i)}.parquet") for i in range(n_jobs)]
    jobs = [Job(job_id(i), fn, (str(plan), i, scores[i], *args), key=sources_key(inputs, i), outputs=(scores[i],))
            for i in range(n_jobs)]
    return count, jobs, scores


def image_jobs(pairs: str, out: Path, fn, args: tuple, key: dict, per_task: int, engine: Engine, desc: str,
               progress: bool, with_pairs: bool = False) -> tuple[int, dict, int, list[str]]:
    """`plan_image_jobs`, then the jobs run; returns (images, {id: result}, jobs resumed, the score files)."""
    count, jobs, scores = plan_image_jobs(pairs, out, fn, args, key, per_task, engine, with_pairs)
    results, resumed = run_jobs(jobs, out / WORK / "_status", engine, desc, progress)
    return count, results, resumed, scores


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


def score_summary(out: Path, scores: list[str], where: str, order: str, n_examples: int) -> tuple[int, list, dict, int]:
    """From the tasks' score files: how many images the rule removes, the first examples in `order`, the
    percentiles of every finite score (numpy's linear interpolation, as DuckDB's quantile_cont), and how many
    scores were NaN or infinite."""
    import duckdb

    plan = str(out / WORK / "plan.parquet")
    with duckdb.connect() as con:
        removed = con.execute(f"SELECT count(*) FROM read_parquet(?) WHERE {where}", [scores]).fetchone()[0]
        examples = con.execute(f"""SELECT coalesce(p.member, p.path), s.match, s.score FROM read_parquet(?) s
                                   JOIN read_parquet(?) p USING (image_key) WHERE {where}
                                   ORDER BY s.score {order}, s.image_key LIMIT {int(n_examples)}""",
                               [scores, plan]).fetchall()
        quantiles = con.execute(f"SELECT quantile_cont(score, ?::DOUBLE[]) FROM read_parquet(?) WHERE {FINITE}",
                                [[q / 100 for q in PERCENTILES], scores]).fetchone()[0]
        nonfinite = con.execute(f"SELECT count(*) FROM read_parquet(?) WHERE score IS NOT NULL AND NOT ({FINITE})",
                                [scores]).fetchone()[0]
    percentiles = {f"p{q:g}": float(v) for q, v in zip(PERCENTILES, quantiles)} if quantiles else {}
    return removed, examples, percentiles, int(nonfinite)


def write_keep_without_images(pairs: str, scores: list[str], where: str, out: Path, engine=None) -> int:
    """Keep-list `out/keep.parquet` of every pair whose image is not removed: the images of the Parquet files
    `scores` (image_key, score, ...) that match the SQL condition `where` (the dedup and screen stages). The
    Spark engine joins on the executors and writes part files; returns how many pairs were removed."""
    scores = list(scores)
    import shutil

    keep = out / "keep.parquet"
    if keep.is_dir():
        shutil.rmtree(keep)
    else:
        keep.unlink(missing_ok=True)
    if engine is not None and engine.name == "spark":
        spark = spark_session(engine.master, retries=engine.retries, memory=engine.memory)
        table = spark.read.parquet(str(pairs))
        removed = spark.read.parquet(*scores).where(where).select("image_key")
        table.join(removed, "image_key", "left_anti").select("uid").distinct().orderBy("uid") \
            .write.mode("overwrite").parquet(str(keep))
        return table.join(removed, "image_key", "left_semi").count()
    import duckdb

    removed = f"SELECT image_key FROM read_parquet(?) WHERE {where}"
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT DISTINCT uid FROM read_parquet(?) WHERE image_key NOT IN ({removed}) ORDER BY uid) "
                    f"TO '{sql_path(keep)}' (FORMAT parquet)", [str(pairs), scores])
        return con.execute(f"SELECT count(*) FROM read_parquet(?) WHERE image_key IN ({removed})",
                           [str(pairs), scores]).fetchone()[0]
