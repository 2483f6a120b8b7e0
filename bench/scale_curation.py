"""P19, the curation half: the global steps of dedup, score, semdedup, balance, card and shard at N and 10N pairs.

As bench/scale.py for the web side: each step runs in a fresh process on generated inputs that stand for what its
tasks wrote (their model work is measured elsewhere: P11, P13), and reports its wall time and its driver's peak
resident memory (the Python driver's VmHWM; on Spark local[2] the JVM holds the driver and the executors, its peak is
beside). N pairs of N/3 images:

- **dedup** (screen's are the same steps): the plan of the images; the keep-list of the pairs whose image a score
  file removes; the report (counts, examples, exact percentiles);
- **score**: the plan of the images with their pairs; the jobs' scores into scores.parquet; the distinct counts;
  the cut at 30% (rank selection, ranks.py) and its keep-list; the report's cuts and percentiles; the border pairs'
  texts;
- **semdedup sample**: k-means' sample drawn from the embedding files (d=16) and k-means on it, with the cell count
  semdedup picks (one per 10,000 images);
- **semdedup cells**: the assign tasks, the shuffle into one folder a cell, the cells' tasks, the keep-list and the
  report;
- **balance**: the texts' plan, the counts per metadata entry (50,000 entries), the sampling tasks, the keep-list and
  the report (the matching's tasks are replaced by their generated outputs);
- **card**: the card of the table and two keep-lists, one a balance's with its matches;
- **shard plan**: the kept images of two keep-lists, grouped and numbered into shards of 10,000.

    .venv/bin/python bench/scale_curation.py [--rows 5000000] [--factor 10] [--engines local,spark] [--dir /tmp/p19c]

Writes its table into docs/benchmarks.md (`P19-curation`); each measurement is kept in DIR/results.json, so a rerun of
some steps or one engine keeps the others' lines; `--steps ""` writes the table alone. The generated inputs take ~0.4
KB a pair on disk (10N = 50M pairs: ~20 GB with the outputs; each size is removed after its steps).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from _common import (generated, jvm_peak_mib, p19_arguments, table_head, peak_rss_mib, ratio_row, record, step_setup,
                     write_section)

ROWS_PER_FILE = 60_000  # pairs a generated file (a task's output): 20,000 images
LOCAL_MEMORY = "512M"  # the local engine's driver DuckDB limit
ENTRIES = 50_000  # balance's metadata entries
DIM = 16  # the generated embeddings' width (the steps' cost per vector is linear in it)
STEPS = ("dedup", "score", "semdedup sample", "semdedup cells", "balance", "card", "shard plan")


def generate(rows: int, folder: Path) -> None:
    """The pair table's parts, two keep-lists, and per file: dedup's scores, score's jobs' scores, semdedup's
    embeddings, balance's matches; a balance folder (metadata, matches, keep-list, report) for the card."""
    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from openalign.data.pairs import write_keep_duckdb, write_keep_report

    for name in ("pairs", "dedup-scores", "score-jobs", "embeds", "matches"):
        (folder / name).mkdir(parents=True)
    with duckdb.connect(config={"threads": 2}) as con:
        for i, start in enumerate(range(0, rows, ROWS_PER_FILE)):
            stop = min(rows, start + ROWS_PER_FILE)
            con.execute(f"""COPY (SELECT md5('p' || g) AS uid, md5('i' || (g // 3)) AS image_key,
                'an alt text about thing number ' || (g % 100003) || ' and more ' || g AS text,
                (200 + g % 400)::INTEGER AS width, (150 + g % 300)::INTEGER AS height,
                '/data/shards/' || (g // 30000) || '.tar' AS path, ((g // 3) % 10000) || '.jpg' AS member,
                'https://h' || (g % 9973) || '.example.com/' || g || '.jpg' AS url, 'en' AS language
                FROM range({start}, {stop}) t(g)) TO '{folder / "pairs" / f"part-{i:06d}.parquet"}' (FORMAT parquet)""")
            con.execute(f"""COPY (SELECT DISTINCT md5('i' || (g // 3)) AS image_key,
                (hash(g // 3) % 1000003) / 1000003.0 AS score, (hash(g // 3) % 97)::BIGINT AS match
                FROM range({start}, {stop}) t(g)) TO '{folder / "dedup-scores" / f"scores-{i:06d}.parquet"}'
                (FORMAT parquet)""")
            con.execute(f"""COPY (SELECT md5('p' || g) AS uid, CASE WHEN g % 10007 = 0 THEN NULL
                ELSE ((hash(g) % 2000003) / 2000003.0 - 0.3) END AS score FROM range({start}, {stop}) t(g))
                TO '{folder / "score-jobs" / f"scores-{i:06d}.parquet"}' (FORMAT parquet)""")
            con.execute(f"""COPY (SELECT md5('p' || g) AS uid, CASE WHEN g % 4 = 0 THEN []::INTEGER[]
                ELSE [(least(hash(g) % {ENTRIES}, hash(g * 7) % {ENTRIES}))::INTEGER,
                      (hash(g * 13) % {ENTRIES})::INTEGER] END AS entries FROM range({start}, {stop}) t(g))
                TO '{folder / "matches" / f"part-{i:06d}.parquet"}' (FORMAT parquet)""")
            images = np.arange(start // 3, -(-stop // 3))
            rng = np.random.default_rng(i)
            vectors = rng.normal(size=(len(images), DIM)).astype(np.float32)
            vectors[1::50] = vectors[0:-1:50][: len(vectors[1::50])] + 1e-4  # near-duplicates
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            keys = con.execute("SELECT md5('i' || g) FROM unnest(?::BIGINT[]) t(g)", [images.tolist()]).fetchall()
            pq.write_table(pa.table({"image_key": [k[0] for k in keys], "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.ravel()), DIM)}), folder / "embeds" / f"embeds-{i:06d}.parquet")
        pairs = str(folder / "pairs" / "*.parquet")
        for name, where in (("keep-a", "hash(uid) % 5 <> 0"), ("balance", "hash(uid) % 10 < 7")):
            (folder / name).mkdir()
            write_keep_duckdb(con, f"SELECT uid FROM read_parquet('{pairs}') WHERE {where}", [],
                              folder / name / "keep.parquet")
    for name in ("keep-a", "balance"):
        stage = "filter" if name == "keep-a" else "balance"
        write_keep_report(folder / name, f"{stage}_report.json", {"stage": stage, "rule": "generated"},
                          str(folder / "pairs"))
    (folder / "balance" / "metadata.txt").write_text("".join(f"entry {e}\n" for e in range(ENTRIES)))
    os.symlink(folder / "matches", folder / "balance" / "matches.parquet")
    (folder / "pairs.manifest.json").write_text(json.dumps({"stage": "ingest", "pairs": rows}))


def one(step: str, engine_name: str, folder: Path) -> dict:
    """Run one step in this (fresh) process; returns its seconds and peak memory."""
    import numpy as np

    from openalign.data.engine import Job, run_jobs
    from openalign.pipeline import runner
    from openalign.pipeline.curation import balance as balance_lib, concepts, score as score_lib, scoring
    from openalign.pipeline.curation import semdedup as semdedup_lib
    from openalign.pipeline.curation.card import CardOptions, card
    from openalign.pipeline.curation.score import ScoreOptions
    from openalign.pipeline.shard import plan_duckdb, plan_spark

    engine, spark, out = step_setup(step, engine_name, folder, LOCAL_MEMORY)  # Spark started untimed
    (out / runner.WORK).mkdir()
    pairs = str(folder / "pairs" / "*.parquet")
    files = {name: sorted(str(p) for p in (folder / name).glob("*.parquet"))
             for name in ("dedup-scores", "score-jobs", "embeds", "matches")}
    start = time.perf_counter()
    if step == "dedup":
        runner.plan_images(pairs, out / runner.WORK / "plan.parquet", 2_000, engine)
        where = f"{scoring.FINITE} AND score > 0.99"
        rows = runner.write_keep_without_images(pairs, files["dedup-scores"], where, out, engine)
        scoring.score_summary(out, files["dedup-scores"], where, "DESC", 6, engine)
    elif step == "score":
        plans = []
        if spark is not None:  # the cut's keep-list: its physical plan, to show no stage of it runs in one partition
            writer = score_lib.write_keep_spark

            def spy(frame, path):
                plans.append(frame.sparkSession._jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(),
                                                                                  "simple"))
                return writer(frame, path)

            score_lib.write_keep_spark = spy
        runner.plan_images(pairs, out / runner.WORK / "plan.parquet", 2_000, engine, with_pairs=True)
        scores = out / score_lib.SCORES
        score_lib._write_scores(files["score-jobs"], scores, "model", "inputs", engine)
        n_pairs, _ = runner.table_counts(pairs, engine, out / runner.WORK)
        summary = score_lib._select_and_keep(scores, out, n_pairs, ScoreOptions(keep_fraction=0.3), engine)
        score_lib.describe(pairs, sorted({e["uid"] for c in summary["cuts"] for e in c["border"]}), engine,
                           out / runner.WORK)
        rows = summary["kept"]
    elif step == "semdedup sample":
        import pyarrow.parquet as pq

        images = sum(pq.read_metadata(f).num_rows for f in files["embeds"])
        cells = semdedup_lib.cell_count(0, images)
        sample = semdedup_lib._sample(files["embeds"], images, 256 * cells, 0, engine, out / runner.WORK)
        scoring.kmeans(sample, cells, 0)
        rows = len(sample)
    elif step == "semdedup cells":
        import pyarrow.parquet as pq

        images = sum(pq.read_metadata(f).num_rows for f in files["embeds"])
        cells = semdedup_lib.cell_count(0, images)
        first = semdedup_lib._matrix(pq.read_table(files["embeds"][0]).column("embedding"))
        centroids = np.asarray(first[np.linspace(0, len(first) - 1, cells).astype(int)])  # untimed stand-ins
        centroids_path = out / runner.WORK / "centroids.npy"
        np.save(centroids_path, centroids)
        start = time.perf_counter()
        work, status = out / runner.WORK, out / runner.WORK / "_status"
        assigned = [str(work / f"assign-{i:06d}.parquet") for i in range(len(files["embeds"]))]
        run_jobs([Job(f"assign-{i:06d}", semdedup_lib.assign_task, (f, str(centroids_path), assigned[i]))
                  for i, f in enumerate(files["embeds"])], status, engine, "assign", progress=False)
        semdedup_lib.shuffle_cells(assigned, work / semdedup_lib.CELLS, engine, work)
        groups = -(-cells // 64)
        deduped = [str(work / f"cells-{g:04d}.parquet") for g in range(groups)]
        run_jobs([Job(f"cells-{g:04d}", semdedup_lib.dedup_task, (
            [str(work / semdedup_lib.CELLS / f"cell={c}") for c in range(64 * g, min(cells, 64 * (g + 1)))],
            deduped[g], "hard")) for g in range(groups)], status, engine, "cells", progress=False)
        where = f"{scoring.FINITE} AND score > 0.95"
        rows = runner.write_keep_without_images(pairs, deduped, where, out, engine)
        semdedup_lib._report(out, pairs, deduped, where, semdedup_lib.SemDedupOptions(model="m"), images, cells, {},
                             engine)
    elif step == "balance":
        from openalign.pipeline.curation.balance import Balance, BalanceOptions

        plan = out / runner.WORK / "plan.parquet"
        n_pairs = concepts._plan(pairs, plan, 60_000, engine)
        entries = [f"entry {e}" for e in range(ENTRIES)]
        matched = concepts.Matched(entries, {}, folder / "matches", False, plan, files["matches"], n_pairs, "key")
        balance_lib.match_table = lambda *a, **k: matched  # the matching's tasks: their generated outputs
        stage = Balance()
        run = runner.Run(pairs, out, BalanceOptions(per_entry=200), engine, False, stage)
        results = run.jobs(stage.plan(run), "sample")
        rows = stage.merge(run, results).kept_pairs
    elif step == "card":
        result = card(folder / "pairs", [folder / "keep-a", folder / "balance"], out / "card",
                      CardOptions(examples=3), progress=False, engine=engine)
        rows = result.kept_pairs
    else:  # shard plan
        keeps = [folder / "keep-a", folder / "balance"]
        plan = out / runner.WORK
        rows = (plan_spark(pairs, keeps, plan, 10_000, engine) if engine_name == "spark"
                else plan_duckdb(Path(pairs), keeps, plan, 10_000, engine))
    seconds = time.perf_counter() - start
    result = {"step": step, "engine": engine_name, "seconds": seconds, "driver_mib": peak_rss_mib(),
              "jvm_mib": jvm_peak_mib(spark) if spark is not None else None, "rows_out": int(rows)}
    if step == "score" and spark is not None:
        result["cut_plan"] = plans[0]
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    parser = p19_arguments(__doc__, STEPS, "/tmp/p19c", LOCAL_MEMORY)
    parser.add_argument("--sizes", default="N,10N", help="the sizes to measure now (N, 10N or both); the others' "
                        "earlier measurements are kept")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], Path(args.one[2]))))
        return
    engines, steps = args.engines.split(","), [s for s in args.steps.split(",") if s]
    args.dir.mkdir(parents=True, exist_ok=True)
    saved = args.dir / "results.json"
    found: dict[tuple, dict] = {}
    if saved.is_file():
        found = {(r["step"], r["engine"], r["rows"]): r for r in json.loads(saved.read_text())}
    sizes = {"N": args.rows, "10N": args.rows * args.factor}
    for rows in [sizes[s] for s in args.sizes.split(",") if s] if steps else ():
        folder = generated(args.dir, rows, generate, "pair")
        for engine in engines:  # an engine's steps, then the other's: a run cut short has one whole column
            for step in steps:
                record(found, saved, __file__, step, engine, folder, rows, args.local_memory, "pair")
        shutil.rmtree(folder, ignore_errors=True)
    small, large = args.rows, args.rows * args.factor
    lines = table_head(f"### P19 a snapshot's size, the curation side: the global steps at N = {small:,} and 10N = "
                       f"{large:,} generated pairs (of N/3 images; {ROWS_PER_FILE:,} pairs a task's file), local "
                       f"engine (2 workers, driver DuckDB limit {args.local_memory}) and Spark local[2] (4g); a fresh "
                       "process a step", "pair")
    verdicts = []
    for step in STEPS:
        for engine in ("local", "spark"):
            a, b = found.get((step, engine, small)), found.get((step, engine, large))
            if not a or not b:
                continue
            line, judged = ratio_row(step, engine, engine, a, b, small, large)
            lines.append(line)
            verdicts += judged
    missing = [f"{step} on {engine}" for step in STEPS for engine in ("local", "spark")
               if not (found.get((step, engine, small)) and found.get((step, engine, large)))]
    if missing:
        lines += ["", f"Not yet measured at both sizes: {', '.join(missing)}. Each finished measurement, at either "
                  "size, is in the results file; a rerun with `--sizes`, `--steps` and `--engines` adds the rest."]
        measured_n = [f"{r['step']} {r['engine']} {r['seconds']:.1f} s ({r['driver_mib']:.0f} MiB)"
                      for r in found.values() if r["rows"] == small]
        if measured_n:
            lines += ["", f"At N alone: {'; '.join(measured_n)}."]
    cut = found.get(("score", "spark", large), {}).get("cut_plan")
    if cut:
        single = any(word in cut for word in ("SinglePartition", "TakeOrderedAndProject", "GlobalLimit"))
        verdicts.append(f"P19 score_cut_spark_single_partition_stage={'yes' if single else 'none'} target=none "
                        f"{'FAIL' if single else 'PASS'}")
        lines += ["", "score's cut at 30% of 10N on Spark: the keep-list's physical plan (a filter at the pair of rank "
                  "k, then the buckets' shuffle; no sort, no limit, no single partition):", "", "```",
                  *[line for line in cut.splitlines() if line.strip()], "```"]
    body = "\n".join(lines + ["", "```", *verdicts, "```", "",
                              f"Command: `.venv/bin/python bench/scale_curation.py --rows {small} --factor "
                              f"{args.factor}`"])
    print(body)
    if not args.no_write:
        write_section("P19-curation", body)


if __name__ == "__main__":
    main()
