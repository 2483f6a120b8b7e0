"""Keep the pairs a model says match: the cosine between a pair's image and text embeddings (CLIP-score filtering).

    openalign score pairs.parquet --model MODEL (--keep-fraction 0.3 | --min-score 0.25) --out DIR

ALIGN filters by frequency alone; DataComp's strongest simple baseline keeps the 30% of pairs that a CLIP model
scores highest (its `baselines/apply_filter.py`). Any model openalign loads scores here: its own, or a CLIP or
SigLIP or OpenCLIP checkpoint as it is released (`openalign.load`). Every distinct image is encoded once and every
distinct text once per job of images (the evaluation transform; texts truncated to the model's max_length), and
a pair's score is the dot product of the two unit vectors.

- `--keep-fraction F` keeps exactly k = floor(F x N) pairs of the table's N (F read as the decimal it is written
  as), the highest scores first, ties broken by the smaller uid: a rerun and the Spark engine keep the same pairs.
  A pair without a score (its image unreadable, its text empty) is never kept, so fewer than k are kept when fewer
  than k have one.
- `--min-score S` keeps every pair scoring at least S.

Writes DIR/scores.parquet (uid, score, model: the model's fingerprint; keyed by both, so scores of several models
can be joined), DIR/keep.parquet (the kept uids; intersect with other keep-lists in `openalign shard --keep`),
DIR/score_report.json (counts, percentiles, the threshold each fraction implies, examples at each cut) and
DIR/score_report.png (the histogram). A rerun with only another cut reuses the scores; a changed table or model
scores again.
"""

from __future__ import annotations

import json
import math
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign import plots
from openalign.config import ConfigError, Options
from openalign.data import sources
from openalign.data.engine import Engine, driver_duckdb, read_plan, spark_for
from openalign.data.pairs import IMAGE_COLUMNS, sql_path, write_keep_duckdb, write_keep_spark
from openalign.outputs import sources_key, staged
from openalign.pipeline.runner import WORK, Run, Stage, run_stage, table_counts
from openalign.pipeline.curation import ranks
from openalign.pipeline.curation.scoring import FINITE, PERCENTILES, check_model, embed_blobs, model_for, usable

__all__ = ["ScoreOptions", "ScoreResult", "score"]

SCORES = "scores.parquet"
CUTS = (0.9, 0.7, 0.5, 0.3, 0.1)  # the fractions whose threshold and border examples the report shows
RANK = "score DESC, uid ASC"  # the order of keeping: highest score first, ties to the smaller uid
PERCENTILE_METHOD = ("exact: each rank selected on the engine by histogram passes, without a sort (ranks.py); "
                     "linear between ranks, as numpy's percentile")


@dataclass(frozen=True)
class ScoreOptions(Options):
    model: str = ""  # a model directory openalign loads: its own, or a CLIP, SigLIP or OpenCLIP checkpoint
    keep_fraction: float | None = None  # keep this fraction of the table's pairs, highest scores first (DataComp: 0.3)
    min_score: float | None = None  # or: keep every pair whose cosine is at least this
    encode_batch: int = 128  # images or texts encoded at once
    workers: int = 0  # local engine: processes, each with its own model on one core (0: one per core)
    examples: int = 6  # pairs shown at each cut in the report
    images_per_task: int = 2_000  # the unit of distribution, retry and resume

    def cross_field_problems(self) -> list[str]:
        problems = []
        if self.keep_fraction is not None and not 0 < self.keep_fraction <= 1:
            problems.append(f"--keep-fraction {self.keep_fraction} must be in (0, 1]")
        if self.min_score is not None and not math.isfinite(self.min_score):
            problems.append(f"--min-score {self.min_score} must be a finite number")
        if min(self.encode_batch, self.images_per_task) < 1 or min(self.workers, self.examples) < 0:
            problems.append("--encode-batch and --images-per-task must be at least 1, --workers and --examples at "
                            "least 0")
        return problems


