"""The filter's two SQL back ends: DuckDB (embedded, out-of-core) on the local engine and Spark SQL on the Spark
engine, each running filter_rules' statements (the Engine says which, and with what memory and threads).

A back end registers the pair table as `pairs`, materializes each named step, runs a step in parts where its groups
would not fit memory (DuckDB: `parts`, `materialize_parts`; Spark's shuffles partition them itself), counts terms by
hash, and writes the keep-list. `SpillWatch` measures what DuckDB spilled to disk while it ran.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

from openalign.config import ConfigError
from openalign.sizes import duckdb_size, format_size, parse_size
from openalign.data.engine import Engine, driver_memory, spark_session
from openalign.data.pairs import sql_path, write_keep_duckdb, write_keep_spark
from openalign.pipeline.curation.filter_rules import (DUCKDB, HASH_HISTOGRAM, SPARK, group_columns, hash_counts,
                                                      keep_query, size_columns, words_columns)

GROUP_ROW_BYTES = 48  # DuckDB's memory per group of an integer key and a sum (measured: ~30 spilled per input row)


class DuckDBSql:
    dialect = DUCKDB

    def __init__(self, memory_limit: str | int = "", threads: int = 0, temp_dir: str = ""):
        import duckdb

        self.con = duckdb.connect()
        self.memory_limit = parse_size(memory_limit)  # bytes, 0: DuckDB's default
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="openalign-filter-"))
        self.con.execute("SET preserve_insertion_order = false")
        self.con.execute("SET enable_progress_bar = false")
        if self.memory_limit:
            self.con.execute(f"SET memory_limit = '{duckdb_size(self.memory_limit)}'")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        self.con.execute(f"SET temp_directory = '{sql_path(self.temp_dir)}'")

    def _execute(self, stage: str, sql: str):
        with self._guard(stage):
            return self.con.execute(sql)

    @contextlib.contextmanager
    def _guard(self, stage: str):
        import duckdb

        try:
            yield
        except duckdb.OutOfMemoryException as e:  # a step that could not spill what it holds
            limit = (f"--memory-limit {format_size(self.memory_limit)}" if self.memory_limit
                     else "the default memory limit")
            raise ConfigError(f"DuckDB ran out of memory in the filter's {stage} step under {limit} (it spills "
                              f"what it can to disk, but not this step): raise --memory-limit, lower --threads, "
                              f"or run it with --engine spark") from e

    def register(self, pairs: str) -> None:
        names = [r[0] for r in self.con.execute(f"DESCRIBE SELECT * FROM read_parquet('{sql_path(pairs)}')").fetchall()]
        self.columns = names
        self.con.execute(f"CREATE OR REPLACE VIEW pairs AS SELECT uid, image_key, text, {words_columns(names)}, "
                         f"{size_columns(names)}{group_columns(names)} FROM read_parquet('{sql_path(pairs)}')")

    def materialize(self, name: str, query: str) -> None:
        self._execute(name, self.dialect.materialize.format(name=name, query=query))

    def parts(self, count_query: str) -> int:
        """In how many passes to group the term occurrences (`count_query` counts them) so that each pass's
        groups fit in half of DuckDB's memory limit: grouped beyond it, DuckDB spills ~30 bytes per input row
        (100M pairs, ~2B occurrences, filled a 64 GB disk); in parts, nothing is spilled."""
        rows = self.rows(count_query)[0][0] or 0
        limit = _size_bytes(self.rows("SELECT current_setting('memory_limit')")[0][0])
        return max(1, -(-int(rows) * GROUP_ROW_BYTES // (limit // 2)))

    def materialize_parts(self, name: str, query: str, parts: int) -> None:
        """`query` with its `{part}` condition on the texts' ids, in `parts` passes appended to one table.

        Each pass takes a range of ids (the texts are stored in id order, so a pass reads only its share of
        the table; a condition like `tid % parts = p` read the whole spilled table in every pass). The join's
        sides stay as written (the right one hashed): on a share of the texts DuckDB's optimizer otherwise
        hashes the occurrences instead of the vocabulary (10M pairs in 2 parts: 35 s against 9 s in one)."""
        last = int(self.rows("SELECT coalesce(max(tid), 0) FROM texts")[0][0]) if parts > 1 else 0
        self.con.execute("SET disabled_optimizers = 'build_side_probe_side'")
        try:
            for p in range(parts):
                lo, hi = last * p // parts, last * (p + 1) // parts
                part = query.format(part=f"tid > {lo} AND tid <= {hi}" if parts > 1 else "true")
                self._append(name, part, first=p == 0)
        finally:
            self.con.execute("RESET disabled_optimizers")

    def count_hashes(self, query: str, parts: int) -> list[tuple[int, int]]:
        """`term_hashes` (h, c): every hash of `query`'s (n_pairs, h) rows counted at least twice, with its
        count (sum of n_pairs); returns the histogram of all the counts, singles included, as (c, n) rows in
        descending c. In `parts` > 1 passes: the rows are written once to Parquet files split by h (kept
        under the spill directory and removed after), then each split is grouped on its own."""
        if parts == 1:
            self.materialize("term_hashes", hash_counts(f"({query}) q"))
            return self.rows(HASH_HISTOGRAM)
        import shutil

        directory = self.temp_dir / "term_hashes"
        shutil.rmtree(directory, ignore_errors=True)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self._execute("term_hashes", f"COPY (SELECT h, n_pairs, h % {parts} AS part FROM ({query}) q) TO "
                                     f"'{sql_path(directory)}' (FORMAT parquet, PARTITION_BY (part))")
        histogram: dict[int, int] = {}
        for p in range(parts):
            split = directory / f"part={p}"
            source = f"read_parquet('{sql_path(split)}/*.parquet')" if split.is_dir() else \
                "(SELECT 0::UBIGINT AS h, 0::BIGINT AS n_pairs WHERE false)"
            self.materialize("hash_part", hash_counts(source))
            for c, n in self.rows("SELECT c, count(*) FROM hash_part GROUP BY c"):
                histogram[c] = histogram.get(c, 0) + n
            self._append("term_hashes", "SELECT h, c FROM hash_part WHERE c >= 2", first=p == 0)
            shutil.rmtree(split, ignore_errors=True)
        self.drop("hash_part")
        shutil.rmtree(directory, ignore_errors=True)
        return sorted(histogram.items(), reverse=True)

    def _append(self, name: str, query: str, first: bool) -> None:
        """`query`'s rows as table `name` (first) or appended to it (a later part)."""
        if first:
            self.materialize(name, query)
        else:
            self._execute(name, f"INSERT INTO {name} {query}")

    def drop(self, *names: str) -> None:
        """Tables no later step reads: their memory and spill space are freed."""
        for name in names:
            self.con.execute(f"DROP TABLE IF EXISTS {name}")

    def rows(self, query: str) -> list[tuple]:
        return self._execute("summary", query).fetchall()

    def write_keep(self, path: Path) -> int:
        with self._guard("keep-list"):
            return write_keep_duckdb(self.con, keep_query(), [], path)

    def close(self) -> None:
        self.con.close()


