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
so both engines give the same digits); k-means on the driver over a seeded sample of at most
`kmeans_sample` x clusters embeddings; each job's images assigned to their nearest centroid and written out by
group of `clusters_per_task` cells; each group's cells deduplicated in a job. Writes DIR/keep.parquet (the pairs
whose image stays; `openalign shard --keep`), DIR/clusters.parquet (every image's cell, cosine to its centroid, and
for a removed one the image before it that it duplicates and their cosine), DIR/semdedup_report.json (counts, the
largest cells, the closest removals) and DIR/semdedup_report.png.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign import plots
from openalign.config import ConfigError, Options
from openalign.data import sources
from openalign.data.engine import Engine, Job, driver_duckdb, job_id, read_plan
from openalign.data.pairs import sql_path
from openalign.outputs import sources_key, staged
from openalign.pipeline.runner import WORK, Run, Stage, run_stage
from openalign.pipeline.curation.scoring import FINITE, check_model, embed_blobs, kmeans, usable

__all__ = ["SemDedupOptions", "SemDedupResult", "semdedup", "cluster_removals"]

CLUSTERS = "clusters.parquet"


@dataclass(frozen=True)
class SemDedupOptions(Options):
    model: str = ""  # a model directory openalign loads (its own, or a CLIP, SigLIP or OpenCLIP checkpoint)
    eps: float = 0.05  # an image goes when its cosine to one before it in its cell exceeds 1 - eps (SemDeDup's eps)
    clusters: int = 1024  # k-means cells (at most the number of images)
    keep: Literal["hard", "easy"] = "hard"  # which of a group stays: the farthest from the centroid (hard, the
        # paper's default) or the closest (easy)
    kmeans_sample: int = 256  # k-means is fitted on at most this many images per cell (a seeded sample)
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
        small = {"--clusters": self.clusters, "--kmeans-sample": self.kmeans_sample,
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
        sims = vectors[:end] @ vectors[start:end].T  # [rows before the block's end, block columns]
        sims[np.arange(end)[:, None] >= np.arange(start, end)[None, :]] = -np.inf  # only rows before each column
        rows = sims.argmax(axis=0)
        best[start:end] = sims[rows, np.arange(end - start)]
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
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    width = column.type.list_size
    return column.flatten().to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.float32)


def _write(path: str, columns: dict) -> None:
    with staged(Path(path), tmp=Path(path + ".tmp")) as tmp:
        pq.write_table(pa.table(columns), tmp)


def assign_task(embeds_path: str, centroids_path: str, out_paths: list[str], clusters_per_task: int) -> dict:
    """One job: each image of an embedding file assigned to its nearest centroid, written to the file of its group
    of cells (every group's file is written, empty or not)."""
    from openalign.pipeline.curation.scoring import nearest_cells

    table = pq.read_table(embeds_path)
    vectors = _matrix(table.column("embedding"))
    centroids = np.load(centroids_path)
    cells = nearest_cells(vectors, centroids, 1)[:, 0] if len(vectors) else np.zeros(0, np.int64)
    similarity = np.einsum("ij,ij->i", vectors, centroids[cells]) if len(vectors) else np.zeros(0, np.float32)
    groups = cells // clusters_per_task
    keys = np.array(table.column("image_key").to_pylist(), dtype=object)
    for group, path in enumerate(out_paths):
        chosen = np.flatnonzero(groups == group)
        _write(path, {"image_key": pa.array(keys[chosen].tolist(), pa.string()),
                      "cluster": pa.array(cells[chosen], pa.int64()),
                      "centroid_similarity": pa.array(similarity[chosen].astype(np.float64), pa.float64()),
                      "embedding": _vectors(vectors[chosen] if len(chosen) else np.zeros((0, centroids.shape[1])))})
    return {"images": len(vectors)}


def dedup_task(in_paths: list[str], out_path: str, keep: str) -> dict:
    """One job: SemDeDup's rule in each cell of one group; writes every image's cell, its cosine to the centroid,
    its highest cosine to an image before it (`score`) and that image (`duplicate_of`)."""
    table = pa.concat_tables([pq.read_table(p) for p in in_paths]) if in_paths else None
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