@dataclass(frozen=True)
class ScoreResult:
    """What `score` kept (its report, OUT/score_report.json, holds the same and more)."""

    keep: Path  # OUT/keep.parquet: the uids of the kept pairs
    scores: Path  # OUT/scores.parquet: (uid, score, model) of every pair with a score
    rule: str  # what was kept
    pairs: int  # distinct pairs of the table
    scored_pairs: int  # with a finite score
    kept_pairs: int
    threshold: float | None  # the lowest kept score
    reused_scores: bool  # a rerun that changed only the cut
    seconds: float
    report: dict  # the report as written


def score_task(plan: str, index: int, scores_path: str, model_path: str, batch_size: int, threads: int) -> dict:
    """One job: each pair's cosine between its image's and its text's embeddings (None: the image is unreadable
    or the text empty); each image and each distinct text of the job encoded once."""
    from openalign.model.encode import encode_texts

    rows = read_plan(plan, index, pairs=True)
    embeds, ok = embed_blobs(model_path, (sources.read_bytes(r["path"], r["member"]) for r in rows), batch_size,
                             threads)
    image_row = {i: row for row, i in enumerate(ok)}
    model, tokenizer, cfg = model_for(model_path, threads)
    texts = sorted({t for r in rows for t in r["texts"] if t and t.strip()})
    text_row = {t: i for i, t in enumerate(texts)}
    vectors = encode_texts(model, tokenizer, texts, batch_size, cfg.model.text.max_length).numpy() if texts else None
    # a vector that is NaN, infinite or zero (a diverged model) measures nothing: its pairs get no score (a zero
    # vector's cosine would be a finite 0, ranked as if it were one)
    image_ok, text_ok = usable(embeds), usable(vectors)
    uids, scores = [], []
    for i, r in enumerate(rows):
        for uid, text in zip(r["uids"], r["texts"]):
            uids.append(uid)
            j = text_row.get(text) if text else None
            scored = i in image_row and j is not None and image_ok[image_row[i]] and text_ok[j]
            scores.append(float(embeds[image_row[i]] @ vectors[j]) if scored else None)
    table = pa.table({"uid": pa.array(uids, pa.string()), "score": pa.array(scores, pa.float64())})
    with staged(Path(scores_path), tmp=Path(scores_path + ".tmp")) as tmp:
        pq.write_table(table, tmp)
    return {"images": len(rows), "unreadable": len(rows) - len(ok), "texts": len(texts),
            "unscored": sum(s is None for s in scores),
            "unusable_vectors": int((~image_ok).sum() + (~text_ok).sum())}


def keep_count(fraction: float, pairs: int) -> int:
    """floor(fraction x pairs), the fraction read as the decimal it is written as (0.29 x 100 is 29, not 28)."""
    return math.floor(Decimal(repr(float(fraction))) * pairs)


def _scores_match(path: Path, inputs: str) -> bool:
    """Whether OUT/scores.parquet holds the scores of these inputs (its metadata names their fingerprint)."""
    meta = path / "_inputs.json" if path.is_dir() else path.with_name(path.name + ".inputs.json")
    try:
        return json.loads(meta.read_text())["inputs"] == inputs
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_scores(job_files: list[str], path: Path, fingerprint: str, inputs: str, engine: Engine) -> None:
    """The jobs' scores as one table (uid, score, model) in uid order, then the fingerprint of its inputs."""
    meta = path.with_name(path.name + ".inputs.json")
    meta.unlink(missing_ok=True)
    if path.is_dir():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    if engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_for(engine, *job_files)
        (spark.read.parquet(*job_files).where("score IS NOT NULL").withColumn("model", F.lit(fingerprint))
         .orderBy("uid").write.mode("overwrite").parquet(str(path)))
        meta = path / "_inputs.json"
    else:
        with driver_duckdb(engine, path.parent / WORK) as con:
            con.execute(f"COPY (SELECT uid, score, ? AS model FROM read_parquet(?) WHERE score IS NOT NULL "
                        f"ORDER BY uid) TO '{sql_path(path)}' (FORMAT parquet)", [fingerprint, job_files])
    meta.write_text(json.dumps({"inputs": inputs}) + "\n")


