"""Fetch's plan: the candidates to fetch, each origin whole in one shard, written as one part per shard.

    OUT/_fetch/plan/shard=N/*.parquet    url, text, uid, language, host, idx (its place in the shard), pos (= idx)

A shard is `md5(origin) % shards` (origin: scheme, host and port of the URL, lower case, credentials dropped), with
shards = ceil(rows / shard_size); a shard's rows keep the table's order (each file's rows in order, files in their
natural order, a row's captions in list order). Each non-empty shard comes back as {shard, rows, digest}: the digest
is the XOR of its rows' 128-bit hashes, each row hashed with its index (so a fixed-size state, and the order counts),
the key of its fetch task.

Two engines, the same plan:
- **local** (`duckdb_plan_urls`): one DuckDB connection on the driver, out of core: a scan that counts and a scan
  that writes each row to its shard's part (a partitioned write: no sort, no temporary copy of the candidates;
  memory bounded by the engine's limit, data/engine.py `driver_duckdb`); then tasks on the engine, a group of shards
  each, read each shard's rows, number them in the table's order and write its plan part and digest
  (`number_shards`: a window over the whole table, sorted out of core, cost 1.6x the time per row at 10x the rows).
- **spark** (`spark_plan_urls`): one task per input file reads it with the same DuckDB SQL (so a CSV, a JSONL list of
  captions, a JSON-typed column mean what they mean locally) into rows of the plan's shape with the md5 of their
  origin; then Spark joins the keep-lists, numbers each shard's rows (a window partitioned by shard), writes the plan
  partitioned by shard and computes the digests, all on the executors; the driver receives per-file counts and one
  row per shard.

At a snapshot (3.8B candidates, 380k shards at 10,000 a shard): the plan is ~200-400 GB in 380k parts of ~1 MB,
written twice on the local engine (unnumbered, then numbered by the tasks), shuffled once by Spark.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path

from openalign.config import ConfigError
from openalign.data import tables
from openalign.data.engine import Engine, Job, driver_duckdb, job_id, run_jobs, spark_session
from openalign.data.pairs import check_finished, keep_source, manifest_path, sql_path

__all__ = ["ORIGIN_SQL", "candidate_table", "duckdb_plan_urls", "plan_urls", "spark_plan_urls"]

ORIGIN_SQL = (r"lower(regexp_replace(regexp_extract(url, '^([A-Za-z][A-Za-z0-9+.-]*://[^/?#]*)', 1), "
              r"'://[^@/]*@', '://'))")
HOST_SQL = r"regexp_extract(origin, '://(\[[^]]*\]|[^:/]*)', 1)"  # the origin's host, as extract's host column
ROLES = ("uid", "language", "host")  # a candidate table's own columns, carried into the plan where present
PLAN_COLUMNS = ("url", "text", "uid", "language", "host", "idx", "pos")
FILE_ROWS = 1 << 40  # a file's rows: the order of a row across files is file * FILE_ROWS + its row


def candidate_table(spec: Path | str) -> tables.Dataset:
    """The candidate table to fetch, as a dataset (data/tables.py): extract's candidates.parquet or its folder (a
    finished extract: its manifest beside the table), a URL table's file, a directory of its parts, or a glob."""
    path = Path(spec)
    if path.is_dir() and any((path / name).exists() for name in ("candidates.parquet", "candidates.manifest.json",
                                                                  "parts")):
        if not (path / "candidates.parquet").exists():
            raise ConfigError(f"{spec} is the output of an `openalign extract` that did not finish (no "
                              "candidates.parquet); run the same extract again (it keeps the files it read)")
        path = path / "candidates.parquet"
    found = tables.dataset(path, tables.URL_TABLE_SUFFIXES, "extract's candidates.parquet (or its folder) or a URL "
                           "table with a url and a caption column")
    for table in [path] if path.is_dir() else found.files:  # a folder of parts: its manifest is beside it
        if manifest_path(Path(table)).exists():
            check_finished(Path(table))  # extract's output, finished
    return found


def roles(con, table: tables.Dataset, keep: list) -> dict[str, str | None]:
    """{role: the table's column} for url, text, uid, language and host (None where absent); one sentence for a
    table that cannot be read, has no URL column, or has no uid to match --keep lists."""
    try:
        names = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {table.reader}", [table.param]).fetchall()]
    except Exception as err:  # noqa: BLE001 - DuckDB's errors for a damaged file
        raise ConfigError(f"{table} cannot be read as a table ({str(err).splitlines()[0][:200]}); give Parquet, "
                          "CSV, TSV or JSONL files") from None
    found = tables.url_columns(str(table), names, need_text=False)
    columns = {"url": found["url"], "text": found["text"], **{c: tables.first_column(names, (c,)) for c in ROLES}}
    if keep and columns["uid"] is None:
        raise ConfigError(f"--keep selects pairs by uid, and {table} has no uid column; filter extract's "
                          "candidates.parquet and fetch that")
    return columns