def _sample(files: list[str], cap: int, seed: int) -> np.ndarray:
    """A seeded sample of at most `cap` embeddings from the jobs' files, in image-key order (the same on any
    engine and any run)."""
    keys = sorted(k for f in files for k in pq.read_table(f, columns=["image_key"]).column("image_key").to_pylist())
    if len(keys) > cap:
        keys = sorted(np.random.default_rng(seed).choice(np.array(keys, dtype=object), cap, replace=False).tolist())
    chosen = set(keys)
    found = {}
    for f in files:
        table = pq.read_table(f)
        vectors = _matrix(table.column("embedding"))
        for key, vector in zip(table.column("image_key").to_pylist(), vectors):
            if key in chosen:
                found[key] = vector
    return np.stack([found[k] for k in keys]) if keys else np.zeros((0, 1), np.float32)


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
        sample = _sample(embed_files, options.kmeans_sample * options.clusters, options.seed)
        if not len(sample):
            raise ConfigError(f"none of the {run.images:,} images of {run.pairs} could be read, or {options.model} "
                              "gives none of them a finite vector (NaN or infinite: a diverged model?)")
        centroids = kmeans(sample, options.clusters, options.seed)
        centroids_path = work / "centroids.npy"
        np.save(centroids_path, centroids)
        digest = hashlib.blake2b(np.ascontiguousarray(centroids).tobytes(), digest_size=16).hexdigest()
        groups = -(-len(centroids) // options.clusters_per_task)
        assigned = [[str(work / f"assign-{job_id(i)}-{g:04d}.parquet") for g in range(groups)]
                    for i in range(len(embed_files))]
        run.jobs([Job(f"assign-{job_id(i)}", assign_task, (embed_files[i], str(centroids_path), assigned[i],
                                                           options.clusters_per_task),
                      key=sources_key(embed_files[i], digest, options.clusters_per_task), outputs=tuple(assigned[i]))
                  for i in range(len(embed_files))], "semdedup: assign")
        deduped = [str(work / f"cells-{g:04d}.parquet") for g in range(groups)]
        run.jobs([Job(f"cells-{g:04d}", dedup_task, ([a[g] for a in assigned], deduped[g], options.keep),
                      key=sources_key([a[g] for a in assigned], options.keep), outputs=(deduped[g],))
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
    size, removed) for the figure (DuckDB, on the driver: one row per image, no vectors)."""
    with driver_duckdb(engine, out / WORK) as con:
        con.execute(f"""CREATE TEMP TABLE c AS SELECT image_key, cluster, centroid_similarity,
                               CASE WHEN {where} THEN duplicate_of END AS duplicate_of,
                               CASE WHEN {where} THEN score END AS similarity, coalesce({where}, false) AS removed
                        FROM read_parquet(?)""", [deduped])
        con.execute(f"COPY (SELECT * FROM c ORDER BY image_key) TO '{sql_path(out / CLUSTERS)}' (FORMAT parquet)")
        n, removed = con.execute("SELECT count(*), count(*) FILTER (WHERE removed) FROM c").fetchone()
        sizes = con.execute("SELECT cluster, count(*), count(*) FILTER (WHERE removed) FROM c GROUP BY cluster "
                            "ORDER BY cluster").fetchall()
        con.execute("CREATE TEMP TABLE p AS SELECT image_key, min(coalesce(member, path)) AS image "
                    "FROM read_parquet(?) WHERE image_key IN (SELECT image_key FROM c WHERE removed UNION "
                    "SELECT duplicate_of FROM c WHERE removed) GROUP BY image_key", [pairs])
        closest = con.execute("""SELECT a.image, b.image, c.similarity, c.cluster FROM c
                                 JOIN p a ON a.image_key = c.image_key JOIN p b ON b.image_key = c.duplicate_of
                                 WHERE c.removed ORDER BY c.similarity DESC, c.image_key LIMIT ?""",
                              [options.examples]).fetchall()
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