def _source(path: Path) -> str:
    return str(path / "*.parquet") if path.is_dir() else str(path)


@contextmanager
def _opened(scores: Path, engine: Engine, work: Path):
    """The finite scores on the engine: (their view for `ranks.select` and the report's queries, a function that
    writes the keep-list of the scores a condition holds and returns its uids)."""
    if engine.name == "spark":
        spark = spark_for(engine, scores)
        view = ranks.spark_view(spark, spark.read.parquet(str(scores)), FINITE)

        def keep(where: str, params: list, path: Path) -> int:
            return write_keep_spark(spark.sql(f"SELECT uid FROM ranked_scores WHERE {where}", args=params), path)

        yield view, keep
        return
    with driver_duckdb(engine, work) as con:
        view = ranks.duckdb_view(con, _source(scores), FINITE)

        def keep(where: str, params: list, path: Path) -> int:
            return write_keep_duckdb(con, f"SELECT uid FROM ranked_scores WHERE {where}", params, path)

        yield view, keep


def _cut(k: int, scored: int, found: dict) -> tuple[str, list]:
    """The condition that keeps the first k finite scores in RANK order, from the pair at rank k."""
    if k <= 0:
        return "false", []
    if k >= scored:
        return "true", []
    score_k, uid_k = found[k]
    return "score > ? OR (score = ? AND uid <= ?)", [score_k, score_k, uid_k]


def _write_keep(scores: Path, out: Path, where: str, limit: int | None, engine: Engine) -> int:
    """OUT/keep.parquet: the uids of the finite scores `where` holds (a condition on `score`, `uid`), the first
    `limit` of them in RANK order (None: all), selected without sorting (ranks.py); returns how many."""
    with _opened(scores, engine, out / WORK) as (view, keep):
        if limit is None:
            return keep(where, [], out / "keep.parquet")
        scored = view.stats()[0]
        k = min(int(limit), scored)
        condition, params = _cut(k, scored, ranks.select(view, [k]))
        return keep(f"({where}) AND ({condition})", params, out / "keep.parquet")


def _border_ranks(k: int, scored: int, examples: int) -> range:
    half = examples // 2
    return range(max(1, k - (examples - half) + 1), min(scored, k + half) + 1)


def _select_and_keep(scores: Path, out: Path, n_pairs: int, options: ScoreOptions, engine: Engine) -> dict:
    """The keep-list of this run's cut and, from the same passes over the scores (ranks.py), the report's numbers:
    percentiles (exact), a 50-bin histogram, each cut's threshold and the pairs at its border."""
    fractions = sorted({*CUTS, *([options.keep_fraction] if options.keep_fraction is not None else [])}, reverse=True)
    with _opened(scores, engine, out / WORK) as (view, keep):
        scored, low, high = view.stats()
        cut_ranks = {f: min(keep_count(f, n_pairs), scored) for f in fractions}
        borders = [_border_ranks(k, scored, options.examples) for k in cut_ranks.values()]
        wanted = ranks.percentile_ranks(scored, PERCENTILES).union(*borders, {k for k in cut_ranks.values() if k})
        found = ranks.select(view, wanted)
        if options.keep_fraction is not None:
            k = cut_ranks[options.keep_fraction]
            kept = keep(*_cut(k, scored, found), out / "keep.parquet")
            threshold = found[k][0] if k else None
        else:
            kept = keep("score >= ?", [float(options.min_score)], out / "keep.parquet")
            threshold = view.query("SELECT min(score) FROM ranked_scores WHERE score >= ?",
                                   [float(options.min_score)])[0][0]
        width = (high - low) / 50 if scored and high > low else 1.0
        bins = dict(view.query("SELECT CAST(least(floor((score - ?) / ?), 49) AS BIGINT), count(*) FROM ranked_scores "
                               "GROUP BY 1", [low or 0.0, width])) if scored else {}
    percentiles = {f"p{q:g}": ranks.percentile(found, scored, q) for q in PERCENTILES} if scored else {}
    cuts = [{"fraction": f, "kept": k, "threshold": found[k][0] if k else None,
             "border": [{"rank": r, "kept": r <= k, "score": found[r][0], "uid": found[r][1]}
                        for r in _border_ranks(k, scored, options.examples)]}
            for f, k in cut_ranks.items()]
    return {"scored": int(scored), "kept": int(kept), "threshold": threshold, "percentiles": percentiles,
            "histogram": {"low": low, "width": width, "counts": [int(bins.get(b, 0)) for b in range(50)]},
            "cuts": cuts}