def rows_sql(con, reader: str, param, columns: dict, suffix: str, first_file: int = 0) -> str:
    """The candidates of `reader` (its `?` as $source) in the plan's shape, a row per caption: url, text, n (the
    caption's place in its row), uid, language, host (the table's, else the URL's), row_seq (the table's order) and
    origin; rows without a URL included (the caller counts them)."""
    types = dict(r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM {reader}", [param]).fetchall())
    url, text = columns["url"], columns["text"]
    # the input order: a Parquet row's file and row number; a CSV's or JSONL's place in the scan (a streaming window)
    order = (f"(CAST(file_index AS BIGINT) + {int(first_file)}) * {FILE_ROWS} + file_row_number"
             if suffix == ".parquet" else f"{int(first_file)} * {FILE_ROWS} + row_number() OVER ()")
    picked = ", ".join([f"{tables.text_sql(url, types[url])} AS url",
                        f"{tables.texts_sql(text, types[text])} AS texts" if text else "[NULL::VARCHAR] AS texts",
                        *(f"{tables.text_sql(columns[n], types[columns[n]])} AS {n}" if columns[n]
                          else f"NULL::VARCHAR AS {n}" for n in ROLES), f"{order} AS row_seq"])
    host = "host" if columns["host"] else HOST_SQL
    # a list of captions is one row per caption (one image each: fetch writes each row's sample), in list order
    return (f"SELECT url, text, n, uid, language, {host} AS host, row_seq, origin FROM ("
            f"SELECT *, {ORIGIN_SQL} AS origin FROM ("
            f"SELECT url, unnest(texts) AS text, unnest(range(len(texts))) AS n, uid, language, host, row_seq "
            f"FROM (SELECT {picked} FROM {reader.replace('?', '$source')})))")


HAS_URL = "url IS NOT NULL AND trim(url) <> ''"


def duckdb_plan_urls(con, table: tables.Dataset | Path, keep: list[Path], shard_size: int, plan_dir: Path,
                     engine: Engine | None = None, progress: bool = False) -> tuple[list[dict], Counter, int]:
    """The plan with DuckDB, out of core (see the module): a scan that counts, a scan that writes each row to its
    shard's part (a partitioned write, no sort), then each shard's rows numbered in their order and hashed by tasks
    on `engine` (None: here, one after the other). Returns ([{shard, rows, digest}] of the non-empty shards, what
    was left out {no_url, not_kept}, the number of shards)."""
    table = table if isinstance(table, tables.Dataset) else tables.dataset(table)
    columns = roles(con, table, keep)
    src = rows_sql(con, table.reader, table.param, columns, table.suffix)
    params = {"source": table.param}
    where = HAS_URL
    if keep:
        where += " AND uid IN (" + " INTERSECT ".join(f"SELECT uid FROM read_parquet($keep{i})"
                                                      for i in range(len(keep))) + ")"
        params |= {f"keep{i}": keep_source(k) for i, k in enumerate(keep)}
    total, missing, rows = con.execute(f"""SELECT count(*), count(*) FILTER (WHERE NOT has_url),
                                                  count(*) FILTER (WHERE wanted)
                                           FROM (SELECT {HAS_URL} AS has_url, {where} AS wanted FROM ({src}))""",
                                       params).fetchone()
    left_out = Counter({"no_url": missing, "not_kept": total - rows - missing})
    shards = max(1, math.ceil(rows / shard_size))
    if table.suffix == ".parquet":  # its order is each row's file and row number; a CSV's is the scan's
        con.execute("SET preserve_insertion_order = false")
    unnumbered = plan_dir.with_name(plan_dir.name + "-rows")
    shutil.rmtree(unnumbered, ignore_errors=True)
    con.execute(f"""COPY (SELECT url, text, uid, language, host, row_seq, n,
                                 CAST(md5_number(origin) % {shards} AS BIGINT) AS shard
                          FROM ({src}) WHERE {where})
                    TO '{sql_path(unnumbered)}' (FORMAT parquet, PARTITION_BY (shard))""", params)
    planned = _numbered(unnumbered, plan_dir, shard_size, engine, progress) if rows else []
    shutil.rmtree(unnumbered, ignore_errors=True)
    return planned, left_out, shards


def row_hash(idx: int, url: str, text: str | None, uid: str | None, language: str | None, host: str | None) -> int:
    """A plan row's 128-bit hash: the md5 of its index, url, text, uid, language and host joined by U+001F, as a
    little-endian number (DuckDB's md5_number of the same text)."""
    import hashlib

    joined = "\x1f".join([str(idx), url, text or "", uid or "", language or "", host or ""])
    return int.from_bytes(hashlib.md5(joined.encode("utf-8", "surrogatepass")).digest(), "little")


def number_shards(unnumbered: str, plan_dir: str, shards: list[int]) -> dict:
    """One task: each shard's rows (UNNUMBERED/shard=N/) in the table's order, numbered (idx), written as its plan
    part (PLAN/shard=N/part-0.parquet), and its digest (the XOR of its rows' `row_hash`); returns
    {shard: [rows, digest]}."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from openalign.outputs import staged

    found = {}
    for shard in shards:
        rows = pq.read_table(Path(unnumbered) / f"shard={shard}", partitioning=None)
        rows = rows.sort_by([("row_seq", "ascending"), ("n", "ascending")])
        idx = pa.array(np.arange(rows.num_rows, dtype=np.int64))
        plan = pa.table({**{c: rows[c] for c in ("url", "text", "uid", "language", "host")}, "idx": idx, "pos": idx})
        digest = 0
        values = plan.select(["url", "text", "uid", "language", "host"]).to_pydict()
        for i, row in enumerate(zip(*values.values())):
            digest ^= row_hash(i, *row)
        part = Path(plan_dir) / f"shard={shard}" / "part-0.parquet"
        part.parent.mkdir(parents=True, exist_ok=True)
        with staged(part) as tmp:
            pq.write_table(plan, tmp)
        found[str(shard)] = [plan.num_rows, f"{digest:032x}"]
    return found


SHARD_ROWS_PER_TASK = 200_000  # the numbering tasks' size: shards of about this many rows together


def _numbered(unnumbered: Path, plan_dir: Path, shard_size: int, engine: Engine | None,
              progress: bool) -> list[dict]:
    """Every shard of UNNUMBERED numbered into PLAN by `number_shards` tasks (groups of shards), on the engine or
    here; the shards' {shard, rows, digest} in shard order."""
    present = sorted(int(p.name.split("=", 1)[1]) for p in unnumbered.iterdir() if p.name.startswith("shard="))
    per_task = max(1, SHARD_ROWS_PER_TASK // shard_size)
    groups = [present[i:i + per_task] for i in range(0, len(present), per_task)]
    plan_dir.mkdir(parents=True, exist_ok=True)
    if engine is None:
        results = {str(i): number_shards(str(unnumbered), str(plan_dir), group)
                   for i, group in enumerate(groups)}
    else:
        jobs = [Job(job_id(i), number_shards, (str(unnumbered), str(plan_dir), group))
                for i, group in enumerate(groups)]
        status = unnumbered.with_name(unnumbered.name + "-status")
        results, _ = run_jobs(jobs, status, engine, "fetch plan", progress)
        shutil.rmtree(status, ignore_errors=True)
    found = {int(s): v for result in results.values() for s, v in result.items()}
    return [{"shard": s, "rows": found[s][0], "digest": found[s][1]} for s in sorted(found)]


# ---------------------------------------------------------------------------------------------- on Spark

def file_rows(path: str, index: int, out: str, columns: dict) -> dict:
    """One Spark task: the candidates of one input file, read by the same SQL as the local plan, as rows of the
    plan's shape with the md5 of their origin (a 16-byte blob) -> OUT; returns {total, missing}."""
    import duckdb

    from openalign.outputs import staged

    reader = tables.duckdb_reader(Path(path))
    with duckdb.connect(config={"threads": 1, "memory_limit": "1GB"}) as con:  # one file's rows, streamed
        src = rows_sql(con, reader, path, columns, Path(path).suffix.lower(), first_file=index)
        total, missing = con.execute(f"SELECT count(*), count(*) FILTER (WHERE NOT ({HAS_URL})) FROM ({src})",
                                     {"source": path}).fetchone()
        with staged(Path(out)) as tmp:
            con.execute(f"""COPY (SELECT url, text, n, uid, language, host, row_seq, unhex(md5(origin)) AS origin_md5
                                  FROM ({src}) WHERE {HAS_URL})
                            TO '{sql_path(tmp)}' (FORMAT parquet)""", {"source": path})
    return {"total": int(total), "missing": int(missing)}


def _shards_of(shards: int):
    """mapInArrow: each row's shard, md5_number(origin) % shards (DuckDB's md5_number: the md5 as a little-endian
    128-bit number)."""
    def add(batches):
        import pyarrow as pa

        for batch in batches:
            md5s = batch.column("origin_md5").to_pylist()
            shard = pa.array([int.from_bytes(m, "little") % shards for m in md5s], pa.int64())
            yield pa.RecordBatch.from_arrays([*batch.columns, shard], names=[*batch.schema.names, "shard"])
    return add


def _row_hashes(batches):
    """mapInArrow: each row's `row_hash` (the local plan's), as two signed 64-bit halves that Spark's bit_xor
    combines."""
    import pyarrow as pa

    for batch in batches:
        found = batch.to_pydict()
        low, high = [], []
        for row in zip(*(found[c] for c in ("idx", "url", "text", "uid", "language", "host"))):
            digest = row_hash(*row).to_bytes(16, "little")
            low.append(int.from_bytes(digest[:8], "little", signed=True))
            high.append(int.from_bytes(digest[8:], "little", signed=True))
        yield pa.RecordBatch.from_arrays([pa.array(found["shard"], pa.int64()), pa.array(low, pa.int64()),
                                          pa.array(high, pa.int64())], names=["shard", "low", "high"])


def spark_plan_urls(engine: Engine, table: tables.Dataset, keep: list[Path], shard_size: int, plan_dir: Path,
                    work: Path, progress: bool = True) -> tuple[list[dict], Counter, int]:
    """The same plan as `duckdb_plan_urls`, on Spark (see the module): the files read in tasks, the rest Spark jobs."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    import duckdb

    with duckdb.connect() as con:
        columns = roles(con, table, keep)
    rows_dir = work / "plan-rows"
    shutil.rmtree(rows_dir, ignore_errors=True)
    rows_dir.mkdir(parents=True)
    jobs = [Job(job_id(i), file_rows, (f, i, str(rows_dir / f"{job_id(i)}.parquet"), columns))
            for i, f in enumerate(table.files)]
    counts, _ = run_jobs(jobs, work / "plan-status", engine, "fetch plan", progress)
    total, missing = (sum(c[k] for c in counts.values()) for k in ("total", "missing"))
    spark = spark_session(engine.master, retries=engine.retries, memory=engine.memory)
    frame = spark.read.parquet(str(rows_dir))
    if keep:
        kept = None
        for k in keep:
            uids = spark.read.parquet(keep_source(k)).select("uid").distinct()
            kept = uids if kept is None else kept.join(uids, "uid", "left_semi")
        frame = frame.join(kept, "uid", "left_semi")
    frame = frame.cache()
    rows = frame.count()
    left_out = Counter({"no_url": missing, "not_kept": total - rows - missing})
    shards = max(1, math.ceil(rows / shard_size))
    sharded = frame.mapInArrow(_shards_of(shards), StructType([*frame.schema.fields, StructField("shard", LongType())]))
    order = Window.partitionBy("shard").orderBy("row_seq", "n")
    planned = (sharded.withColumn("idx", F.row_number().over(order) - 1).withColumn("pos", F.col("idx"))
               .select(*PLAN_COLUMNS, "shard"))
    planned.write.mode("overwrite").partitionBy("shard").parquet(str(plan_dir))
    frame.unpersist()
    written = spark.read.parquet(str(plan_dir))
    digests = (written.select("shard", "idx", "url", "text", "uid", "language", "host")
               .mapInArrow(_row_hashes, "shard long, low long, high long")
               .groupBy("shard").agg(F.count("*").alias("rows"), F.bit_xor("low").alias("low"),
                                     F.bit_xor("high").alias("high"))
               .orderBy("shard").collect()) if rows else []
    shutil.rmtree(rows_dir, ignore_errors=True)
    shutil.rmtree(work / "plan-status", ignore_errors=True)
    mask = (1 << 64) - 1
    return ([{"shard": int(r["shard"]), "rows": int(r["rows"]),
              "digest": f"{((r['high'] & mask) << 64) | (r['low'] & mask):032x}"} for r in digests], left_out, shards)


def plan_urls(engine: Engine, table: tables.Dataset, keep: list[Path], shard_size: int, plan_dir: Path, work: Path,
              progress: bool = True) -> tuple[list[dict], Counter, int]:
    """The plan on the engine's side: Spark jobs with `--engine spark`, else DuckDB on the driver (in bounded
    memory, spilling into WORK)."""
    if engine.name == "spark":
        return spark_plan_urls(engine, table, keep, shard_size, plan_dir, work, progress)
    with driver_duckdb(engine, work) as con:
        return duckdb_plan_urls(con, table, keep, shard_size, plan_dir, engine, progress)
