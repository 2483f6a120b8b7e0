"""Remove semantic near-duplicates within the corpus: SemDeDup (Abbas et al. 2023) on a model's image embeddings.

    openalign semdedup pairs.parquet --model MODEL --out DIR [--eps 0.05] [--clusters 1024]
                       [--which-to-keep hard|easy]

k-means (FAISS, spherical, seeded) cuts the image embeddings into `clusters` cells; within each cell the images
are ordered by their cosine to its centroid, and an image is removed when its cosine to any image before it in
that order exceeds 1 - eps. This is the paper's rule as its code computes it (the column maxima of the upper
triangle of the cell's similarity matrix), which also removes an image whose near neighbour was itself removed:
in a chain a ~ b ~ c with a and c apart, b and c both go. `--which-to-keep hard` (the paper's default, `keep_hard`;
the option `keep`, whose old flag `--keep` still works, with a note) orders the farthest from the centroid first,
so it is the one of each group that stays; `--which-to-keep easy` keeps the closest. Ties in the order go to the
smaller image key. Only images in one cell are compared: duplicates the k-means
separates are kept (the paper's trade, measured in its Section 3).

Four passes, each resumable: every distinct image embedded in jobs (the evaluation transform, one core per job,
so both engines give the same digits); k-means on the driver over a seeded sample of ~`kmeans_sample` x clusters
embeddings (`--clusters 0`, the default: one cell per 10,000 images), each image drawn by a hash of the seed and its
key in a filter on the engine (`_sample`); each job's images assigned to their nearest centroid, then gathered into
one folder a cell by a shuffle on the engine (`shuffle_cells`); each group of `clusters_per_task` cells deduplicated
in a job that reads only its cells. Writes DIR/keep.parquet (the pairs
whose image stays; `openalign shard --keep`), DIR/clusters.parquet (every image's cell, cosine to its centroid, and
for a removed one the image before it that it duplicates and their cosine), DIR/semdedup_report.json (counts, the
largest cells, the closest removals) and DIR/semdedup_report.png.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign import plots
from openalign.config import ConfigError, Options
from openalign.data import sources
from openalign.data.engine import Engine, Job, driver_duckdb, engine_sql, job_id, read_plan, spark_for
from openalign.data.pairs import sql_path
from openalign.outputs import sources_key, staged
from openalign.pipeline.runner import WORK, Run, Stage, run_stage
from openalign.pipeline.curation.scoring import FINITE, check_model, embed_blobs, kmeans, usable

__all__ = ["SemDedupOptions", "SemDedupResult", "semdedup", "cluster_removals"]

CLUSTERS = "clusters.parquet"
CELL_IMAGES = 10_000  # --clusters 0: a k-means cell per this many images, so a cell's all-pairs cosines stay ~a second
MAX_AUTO_CLUSTERS = 100_000  # ... and at most this many cells (1.8B pairs' 160M images: 16,000 cells)
CELLS = "cells"  # OUT/_work/cells/cell=N/: every assigned image in its cell's folder (the shuffle between the rounds)


def cell_count(clusters: int, images: int) -> int:
    """The k-means cells: as given, or (0) one per CELL_IMAGES images, at least one and at most MAX_AUTO_CLUSTERS."""
    return clusters or max(1, min(MAX_AUTO_CLUSTERS, round(images / CELL_IMAGES)))


@dataclass(frozen=True)
class SemDedupOptions(Options):
    model: str = ""  # a model directory openalign loads (its own, or a CLIP, SigLIP or OpenCLIP checkpoint)
    eps: float = 0.05  # an image goes when its cosine to one before it in its cell exceeds 1 - eps (SemDeDup's eps)
    clusters: int = 0  # k-means cells (at most the number of images); 0: one per CELL_IMAGES images, up to
        # MAX_AUTO_CLUSTERS (SemDeDup: 50,000 cells for LAION-440M's images, ~8,800 each)
    keep: Literal["hard", "easy"] = "hard"  # which of a group stays: the farthest from the centroid (hard, the
        # paper's default) or the closest (easy)
    kmeans_sample: int = 256  # k-means is fitted on ~this many images per cell (each drawn by a seeded hash)
    seed: int = 0  # the k-means sample and initialisation
    clusters_per_task: int = 64  # cells deduplicated per job
    encode_batch: int = 128  # images encoded at once
    workers: int = 0  # local engine: processes, each with its own model on one core (0: one per core)
    examples: int = 10  # closest removals listed in the report
    images_per_task: int = 2_000  # images embedded per job: the unit of distribution, retry and resume

    def spell(self, name: str) -> str:
        return FLAGS.get(name, super().spell(name))

    def cross_field_problems(self) -> list[str]:
        problems = []
        if not 0 < self.eps < 2:
            problems.append(f"--eps {self.eps} must be between 0 and 2 (an image goes when its cosine to an earlier "
                            "one exceeds 1 - eps)")
        if self.clusters < 0:
            problems.append(f"--clusters {self.clusters} must be at least 0 (0: one cell per {CELL_IMAGES:,} images)")
        small = {"--kmeans-sample": self.kmeans_sample,
                 "--clusters-per-task": self.clusters_per_task, "--encode-batch": self.encode_batch,
                 "--images-per-task": self.images_per_task}
        problems += [f"{flag} {value} must be at least 1" for flag, value in small.items() if value < 1]
        if self.workers < 0 or self.examples < 0:
            problems.append("--workers and --examples must be at least 0")
        return problems


FLAGS = {"keep": "--which-to-keep"}  # --keep names a keep-list folder in shard and card: SemDeDup's own word here


@dataclass(frozen=True)
class SemDedupResult:
    """What `semdedup` removed (its report, OUT/semdedup_report.json, holds the same and more)."""

    keep: Path  # OUT/keep.parquet: the uids of the pairs whose image stays
    clusters: Path  # OUT/clusters.parquet: each image's cell and, if removed, what it duplicates
    images: int  # distinct images
    embedded_images: int  # readable ones (the others are kept: nothing decided them)
    cells: int  # k-means cells
    removed_images: int
    removed_pairs: int
    resumed_tasks: int
    seconds: float
    report: dict  # the report as written


def cluster_removals(vectors: np.ndarray, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of one cell in their order: each row's highest cosine to a row before it (-inf for the first)
    and that row's position (-1 for the first); SemDeDup removes the rows whose highest exceeds 1 - eps. Computed a
    block of columns at a time (rows before the block's end), so a cell of n rows needs n x block floats."""
    n = len(vectors)
    best = np.full(n, -np.inf)
    before = np.full(n, -1, np.int64)
    for start in range(1, n, block):
        end = min(n, start + block)
        sims = vectors[start:end] @ vectors[:end].T  # [the block's columns, every row before the block's end]
        width = end - start
        sims[:, start:end][np.triu_indices(width)] = -np.inf  # only rows before each column: the block's own square
        rows = sims.argmax(axis=1)  # (rows before `start` all come before every column of the block)
        best[start:end] = sims[np.arange(width), rows]
        before[start:end] = rows
    return best, before