class SparkSql:
    dialect = SPARK

    def __init__(self, master: str = "", memory_limit: str | int = "", threads: int = 0, temp_dir: str = "",
                 retries: int = 2):
        self.spark = spark_session(master, "openalign-filter", retries=retries, memory=memory_limit, temp_dir=temp_dir,
                                   threads=threads)

    def register(self, pairs: str) -> None:
        table = self.spark.read.parquet(pairs)
        table.createOrReplaceTempView("raw_pairs")
        self.columns = list(table.columns)
        self.spark.sql(f"SELECT uid, image_key, text, {words_columns(table.columns)}, {size_columns(table.columns)}"
                       f"{group_columns(table.columns)} FROM raw_pairs").createOrReplaceTempView("pairs")

    def materialize(self, name: str, query: str) -> None:
        self.spark.sql(self.dialect.materialize.format(name=name, query=query))
        self.spark.catalog.cacheTable(name)

    def parts(self, count_query: str) -> int:
        return 1  # Spark's shuffles partition the groupings themselves

    def materialize_parts(self, name: str, query: str, parts: int) -> None:
        self.materialize(name, query.format(part="true"))

    def count_hashes(self, query: str, parts: int) -> list[tuple[int, int]]:
        self.materialize("term_hashes", hash_counts(f"({query}) q"))
        return self.rows(HASH_HISTOGRAM)

    def drop(self, *names: str) -> None:
        pass  # temp views are resolved again when read: a later view may still read these

    def rows(self, query: str) -> list[tuple]:
        return [tuple(r) for r in self.spark.sql(query).collect()]

    def write_keep(self, path: Path) -> int:
        return write_keep_spark(self.spark.sql(keep_query()), path)

    def close(self) -> None:
        self.spark.catalog.clearCache()


class SpillWatch:
    """The most bytes of DuckDB's temporary files seen in `directory` (where it spills what does not fit its
    memory limit: hash tables, sorts, temporary tables; and the filter's own split files), sampled every `every`
    seconds on a thread."""

    def __init__(self, directory: Path, every: float = 0.25):
        self.directory, self.every, self.peak = Path(directory), every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        size = 0
        for root, _, files in os.walk(self.directory):  # (no directory until DuckDB first spills)
            for name in files:
                with contextlib.suppress(FileNotFoundError):  # removed while being summed
                    size += os.stat(os.path.join(root, name)).st_size
        self.peak = max(self.peak, size)
        return size

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> SpillWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _size_bytes(text: str) -> int:
    """DuckDB's spelling of a size ("2.7 GiB", "300.0 MB", "512 bytes") in bytes."""
    number, _, unit = text.strip().partition(" ")
    units = {"bytes": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    return int(float(number) * units.get(unit.strip(), 1))


def sql_backend(engine: Engine, temp_dir: str = ""):
    """The filter's SQL back end on `engine`: DuckDB, embedded, on the local engine (its `memory` is DuckDB's limit,
    half of this machine's RAM when not given, beyond which it spills to `temp_dir`; its `workers` DuckDB's threads),
    Spark SQL on the Spark engine (`memory`: the driver's)."""
    memory = parse_size(engine.memory, "--memory-limit")  # bytes, 0: none; each back end gets its own spelling
    if engine.name == "spark":
        return SparkSql(engine.master, memory, engine.workers, temp_dir, engine.retries)
    return DuckDBSql(memory or driver_memory(engine), engine.workers, temp_dir)  # explicit: not DuckDB's 80% of RAM
