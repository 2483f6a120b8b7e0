"""P19, the web side's half: the global steps of extract, fetch and ingest at N and 10N rows, on each engine.

What a snapshot's size asks of a step between the per-file tasks is that the driver's memory stays flat as the rows
grow tenfold, and the time per row stays the same. Each step runs in a fresh process on generated tables (the
per-file tasks that make them are measured elsewhere: P14, P15) and reports its wall time and its driver's peak
resident memory (the Python driver's VmHWM; on Spark local[2] the JVM holds the driver and the executors, its peak
is reported beside):

- **extract's merge**: F part files of extract's part schema (50,000 rows each, 5% of the uids repeated from earlier
  files) -> candidates (the first row of each uid: a grouping of (uid, place) pairs, then a task per part) and the
  report's tallies (`_merge` + `_tallies`);
- **fetch's plan**: the same parts as a candidate dataset -> the plan, one part per shard, and the shards' digests
  (`plan_urls`, 10,000 URLs a shard);
- **ingest's merge**: a pair table of F parts -> its distinct uids and images (`_distinct`: what ingest does after its
  tasks with the parts layout, Spark's default), and locally the file layout's concatenation (`_concatenate`).

    .venv/bin/python bench/scale.py [--rows 5000000] [--factor 10] [--engines local,spark] [--dir /tmp/p19]

Writes its table into docs/benchmarks.md. Each measurement is kept in DIR/results.json, so a rerun of some steps or
one engine (`--steps "fetch plan" --engines local`) keeps the others' lines; `--steps ""` writes the table alone.
The generated tables need ~0.25 KB a row on disk (10N = 50M rows: ~12 GB with the outputs; each size is removed
after its steps).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from _common import (generated, jvm_peak_mib, p19_arguments, table_head, peak_rss_mib, ratio_row, record, step_setup,
                     write_section)

ROWS_PER_FILE = 50_000  # a WAT file's candidates are ~40-60k
LOCAL_MEMORY = "512M"  # the local engine's driver DuckDB limit (--spark-memory): its memory bounded, not by the rows
STEPS = ("extract merge", "fetch plan", "ingest merge", "ingest concatenate")


def generate(rows: int, folder: Path) -> None:
    """Extract's parts (its PART_SCHEMA) and a pair table's parts of `rows` rows each, in files of ROWS_PER_FILE."""
    import duckdb

    parts, pairs = folder / "parts", folder / "pairs"
    parts.mkdir(parents=True)
    pairs.mkdir(parents=True)
    unique, hosts = int(rows * 0.95), max(1, rows // 20)
    with duckdb.connect(config={"threads": 2}) as con:
        for i, start in enumerate(range(0, rows, ROWS_PER_FILE)):
            stop = min(rows, start + ROWS_PER_FILE)
            con.execute(f"""COPY (SELECT md5('u' || (g % {unique})) AS uid, md5('k' || (g % {unique})) AS image_key,
                'https://h' || (hash(g % {unique}) % {hosts}) || '.example.com/img/' || (g % {unique}) || '.jpg'
                    AS url, 'an alt text about thing number ' || (g % 100003) || ' and more ' || g AS text,
                'en' AS language, 0.9::FLOAT AS language_score, NULL::VARCHAR AS words,
                'https://p' || (g % 1000) || '.example.org/page' || (g // 7) AS page_url,
                'h' || (hash(g % {unique}) % {hosts}) || '.example.com' AS host,
                'crawl-{i:05d}.warc.wat.gz' AS source, g * 100 AS "offset", NULL::INTEGER AS width,
                NULL::INTEGER AS height, g - {start} AS seq
                FROM range({start}, {stop}) t(g))
                TO '{parts / f"{i:06d}.parquet"}' (FORMAT parquet, COMPRESSION lz4)""")
            con.execute(f"""COPY (SELECT md5('p' || g) AS uid, md5('i' || (g // 3)) AS image_key,
                'an alt text about thing number ' || (g % 100003) || ' and more ' || g AS text,
                (200 + g % 400)::INTEGER AS width, (150 + g % 300)::INTEGER AS height,
                (20000 + g % 9000)::BIGINT AS bytes, {nullable("'JPEG'")} AS format, {nullable("'RGB'")} AS mode,
                {nullable("''")} AS conversions, {nullable("'webdataset'")} AS source,
                '/data/shards/' || (g // 10000) || '.tar' AS path, (g % 10000) || '.jpg' AS member,
                'https://h' || (g % {hosts}) || '.example.com/' || g || '.jpg' AS url,
                NULL::INTEGER AS original_width, NULL::INTEGER AS original_height
                FROM range({start}, {stop}) t(g)) TO '{pairs / f"part-{i:06d}.parquet"}' (FORMAT parquet)""")


def nullable(value: str) -> str:
    """A constant as a nullable column (DuckDB writes a constant NOT NULL; ingest's parts are nullable)."""
    return f"CASE WHEN g >= 0 THEN {value} END"


def one(step: str, engine_name: str, folder: Path) -> dict:
    """Run one step in this (fresh) process; returns its seconds and peak memory."""
    from openalign.data.engine import Job
    from openalign.data.tables import dataset
    from openalign.pipeline.ingest import Ingest, IngestOptions, _concatenate, _distinct
    from openalign.pipeline.runner import Run
    from openalign.pipeline.web.extract import Extract, ExtractOptions, _merge, _tallies
    from openalign.pipeline.web.fetch_plan import plan_urls

    engine, spark, out = step_setup(step, engine_name, folder, LOCAL_MEMORY)  # Spark started untimed
    parts = sorted(str(p) for p in (folder / "parts").glob("*.parquet"))
    start = time.perf_counter()
    if step == "extract merge":
        stage = Extract([])
        run = Run("", out, ExtractOptions(), engine, False, stage)
        run.work.mkdir()
        jobs = [Job(f"{i:06d}", print, (), outputs=(p,)) for i, p in enumerate(parts)]
        rows = _merge(jobs, out / "candidates.parquet", run)[0]
        _tallies(out / "candidates.parquet", run, True)
    elif step == "fetch plan":
        planned, _, _ = plan_urls(engine, dataset(folder / "parts"), [], 10_000, out / "plan", out, progress=False)
        rows = sum(p["rows"] for p in planned)
    else:
        stage = Ingest([])
        run = Run("", folder / "pairs.parquet", IngestOptions(), engine, False, stage)
        if step == "ingest merge":
            rows = _distinct(folder / "pairs", run)[0]
        else:  # the file layout: the tasks' parts (here the pair table's, and empty rejects) into one file
            import pyarrow.parquet as pq

            from openalign.pipeline.ingest import REJECT_SCHEMA

            work = folder / "pairs-work"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            jobs = [Job(f"{i:06d}", print, ()) for i in range(len(list((folder / "pairs").glob("*.parquet"))))]
            for job, part in zip(jobs, sorted((folder / "pairs").glob("*.parquet"))):
                os.link(part, work / f"pairs-{job.id}.parquet")
                pq.write_table(REJECT_SCHEMA.empty_table(), work / f"rejects-{job.id}.parquet")
            start = time.perf_counter()  # the concatenation alone
            _concatenate(jobs, out / "pairs.parquet", out / "pairs.rejects.parquet", work)
            rows = pq.read_metadata(out / "pairs.parquet").num_rows
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - start
    result = {"step": step, "engine": engine_name, "seconds": seconds, "driver_mib": peak_rss_mib(),
              "limit": engine.memory if engine_name == "local" else "",
              "jvm_mib": jvm_peak_mib(spark) if spark is not None else None, "rows_out": int(rows)}
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    parser = p19_arguments(__doc__, STEPS, "/tmp/p19", LOCAL_MEMORY)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], Path(args.one[2]))))
        return
    engines, steps = args.engines.split(","), [s for s in args.steps.split(",") if s]  # none: the table only
    saved = args.dir / "results.json"  # earlier runs' measurements: a rerun of some steps or engines keeps the rest
    found: dict[tuple, dict] = {}
    if saved.is_file():
        found = {(r["step"], r["engine"], r["rows"]): r for r in json.loads(saved.read_text())}
    for rows in (args.rows, args.rows * args.factor) if steps else ():
        folder = generated(args.dir, rows, generate, "row")
        for step in steps:
            for engine in engines:
                if step == "ingest concatenate" and engine == "spark":
                    continue  # Spark writes the parts layout
                record(found, saved, __file__, step, engine, folder, rows, args.local_memory, "row")
        shutil.rmtree(folder, ignore_errors=True)
    small, large = args.rows, args.rows * args.factor
    lines = table_head(f"### P19 a snapshot's size, the web side: extract's merge, fetch's plan and ingest's merge at "
                       f"N = {small:,} and 10N = {large:,} generated rows ({ROWS_PER_FILE:,} a file), local engine "
                       f"(2 workers, driver DuckDB limit {LOCAL_MEMORY}) and Spark local[2] (4g); a fresh process a "
                       "step", "row")
    verdicts = []
    for step in STEPS:
        for engine in ("local", "spark"):
            a, b = found.get((step, engine, small)), found.get((step, engine, large))
            if not a or not b:
                continue
            limit = b.get("limit") or (LOCAL_MEMORY if engine == "local" else "")
            shown = f"{engine} ({limit})" if limit and limit != LOCAL_MEMORY else engine  # not the header's limit
            line, judged = ratio_row(step, shown, engine, a, b, small, large)
            lines.append(line)
            verdicts += judged
    body = "\n".join(lines + ["", "```", *verdicts, "```", "",
                              f"Command: `.venv/bin/python bench/scale.py --rows {small} --factor {args.factor}`"])
    print(body)
    if not args.no_write:
        write_section("P19-web", body)


if __name__ == "__main__":
    main()