def embed_task(plan: str, index: int, out_path: str, model_path: str, batch_size: int, threads: int) -> dict:
    """One job: the embedding of each of its images that can be read."""
    rows = read_plan(plan, index)
    embeds, ok = embed_blobs(model_path, (sources.read_bytes(r["path"], r["member"]) for r in rows), batch_size,
                             threads)
    # a vector that is NaN, infinite or zero says nothing of its image (a diverged model): never clustered, so
    # its image is kept, as a NaN score never removes one; faiss's k-means fails on such a vector
    fine = usable(embeds)
    _write(out_path, {"image_key": [rows[i]["image_key"] for i, keep in zip(ok, fine) if keep],
                      "embedding": _vectors(embeds[fine] if len(fine) else embeds)})
    return {"images": len(rows), "unreadable": len(rows) - len(ok), "unusable": int((~fine).sum())}


def _vectors(embeds: np.ndarray) -> pa.Array:
    width = embeds.shape[1] if embeds.ndim == 2 else 0
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(embeds, np.float32).ravel()), width)


def _matrix(column) -> np.ndarray:
    """A column of vectors (Parquet's fixed-size lists; Spark writes them back as lists) as a [rows, width] array."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    flat = column.flatten().to_numpy(zero_copy_only=False)
    width = column.type.list_size if pa.types.is_fixed_size_list(column.type) else (
        len(flat) // len(column) if len(column) else 0)
    return flat.reshape(len(column), width).astype(np.float32)


def _write(path: str, columns: dict) -> None:
    with staged(Path(path), tmp=Path(path + ".tmp")) as tmp:
        pq.write_table(pa.table(columns), tmp)


def assign_task(embeds_path: str, centroids_path: str, out_path: str) -> dict:
    """One job: each image of an embedding file assigned to its nearest centroid, written with its cell and its cosine
    to the centroid (the shuffle then gathers each cell's images into its folder)."""
    from openalign.pipeline.curation.scoring import nearest_cells

    table = pq.read_table(embeds_path)
    vectors = _matrix(table.column("embedding"))
    centroids = np.load(centroids_path)
    cells = nearest_cells(vectors, centroids, 1)[:, 0] if len(vectors) else np.zeros(0, np.int64)
    similarity = np.einsum("ij,ij->i", vectors, centroids[cells]) if len(vectors) else np.zeros(0, np.float32)
    _write(out_path, {"image_key": table.column("image_key"), "cluster": pa.array(cells, pa.int64()),
                      "centroid_similarity": pa.array(similarity.astype(np.float64), pa.float64()),
                      "embedding": _vectors(vectors if len(vectors) else np.zeros((0, centroids.shape[1])))})
    return {"images": len(vectors)}


def shuffle_cells(assigned: list[str], cells: Path, engine: Engine, work: Path) -> None:
    """Every assigned image into its cell's folder, CELLS/cell=N/ (the cell kept in the rows as `cluster`): a
    shuffle on the engine (Spark's, or DuckDB's partitioned write, out of core), so a cell's job reads its cell and
    nothing else. Before: each assign job wrote one file per group of cells (embedding jobs x groups files: 14.4M at
    1.8B pairs), each read by a group's job."""
    import shutil

    shutil.rmtree(cells, ignore_errors=True)
    if engine.name == "spark":
        spark = spark_for(engine, *assigned)
        from pyspark.sql import functions as F

        (spark.read.parquet(*assigned).withColumn("cell", F.col("cluster")).repartition("cell")
         .write.mode("overwrite").partitionBy("cell").parquet(str(cells)))
        return
    with driver_duckdb(engine, work) as con:
        con.execute(f"COPY (SELECT *, cluster AS cell FROM read_parquet(?)) TO '{sql_path(cells)}' "
                    "(FORMAT parquet, PARTITION_BY (cell), OVERWRITE_OR_IGNORE)", [assigned])


def dedup_task(in_paths: list[str], out_path: str, keep: str) -> dict:
    """One job: SemDeDup's rule in each cell of one group (`in_paths`: the cells' folders); writes every image's cell,
    its cosine to the centroid, its highest cosine to an image before it (`score`) and that image (`duplicate_of`)."""
    tables = [pq.read_table(p, partitioning=None) for p in in_paths if Path(p).is_dir()]  # a cell with no image: none
    table = pa.concat_tables(tables, promote_options="permissive") if tables else None
    keys, cells, centroid, score, duplicate = [], [], [], [], []
    if table is not None and table.num_rows:
        vectors = _matrix(table.column("embedding"))
        key = np.array(table.column("image_key").to_pylist(), dtype=object)
        cell = table.column("cluster").to_numpy()
        sim = table.column("centroid_similarity").to_numpy()
        # within a cell: hard, the farthest from the centroid first; easy, the closest; ties to the smaller key
        order = np.lexsort((key, sim if keep == "hard" else -sim, cell))
        bounds = np.flatnonzero(np.r_[True, cell[order][1:] != cell[order][:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            rows = order[lo:hi]
            best, before = cluster_removals(vectors[rows])
            keys += key[rows].tolist()
            cells += cell[rows].tolist()
            centroid += sim[rows].tolist()
            score += [float(b) if b > -np.inf else None for b in best]
            duplicate += [key[rows][b] if b >= 0 else None for b in before]
    _write(out_path, {"image_key": pa.array(keys, pa.string()), "cluster": pa.array(cells, pa.int64()),
                      "centroid_similarity": pa.array(centroid, pa.float64()), "score": pa.array(score, pa.float64()),
                      "duplicate_of": pa.array(duplicate, pa.string())})
    return {"images": len(keys), "cells": len(set(cells))}


SAMPLE_DRAW = {  # an image's draw for k-means' sample: the first 52 bits of md5(seed TAB image_key), on either engine
    "duckdb": "(('0x' || substr(md5(? || chr(9) || image_key), 1, 13))::UBIGINT)",
    "spark": "CAST(conv(substr(md5(concat(?, char(9), image_key)), 1, 13), 16, 10) AS BIGINT)"}
DRAWS = 16 ** 13


def sample_draw(seed: int, image_key: str) -> int:
    """An image's draw, as SAMPLE_DRAW computes it: it is in the sample when below the fraction times DRAWS."""
    return int(hashlib.md5(f"{seed}\t{image_key}".encode()).hexdigest()[:13], 16)


def _sample(files: list[str], images: int, cap: int, seed: int, engine: Engine, work: Path) -> np.ndarray:
    """k-means' sample: each image whose hashed draw (`sample_draw`, seeded) falls under cap / images, ~cap of them
    whatever the table's size, in image-key order, the same on any engine and any run. The draw is a filter on the
    engine (a Spark job over the embedding files; DuckDB locally): only the sample reaches the driver, never a key
    of every image."""
    bound = min(DRAWS, math.floor(DRAWS * cap / images)) if images else 0
    if engine.name == "spark":
        spark = spark_for(engine, *files)
        spark.read.parquet(*files).createOrReplaceTempView("embedded")
        table = spark.sql(f"SELECT image_key, embedding FROM embedded WHERE {SAMPLE_DRAW['spark']} < ?",
                          args=[str(seed), bound]).toArrow()
    else:
        with driver_duckdb(engine, work) as con:
            table = con.sql(f"SELECT image_key, embedding FROM read_parquet(?) WHERE {SAMPLE_DRAW['duckdb']} < ?",
                            params=[files, str(seed), bound]).to_arrow_table()
    if not table.num_rows:
        return np.zeros((0, 1), np.float32)
    table = table.sort_by("image_key")
    column = table.column("embedding").combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).reshape(table.num_rows, -1).astype(np.float32)


def _figure(sizes: list[tuple[int, int, int]], eps: float):
    """Cell size against removals per cell."""
    plt = plots.pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    size = np.array([s for _, s, _ in sizes])
    removed = np.array([r for _, _, r in sizes])
    left.hist(size, bins=min(50, max(1, len(set(size.tolist())))), color="tab:blue")
    left.set(xlabel="images per cell", ylabel="cells", title=f"{len(sizes):,} k-means cells")
    right.scatter(size, removed / np.maximum(size, 1), s=8, alpha=0.6, color="tab:red")
    right.set(xlabel="images per cell", ylabel="share removed", ylim=(-0.02, 1.02),
              title=f"removed within each cell (cosine > {1 - eps:g})")
    return fig


@dataclass(frozen=True)
class SemDedupReport:
    """OUT/semdedup_report.json, after `stage` and `pairs`."""

    model: str
    engine: str
    rule: str
    images: int  # distinct images
    embedded_images: int  # with a usable vector
    unreadable_images: int  # kept: nothing decided them
    unusable_vectors: int  # NaN, infinite or zero: kept, never clustered
    clusters: int  # k-means cells
    removed_images: int
    keep: str
    clusters_file: str
    options: dict
    cells_with_removals: int
    largest_cells: list
    examples: list  # the closest removals
    removed_pairs: int
    model_fingerprint: str
    resumed_tasks: int


class SemDedup(Stage):
    name = "semdedup"
    options = SemDedupOptions
    result = SemDedupResult
    writes = " and clusters.parquet"
    files = (("cells", "clusters"),)
    flags = FLAGS
    deprecated_flags = {"--keep": "keep"}  # the old spelling of --which-to-keep
    first_round = "semdedup: embed"

    def check(self, run: Run) -> None:
        self.fingerprint = check_model(run.options.model, "semdedup")

    def plan(self, run: Run) -> list:
        options = run.options
        key = {"model": self.fingerprint, "encode_batch": options.encode_batch, "stage": "semdedup-embed"}
        return run.image_jobs(embed_task, (str(Path(options.model).resolve()), options.encode_batch, 1), key,
                              options.images_per_task)

    def merge(self, run: Run, embedded: dict) -> SemDedupReport:
        """k-means on the driver over a sample, then two more rounds of jobs: assign, and each group of cells."""
        options, work, embed_files = run.options, run.work, run.score_files
        sample = _sample(embed_files, run.images, options.kmeans_sample * options.clusters, options.seed,
                         run.engine, work)
        if not len(sample):
            raise ConfigError(f"none of the {run.images:,} images of {run.pairs} could be read, or {options.model} "
                              "gives none of them a finite vector (NaN or infinite: a diverged model?)")
        centroids = kmeans(sample, cell_count(options.clusters, run.images), options.seed)
        centroids_path = work / "centroids.npy"
        np.save(centroids_path, centroids)
        digest = hashlib.blake2b(np.ascontiguousarray(centroids).tobytes(), digest_size=16).hexdigest()
        assigned = [str(work / f"assign-{job_id(i)}.parquet") for i in range(len(embed_files))]
        run.jobs([Job(f"assign-{job_id(i)}", assign_task, (embed_files[i], str(centroids_path), assigned[i]),
                      key=sources_key(embed_files[i], digest), outputs=(assigned[i],))
                  for i in range(len(embed_files))], "semdedup: assign")
        cells, shuffled = work / CELLS, sources_key(assigned)
        if (cells / "_inputs.json").is_file() and (cells / "_inputs.json").read_text() != shuffled:
            shutil.rmtree(cells)
        if not (cells / "_inputs.json").is_file():  # a rerun whose assignment is unchanged keeps its cells
            shuffle_cells(assigned, cells, run.engine, work)
            (cells / "_inputs.json").write_text(shuffled)
        groups = -(-len(centroids) // options.clusters_per_task)
        deduped = [str(work / f"cells-{g:04d}.parquet") for g in range(groups)]
        members = [[str(cells / f"cell={c}") for c in range(g * options.clusters_per_task,
                                                           min(len(centroids), (g + 1) * options.clusters_per_task))]
                   for g in range(groups)]
        run.jobs([Job(f"cells-{g:04d}", dedup_task, (members[g], deduped[g], options.keep),
                      key=sources_key(shuffled, members[g], options.keep), outputs=(deduped[g],))
                  for g in range(groups)], "semdedup: cells")
        where = f"{FINITE} AND score > {1 - options.eps!r}"
        removed_pairs = run.keep_without(where, deduped)
        report, self.sizes = _report(run.out, run.pairs, deduped, where, options, run.images, len(centroids),
                                     embedded, run.engine)
        return SemDedupReport(**report, removed_pairs=removed_pairs, model_fingerprint=self.fingerprint,
                              resumed_tasks=run.resumed)

    def figure(self, run: Run, report: SemDedupReport):
        return _figure(self.sizes, run.options.eps)

    def result_fields(self, run: Run, report: SemDedupReport) -> dict:
        return {"clusters": run.out / CLUSTERS, "cells": report.clusters}

    def summary(self, result: SemDedupResult, options: SemDedupOptions) -> list[str]:
        return [f"{result.removed_images:,} of {result.embedded_images:,} images ({result.removed_pairs:,} pairs) are "
                f"semantic near-duplicates within their k-means cell ({result.cells:,} cells; "
                f"{result.images - result.embedded_images:,} unreadable, kept)"]


def semdedup(pairs: Path, out: Path, options: SemDedupOptions, progress: bool = True,
             engine: Engine = Engine()) -> SemDedupResult:
    """Embed every image in jobs, fit k-means on a sample, assign, then apply SemDeDup's rule within each cell;
    write the keep-list of the pairs whose image stays."""
    return run_stage(SemDedup(), pairs, out, options, progress, engine)


def _report(out: Path, pairs: str, deduped: list[str], where: str, options: SemDedupOptions, count: int, cells: int,
            embedded: dict, engine: Engine) -> tuple[dict, list]:
    """OUT/clusters.parquet, the report's counts, largest cells and closest removals, and each cell's (cluster,
    size, removed) for the figure: SQL on the engine (Spark SQL, or DuckDB on the driver), one row per image written,
    one row per cell and the closest removals' few rows back."""
    with engine_sql(engine, out / WORK, *deduped) as sql:
        sql.source("cells", deduped)
        sql.table("c", f"""SELECT image_key, cluster, centroid_similarity,
                               CASE WHEN {where} THEN duplicate_of END AS duplicate_of,
                               CASE WHEN {where} THEN score END AS similarity, coalesce({where}, false) AS removed
                           FROM cells""")
        if (out / CLUSTERS).is_dir():  # an earlier run's, on the other engine
            shutil.rmtree(out / CLUSTERS)
        (out / CLUSTERS).unlink(missing_ok=True)
        if sql.spark is not None:  # the table's parts, each sorted, in image-key order
            sql.frame("SELECT * FROM c ORDER BY image_key").write.mode("overwrite").parquet(str(out / CLUSTERS))
        else:
            sql.con.execute(f"COPY (SELECT * FROM c ORDER BY image_key) TO '{sql_path(out / CLUSTERS)}' "
                            "(FORMAT parquet)")
        n, removed = sql.rows("SELECT count(*), count(*) FILTER (WHERE removed) FROM c")[0]
        sizes = [tuple(r) for r in sql.rows("SELECT cluster, count(*), count(*) FILTER (WHERE removed) FROM c "
                                            "GROUP BY cluster ORDER BY cluster")]
        closest = sql.rows(f"SELECT image_key, duplicate_of, similarity, cluster FROM c WHERE removed ORDER BY "
                           f"similarity DESC, image_key LIMIT {int(options.examples)}") if options.examples else []
        keys = sorted({k for row in closest for k in row[:2]})
        images = {}
        if keys:
            sql.source("pairs", pairs)
            images = dict(sql.rows(f"SELECT image_key, min(coalesce(member, path)) FROM pairs WHERE image_key IN "
                                   f"({', '.join('?' for _ in keys)}) GROUP BY image_key", keys))
    closest = [(images.get(a), images.get(b), similarity, cell) for a, b, similarity, cell in closest]
    largest = sorted(sizes, key=lambda s: (-s[1], s[0]))[:10]
    return {
        "model": options.model, "engine": engine.name,
        "rule": (f"cosine > {1 - options.eps:g} to an image before it in its k-means cell, the "
                 f"{'farthest from' if options.keep == 'hard' else 'closest to'} the centroid first (SemDeDup)"),
        "images": count, "embedded_images": int(n),
        "unreadable_images": sum(r["unreadable"] for r in embedded.values()),
        "unusable_vectors": sum(r.get("unusable", 0) for r in embedded.values()),
        "clusters": cells, "removed_images": int(removed), "keep": str(out / "keep.parquet"),
        "clusters_file": str(out / CLUSTERS), "options": asdict(options),
        "cells_with_removals": sum(1 for _, _, r in sizes if r),
        "largest_cells": [{"cluster": c, "images": s, "removed": r} for c, s, r in largest],
        "examples": [{"removed": a, "duplicate_of": b, "similarity": s, "cluster": c} for a, b, s, c in closest],
    }, sizes