def describe(pairs: str, uids: list[str], engine: Engine, work: Path) -> dict[str, dict]:
    """{uid: {image, text}} of a few pairs of the table (the Spark engine reads a table only the cluster can)."""
    if not uids:
        return {}
    if engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_for(engine, pairs)
        rows = (spark.read.parquet(pairs).where(F.col("uid").isin(uids))
                .select("uid", "text", F.coalesce("member", "path").alias("image")).collect())
    else:
        with driver_duckdb(engine, work) as con:
            rows = con.execute("SELECT uid, text, coalesce(member, path) FROM read_parquet(?) WHERE uid IN "
                               "(SELECT unnest(?::VARCHAR[]))", [pairs, uids]).fetchall()
    return {uid: {"image": image, "text": text} for uid, text, image in rows}


def _figure(summary: dict, threshold: float | None, title: str):
    plt = plots.pyplot()

    hist = summary["histogram"]
    if hist["low"] is None:  # no finite score: nothing to draw (never NaN edges)
        hist = {"low": 0.0, "width": 1.0, "counts": []}
    edges = hist["low"] + hist["width"] * np.arange(len(hist["counts"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(edges, hist["counts"], width=hist["width"], align="edge", color="tab:blue", alpha=0.8)
    for cut in summary["cuts"]:
        if cut["threshold"] is not None:
            ax.axvline(cut["threshold"], color="grey", lw=0.8, ls=":")
            ax.text(cut["threshold"], ax.get_ylim()[1] * 0.95, f"top {cut['fraction']:g}", rotation=90, fontsize=7,
                    va="top", ha="right", color="grey")
    if threshold is not None:
        ax.axvline(threshold, color="tab:red", lw=1.5, label=f"this cut: {threshold:.3f}")
        ax.legend()
    ax.set(xlabel="image-text cosine", ylabel="pairs", title=title)
    return fig


@dataclass(frozen=True)
class ScoreReport:
    """OUT/score_report.json, after `stage` and `pairs`."""

    model: str
    model_fingerprint: str
    engine: str
    rule: str  # what was kept
    keep_fraction: float | None
    min_score: float | None
    tie_break: str
    total_pairs: int  # distinct pairs of the table
    images: int  # distinct images
    scored_pairs: int  # with a finite score
    unscored_pairs: int
    unreadable_images: int | None  # None: the scores were reused
    kept_pairs: int
    removed_pairs: int
    threshold: float | None  # the lowest kept score
    reused_scores: bool  # a rerun that changed only the cut
    scores: str
    keep: str
    percentiles: dict
    percentile_method: str  # how the percentiles and the cuts were found (exact, on the engine)
    cuts: list  # each fraction's threshold and the pairs at its border
    histogram: dict  # 50 bins: low, width, counts
    options: dict


class Score(Stage):
    name = "score"
    options = ScoreOptions
    result = ScoreResult
    columns = (*IMAGE_COLUMNS, "text")
    writes = " and scores.parquet"
    files = (("scores", "scores"),)

    def check(self, run: Run) -> None:
        self.fingerprint = check_model(run.options.model, "score", texts=True)
        if (run.options.keep_fraction is None) == (run.options.min_score is None):
            raise ConfigError("give one of --keep-fraction F (the top fraction of pairs) and --min-score S (a cosine)")

    def plan(self, run: Run) -> list:
        options, pairs = run.options, run.pairs
        self.key = {"model": self.fingerprint, "encode_batch": options.encode_batch, "stage": "score"}
        self.inputs = sources_key(pairs if "://" in pairs else str(Path(pairs).resolve()), self.key,
                                  options.images_per_task, run.engine.name)
        self.reused = _scores_match(run.out / SCORES, self.inputs)
        if self.reused:
            return []
        threads = 1  # a job's scores do not depend on the engine or the machine: a sum splits by the thread count
        return run.image_jobs(score_task, (str(Path(options.model).resolve()), options.encode_batch, threads),
                              self.key, options.images_per_task, with_pairs=True)

    def merge(self, run: Run, results: dict) -> ScoreReport:
        options, pairs, engine = run.options, run.pairs, run.engine
        scores_path = run.out / SCORES
        if not self.reused:
            _write_scores(run.score_files, scores_path, self.fingerprint, self.inputs, engine)
        n_pairs, n_images = table_counts(pairs, engine, run.work)
        if options.keep_fraction is not None:
            rule = (f"the top {options.keep_fraction:g} of {n_pairs:,} pairs by cosine "
                    f"({keep_count(options.keep_fraction, n_pairs):,})")
        else:
            rule = f"cosine >= {options.min_score!r}"
        summary = _select_and_keep(scores_path, run.out, n_pairs, options, engine)
        shown = describe(pairs, sorted({e["uid"] for cut in summary["cuts"] for e in cut["border"]}), engine, run.work)
        for cut in summary["cuts"]:
            for example in cut["border"]:
                example.update(shown.get(example["uid"], {}))
        if n_pairs and not summary["scored"]:
            raise ConfigError(f"none of the {n_pairs:,} pairs of {pairs} has a finite score under {options.model} "
                              "(its vectors are NaN or infinite: a diverged model?); nothing was kept, and "
                              f"{scores_path} holds the scores")
        kept, threshold = summary["kept"], summary["threshold"]
        return ScoreReport(
            model=options.model, model_fingerprint=self.fingerprint, engine=engine.name, rule=rule,
            keep_fraction=options.keep_fraction, min_score=options.min_score, tie_break="the smaller uid",
            total_pairs=int(n_pairs), images=int(n_images), scored_pairs=summary["scored"],
            unscored_pairs=int(n_pairs) - summary["scored"],
            unreadable_images=sum(r["unreadable"] for r in results.values()) if results else None,
            kept_pairs=int(kept), removed_pairs=int(n_pairs) - int(kept), threshold=threshold,
            reused_scores=self.reused, scores=str(scores_path), keep=str(run.keep),
            percentiles=summary["percentiles"], percentile_method=PERCENTILE_METHOD, cuts=summary["cuts"],
            histogram=summary["histogram"], options=asdict(options))

    def figure(self, run: Run, report: ScoreReport):
        scorer = Path(run.options.model).resolve()
        return _figure({"histogram": report.histogram, "cuts": report.cuts}, report.threshold,
                       f"{report.scored_pairs:,} pairs scored by {scorer.parent.name}/{scorer.name}")

    def result_fields(self, run: Run, report: ScoreReport) -> dict:
        return {"scores": run.out / SCORES, "pairs": report.total_pairs}

    def summary(self, result: ScoreResult, options: ScoreOptions) -> list[str]:
        threshold = f"; the lowest kept score is {result.threshold:.4f}" if result.threshold is not None else ""
        return [f"kept {result.kept_pairs:,} of {result.pairs:,} pairs ({result.scored_pairs:,} scored): {result.rule}"
                f"{threshold}" + (" (scores reused)" if result.reused_scores else "")]


def score(pairs: Path, out: Path, options: ScoreOptions, progress: bool = True,
          engine: Engine = Engine()) -> ScoreResult:
    """Score every pair in jobs of `images_per_task` images (local processes or Spark), write the scores, then
    keep the top fraction or those at or above the minimum."""
    return run_stage(Score(), pairs, out, options, progress, engine)
