"""Run a stage's jobs on this machine's processes or on Apache Spark: img2dataset's distributor pattern.

A stage plans its work as jobs (one per input tar, table file or output shard). A job is a module-level
function and small picklable arguments, so the same code runs in a local worker process or a Spark
executor. Each job writes its own outputs (atomically: a temporary name, then a rename) and, last, its
status file `STATUS/ID.json` with the small summary it returns (counts, never per-image data). The driver
gathers only those summaries.

- **Reruns skip finished jobs.** A job whose status file holds the same `key` (a fingerprint of its
  inputs and options) is not run again; a job without a key decides for itself (see `previous`).
- **Failed jobs are retried.** A job that raises, or whose process dies, runs again, up to `retries`
  more times: on Spark through Spark's own task retry (`spark.task.maxFailures`; `local[N,F]` on a local
  master), locally by resubmitting it to a fresh pool. A `ConfigError` (bad input that a retry cannot
  fix) and a full disk (every retry would fail the same way) are not retried: the other jobs finish, then
  the stage fails in that one sentence, on both engines.
- **Where it runs.** `local` uses `workers` processes. `spark` runs on `--master` (`local[N]`,
  `spark://host:7077`, `yarn`, `k8s://...`), or, with no `--master`, on the master spark-submit was given
  (`local[*]` outside spark-submit). On a cluster, inputs and outputs must be on storage every executor
  sees (a shared file system).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from collections.abc import Callable

from tqdm import tqdm

from openalign import host
from openalign.config import NON_NEGATIVE, ConfigError, Options, as_flags, non_negative
from openalign.sizes import SIZE, duckdb_size, format_size, parse_size, spark_size
from openalign.data.workers import forkserver
from openalign.host import die_with_parent
from openalign.outputs import disk_full, is_disk_full, staged

def engine_name(name: str) -> str:
    """One --engine vocabulary for every stage (local: this machine, DuckDB for filter; spark), checked in one
    sentence."""
    return Engine(name).name  # checked as every Engine is


@dataclass(frozen=True)
class Engine(Options):
    name: Literal["local", "spark"] = "local"  # local: this machine's processes; spark: one Spark task per job
    master: str = ""  # spark: local[N], spark://host:7077, yarn, k8s://...; "": spark-submit's, else local[*]
    workers: Annotated[int, non_negative("0 (all cores) or more")] = 0  # local: worker processes, or filter's DuckDB
        # threads (0: all cores)
    retries: Annotated[int, NON_NEGATIVE] = 2  # times a failed job is run again before the stage fails
    memory: Annotated[str, SIZE] = ""  # spark: driver memory, e.g. 4G; the local engine: the memory limit of each
        # DuckDB step on the driver (a plan, a merge, filter's rules), beyond which it spills into the output folder
        # ("": half of this machine's RAM, `driver_memory`)

    def spell(self, name: str) -> str:
        return as_flags({"name": "--engine", "memory": "--spark-memory"})(name)


@dataclass(frozen=True)
class Job:
    id: str  # file-name safe and unique within the stage, e.g. "000012"
    fn: Callable[..., dict]  # module-level (pickled by reference); returns a small JSON-able summary
    args: tuple = ()
    key: str | None = None  # fingerprint of the inputs and options; None: the job checks `previous` itself
    outputs: tuple[str, ...] = ()  # the files it writes: a finished job whose outputs are gone or changed runs again


# ---------------------------------------------------------------------------------------------- status

def status_path(status_dir: Path, job_id: str) -> Path:
    return Path(status_dir) / f"{job_id}.json"


def previous(status_dir: Path, job_id: str) -> dict | None:
    """The status a finished earlier run of this job left, or None: a status that is damaged (not JSON, cut
    short) or edited by hand since (its digest no longer matches) counts as never written."""
    path = status_path(status_dir, job_id)
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or "result" not in status or status.get("digest") != _digest(status):
        return None
    return status


def _digest(status: dict) -> str:
    import hashlib

    signed = [status.get("key"), status.get("result"), status.get("outputs")]
    return hashlib.blake2b(json.dumps(signed, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def _stats(paths) -> dict:
    """{path: [size, mtime_ns]} of the files that exist (a job's outputs as it left them)."""
    stats = {}
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            continue
        stats[str(path)] = [stat.st_size, stat.st_mtime_ns]
    return stats


def redo_reason(status_dir: Path, job: Job, status: dict | None) -> str:
    """Why a job that has a status file runs again (or "new" when it never finished)."""
    if job.key is None or not status_path(status_dir, job.id).exists():
        return "new"
    if status is None:
        return "its status file was damaged or edited"
    if status.get("key") != job.key:
        return "its inputs or options changed"
    return "its output files are gone or changed"


def finished(status: dict | None, job: Job) -> bool:
    """Whether `status` is this job's, for these inputs, with every output still as it wrote it."""
    return (status is not None and status.get("key") == job.key
            and all(_stats([p]).get(str(p)) == (status.get("outputs") or {}).get(str(p)) for p in job.outputs))


def recorded_names(status_dir: Path) -> set[str]:
    """The file names of every output a finished job recorded in `status_dir`: what a stage may remove as stale
    beside its outputs (a file it did not write never is). Names, not paths: a relative --out recorded from another
    working directory names the same files."""
    names = set()
    for path in Path(status_dir).glob("*.json"):
        try:
            outputs = json.loads(path.read_text(encoding="utf-8")).get("outputs") or {}
            names.update(Path(p).name for p in outputs)
        except (OSError, ValueError, AttributeError, TypeError):  # a damaged status names nothing
            continue
    return {n for n in names if n not in ("", ".", "..")}


def _write_status(status_dir: Path, job_id: str, status: dict) -> None:
    path = status_path(status_dir, job_id)
    with staged(path) as tmp:
        tmp.write_text(json.dumps(status, ensure_ascii=False) + "\n")


def run_one(job: Job, status_dir: str) -> tuple[str, dict | None, str | None]:
    """Run one job where it is scheduled and record its status; returns (id, result, None), or (id, None,
    the sentence) for bad input: that is no failure to retry, and the other jobs go on."""
    start = time.perf_counter()
    try:
        result = job.fn(*job.args)
        status = {"id": job.id, "key": job.key, "result": result, "outputs": _stats(job.outputs),
                  "seconds": round(time.perf_counter() - start, 3), "host": socket.gethostname(), "pid": os.getpid()}
        _write_status(Path(status_dir), job.id, status | {"digest": _digest(status)})
    except ConfigError as err:
        return job.id, None, str(err)
    except OSError as err:
        if not is_disk_full(err):
            raise
        # said where it happened (the executor's disk and its free space), and never retried: on Spark a raise
        # would be retried spark.task.maxFailures times
        return job.id, None, disk_full(err, Path(job.outputs[0]).parent if job.outputs else None)
    return job.id, result, None


def run_on_executor(job: Job, status_dir: str) -> tuple[str, dict | None, str | None]:
    """`run_one` in a Spark executor's Python worker, made as cheap per job as the local engine's workers (the
    measurements: docs/benchmarks.md, P11): it reuses freed memory, as data/fork_server.py does for the local
    workers, and freezes what is alive out of the cyclic garbage collector, which PySpark's daemon runs in full
    after every task (the daemon has just collected, so what is frozen is live; refcounting still frees it)."""
    import gc

    host.reuse_freed_memory()
    gc.freeze()
    return run_one(job, status_dir)


# ---------------------------------------------------------------------------------------------- running

def run_jobs(jobs: list[Job], status_dir: Path, engine: Engine = Engine(), desc: str = "jobs",
             progress: bool = True) -> tuple[dict[str, dict], int]:
    """Run every job not finished before; returns ({id: result} for all jobs, how many were skipped as done)."""
    status_dir = Path(status_dir)
    status_dir.mkdir(parents=True, exist_ok=True)
    if len({t.id for t in jobs}) != len(jobs):
        raise ValueError("job ids must be unique")
    results, todo, why = {}, [], []
    for job in jobs:
        done = previous(status_dir, job.id) if job.key is not None else None
        if finished(done, job):
            results[job.id] = done["result"]
        else:
            todo.append(job)
            why.append(redo_reason(status_dir, job, done))
    skipped = len(results)
    again = {reason: why.count(reason) for reason in dict.fromkeys(why) if reason != "new"}
    if again:  # a rerun says what it does again, and why (with --quiet too: it is a summary, not progress)
        redone = ", ".join(f"{n} job{'s' * (n > 1)} ({reason})" for reason, n in again.items())
        print(f"{desc}: running again {redone}", file=sys.stderr)
    if todo:
        run = _run_spark if engine.name == "spark" else _run_local
        outcomes = run(todo, str(status_dir), engine, desc, progress)
        errors = [outcomes[t.id][1] for t in todo if outcomes[t.id][1]]
        if errors:  # every other job has finished and is kept for the rerun
            more = f" (and {len(errors) - 1} more such jobs)" if len(errors) > 1 else ""
            raise ConfigError(errors[0] + more)
        results.update({k: result for k, (result, _) in outcomes.items()})
    return {t.id: results[t.id] for t in jobs}, skipped


DRIVER_MEMORY_SHARE = 0.5  # a driver DuckDB's memory limit, unless the local engine's `memory` gives one: this share
# of the machine's RAM (DuckDB's own default, 80%, left the jobs' processes beside it little)
SPILL = "duckdb-spill"  # a driver DuckDB's spill folder, inside the stage's output folder


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def driver_memory(engine: Engine) -> int:
    """The memory limit of a DuckDB step on the driver, in bytes: the local engine's `memory` where given, else
    DRIVER_MEMORY_SHARE of this machine's RAM."""
    given = parse_size(engine.memory) if engine.name == "local" else 0
    return given or int(machine_memory() * DRIVER_MEMORY_SHARE)


@contextmanager
def driver_duckdb(engine: Engine, folder: Path, threads: int = 0):
    """A DuckDB connection for a step on the driver (a plan, a merge, a count) with an explicit memory limit
    (`driver_memory`) and its spill files in FOLDER/duckdb-spill, inside the stage's output (never `./.tmp` of the
    directory the command runs from), removed when the step ends; `threads` (0: the engine's `cores`). Running out
    of memory anyway (a step DuckDB cannot spill) is one sentence naming the limit and how to raise it."""
    import shutil

    import duckdb

    spill = Path(folder) / SPILL
    spill.mkdir(parents=True, exist_ok=True)
    limit = driver_memory(engine)
    config = {"memory_limit": duckdb_size(limit), "temp_directory": str(spill), "threads": threads or cores(engine)}
    try:
        with duckdb.connect(config=config) as con:
            con.execute("SET enable_progress_bar = false")  # the stage's own progress shows; DuckDB's wrote over it
            yield con
    except duckdb.OutOfMemoryException as err:  # a step that could not spill what it holds
        raise ConfigError(f"a DuckDB step on the driver ran out of memory under its limit of {format_size(limit)} "
                          "(it spills what it can into the output folder, but not this step): raise the engine's "
                          "memory (--spark-memory SIZE, the local engine's limit too), or lower --workers") from err
    finally:
        shutil.rmtree(spill, ignore_errors=True)


class EngineSql:
    """SQL on the engine: DuckDB on the driver (its tables spill into the work folder) or Spark SQL on the executors
    (a table written to the work folder as Parquet and read back), the same statements on both (positional `?`
    parameters; `unnest`/`size` name the two dialects' list functions); only what `rows` returns comes back."""

    def __init__(self, con=None, spark=None, work: Path | None = None):
        self.con, self.spark, self.work = con, spark, work
        self.unnest, self.size = ("explode", "size") if spark is not None else ("unnest", "len")

    def source(self, name: str, paths: str | list[str]) -> None:
        """A Parquet table (a file, a glob, or a list of them) as the view `name`."""
        paths = [paths] if isinstance(paths, str) else list(paths)
        if self.spark is not None:
            self.spark.read.parquet(*paths).createOrReplaceTempView(name)
        else:
            listed = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM read_parquet([{listed}])")

    def view(self, name: str, query: str) -> None:
        """`query` as the view `name` (computed again each time it is read)."""
        if self.spark is not None:
            self.spark.sql(query).createOrReplaceTempView(name)
        else:
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {query}")

    def table(self, name: str, query: str) -> None:
        if self.spark is not None:
            folder = self.work / f"sql-{name}"
            self.spark.sql(query).write.mode("overwrite").parquet(str(folder))
            self.spark.read.parquet(str(folder)).createOrReplaceTempView(name)
        else:
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {query}")

    def rows(self, query: str, params: list | None = None) -> list[tuple]:
        if self.spark is not None:
            return [tuple(r) for r in self.spark.sql(query, args=list(params or [])).collect()]
        return self.con.execute(query, params or []).fetchall()

    def frame(self, query: str):
        """A query's rows on Spark, as a DataFrame (to write a keep-list from)."""
        return self.spark.sql(query)


@contextmanager
def engine_sql(engine: Engine, work: Path, *inputs: str):
    """An `EngineSql` for a step that reads `inputs`: Spark SQL on the Spark engine, else a DuckDB on the driver."""
    work.mkdir(parents=True, exist_ok=True)
    if engine.name == "spark":
        yield EngineSql(spark=spark_for(engine, *inputs), work=work)
        return
    with driver_duckdb(engine, work) as con:
        yield EngineSql(con=con)


def cores(engine: Engine) -> int:
    """The cores a stage may use on this machine for its own work beside the jobs (a merge, a count): the local
    engine's workers, a local Spark master's N (`local[N]`), else all of this machine's."""
    count = os.cpu_count() or 1
    if engine.name == "local":
        return engine.workers or count
    match = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", engine.master.strip())
    return int(match.group(1)) if match else count


def _run_local(jobs: list[Job], status_dir: str, engine: Engine, desc: str, progress: bool) -> dict:
    workers = min(engine.workers or os.cpu_count() or 1, len(jobs))
    attempts = {t.id: 0 for t in jobs}
    results: dict = {}
    bar = tqdm(total=len(jobs), desc=desc, unit="job", disable=not progress)

    def failed(job: Job, err: BaseException) -> None:
        attempts[job.id] += 1
        if attempts[job.id] > engine.retries:
            raise RuntimeError(f"job {job.id} of {desc} failed {attempts[job.id]} times; the last error: "
                               f"{type(err).__name__}: {err}") from err

    try:
        if workers <= 1:
            pending = list(jobs)
            while pending:
                job = pending.pop(0)
                try:
                    results[job.id] = run_one(job, status_dir)[1:]
                    bar.update()
                except Exception as err:  # noqa: BLE001 - a job's own failure: retried, like a pool's job
                    failed(job, err)
                    pending.insert(0, job)
            return results
        pending = {t.id: t for t in jobs}
        while pending:  # a dead worker breaks the whole pool: start a fresh one for what is left
            pool = warm_pool(workers)
            futures = {pool.submit(run_one, job, status_dir): job for job in pending.values()}
            broken = False
            try:
                while futures and not broken:
                    finished, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for future in finished:
                        job = futures.pop(future)
                        try:
                            results[job.id] = future.result()[1:]
                            del pending[job.id]
                            bar.update()
                        except BrokenProcessPool as err:
                            failed(job, err)
                            broken = True
                        except Exception as err:  # noqa: BLE001 - a job's own failure: counted, retried
                            failed(job, err)
                            if job.id in pending:
                                futures[pool.submit(run_one, job, status_dir)] = job
            except BaseException:  # the stage fails (or Ctrl-C): no job of it runs on after it
                close_pools()
                raise
            if broken:
                close_pools()
        return results
    finally:
        bar.close()


_POOLS: dict[int, ProcessPoolExecutor] = {}  # the warm pool: {workers: pool}, at most one


def warm_pool(workers: int) -> ProcessPoolExecutor:
    """The local engine's worker processes, started once and reused by every stage of a command (they end with it:
    `host.command_scope`): each worker pays its imports once per command, not once per stage."""
    if workers not in _POOLS:
        close_pools()
        _POOLS[workers] = ProcessPoolExecutor(workers, mp_context=forkserver(), initializer=die_with_parent)
    return _POOLS[workers]


def close_pools() -> None:
    """Stop the warm pool: its queued jobs are cancelled, its running ones finish first."""
    while _POOLS:
        _POOLS.popitem()[1].shutdown(wait=True, cancel_futures=True)


host.command_cache(close_pools)


# ---------------------------------------------------------------------------------------------- spark

def spark_session(master: str = "", app: str = "openalign", retries: int = 2, memory: str | int = "",
                  temp_dir: str = "", threads: int = 0):
    """A SparkSession on `master`; a local master gets `retries` job retries (local[N] -> local[N,F])."""
    import shutil

    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise ConfigError("--engine spark needs Java 17 or newer; install it (`apt-get install "
                          "default-jre-headless`) or set JAVA_HOME")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.appName(app).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.ansi.enabled", "false")
               .config("spark.task.maxFailures", str(retries + 1))
               # a shuffle's partitions: set for each step from its input's size (`spark_for`), then merged to
               # ~64 MB each by adaptive execution, whatever the driver's cores
               .config("spark.sql.adaptive.enabled", "true")
               .config("spark.sql.adaptive.coalescePartitions.enabled", "true")
               .config("spark.sql.adaptive.advisoryPartitionSizeInBytes", str(SHUFFLE_PARTITION_BYTES))
               .config("spark.sql.shuffle.partitions", str(max(2, 2 * (threads or os.cpu_count() or 1)))))
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ or "SPARK_MASTER" in os.environ
    if master or not under_submit:
        master = local_with_retries(master or "local[*]", retries)
        builder = builder.master(master)
    if master.startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        import sys

        # executors import what this process imports (a venv's python can lose its site-packages when Spark starts it)
        builder = (builder.config("spark.pyspark.python", sys.executable)
                   .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p)))
    if parse_size(memory):
        builder = builder.config("spark.driver.memory", spark_size(parse_size(memory)))
    if temp_dir:
        builder = builder.config("spark.local.dir", temp_dir)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


SHUFFLE_PARTITION_BYTES = 64 << 20  # adaptive execution's target size of a shuffle partition
SHUFFLE_EXPANSION = 4  # a shuffle's bytes per byte of Parquet read (decoded rows: strings, no compression)
MAX_SHUFFLE_PARTITIONS = 200_000


def shuffle_partitions(input_bytes: int, cluster_cores: int) -> int:
    """A shuffle's partitions for a step that reads `input_bytes` of Parquet on a cluster of `cluster_cores`: enough
    that each holds ~SHUFFLE_PARTITION_BYTES of its shuffle (1.8B pairs, ~400 GB of pair table: ~25,000), at least
    two per core; adaptive execution merges those that come out smaller."""
    by_size = -(-int(input_bytes) * SHUFFLE_EXPANSION // SHUFFLE_PARTITION_BYTES)
    return int(min(MAX_SHUFFLE_PARTITIONS, max(2 * max(1, cluster_cores), by_size)))


def input_bytes(spark, paths) -> int:
    """The bytes of the files at `paths` (files, folders, globs; local or a URL the cluster reads, through Hadoop's
    file system): 0 where they cannot be listed."""
    total = 0
    for path in paths:
        text = str(path)
        try:
            if "://" not in text:
                import glob

                for match in glob.glob(text) if any(c in text for c in "*?[") else [text]:
                    found = Path(match)
                    total += (sum(f.stat().st_size for f in found.rglob("*") if f.is_file()) if found.is_dir()
                              else found.stat().st_size if found.is_file() else 0)
                continue
            jvm = spark.sparkContext._jvm
            hadoop_path = jvm.org.apache.hadoop.fs.Path(text)
            fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
            for status in fs.globStatus(hadoop_path) or []:
                total += fs.getContentSummary(status.getPath()).getLength()
        except Exception:  # noqa: BLE001 - a size is a hint: unlisted, the cluster's cores decide
            continue
    return total


def spark_for(engine: Engine, *inputs):
    """The engine's SparkSession with its shuffles sized for a step that reads `inputs` (`shuffle_partitions`: from
    their bytes and the cluster's cores, `defaultParallelism`, never the driver's)."""
    spark = spark_session(engine.master, retries=engine.retries, memory=engine.memory)
    cluster = spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions(input_bytes(spark, inputs), cluster)))
    return spark


def local_with_retries(master: str, retries: int) -> str:
    """`local` / `local[N]` / `local[*]` -> `local[N,retries+1]`: a local master retries no job otherwise."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)\])?", master.strip())
    if not match:
        return master
    return f"local[{match.group(1) or 1},{retries + 1}]"


def _run_spark(jobs: list[Job], status_dir: str, engine: Engine, desc: str, progress: bool) -> dict:
    spark = spark_session(engine.master, retries=engine.retries, memory=engine.memory)
    sc = spark.sparkContext
    group = f"openalign-{desc}-{os.getpid()}-{time.monotonic_ns()}"
    sc.setJobGroup(group, desc)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(sc, group, len(jobs), desc, progress, stop), daemon=True)
    watcher.start()
    try:
        rdd = sc.parallelize(jobs, len(jobs)).map(lambda job, d=status_dir: run_on_executor(job, d))
        return {i: (result, error) for i, result, error in rdd.collect()}  # one small summary per job
    except Exception as err:  # noqa: BLE001 - Py4JJavaError: the executor's traceback as text
        raise _spark_error(err, desc) from None
    finally:
        stop.set()
        watcher.join()
        sc.setLocalProperty("spark.jobGroup.id", None)


def _watch(sc, group: str, total: int, desc: str, progress: bool, stop: threading.Event) -> None:
    """A progress bar from Spark's status tracker (jobs finished so far)."""
    bar = tqdm(total=total, desc=f"{desc} (spark)", unit="job", disable=not progress)
    tracker = sc.statusTracker()
    try:
        while not stop.wait(0.5):
            done = 0
            for job in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job)
                for stage in info.stageIds if info else ():
                    stage_info = tracker.getStageInfo(stage)
                    done += stage_info.numCompletedTasks if stage_info else 0
            bar.update(max(0, min(done, total) - bar.n))
        bar.update(total - bar.n)
    finally:
        bar.close()


def _spark_error(err: Exception, desc: str) -> Exception:
    """A ConfigError raised in an executor becomes the same one-sentence error on the driver."""
    text = str(err)
    found = re.findall(r"openalign\.config\.ConfigError: (.+)", text)
    if found:
        return ConfigError(found[-1].strip())
    last = next((line for line in reversed(text.splitlines()) if re.match(r"\w+(\.\w+)*(Error|Exception):", line)), "")
    return RuntimeError(f"{desc} failed on Spark after its retries: {last or text.splitlines()[0]}")


def spark_plan(frame, order: str | tuple[str, ...], per_task: int, path: Path, column: str = "task") -> int:
    """Write `frame` ordered by `order` (a column, or columns), numbered from 1 (`pos`) and cut into jobs of
    `per_task` rows (`column` = (pos - 1) // per_task), as the Parquet plan folder at `path`, one folder a job
    (PATH/COLUMN=INDEX/: a job reads its own rows and no other's footer); returns the row count. The order is a range
    sort and the numbering zipWithIndex, both on the executors: nothing per row reaches the driver."""
    from pyspark.sql.types import LongType, StructField, StructType

    ordered = frame.orderBy(*([order] if isinstance(order, str) else order))
    schema = StructType([StructField("pos", LongType(), False), *ordered.schema.fields,
                         StructField(column, LongType(), False)])
    rows = ordered.rdd.zipWithIndex().map(lambda pair, n=int(per_task): (pair[1] + 1, *pair[0], pair[1] // n))
    numbered = frame.sparkSession.createDataFrame(rows, schema).cache()
    numbered.write.mode("overwrite").partitionBy(column).parquet(str(path))
    count = numbered.count()
    numbered.unpersist()
    return count


def duckdb_plan(con, query: str, params: list, order: str | tuple[str, ...], per_task: int, path: Path,
                column: str = "task", pairs: str = "", pairs_params: list | None = None) -> int:
    """The same plan from DuckDB: `query`'s rows ordered by `order`, numbered (`pos`) and cut into jobs, written as
    one folder a job (a partitioned write, out of core). `pairs`: a query of (image_key, uid, text) whose rows are
    joined to the numbered rows, a plan row a pair (`read_plan(..., pairs=True)` gives each image its `uids` and
    `texts`): a list of each image's pairs is an ordered aggregate that DuckDB cannot spill (5M pairs ran out of
    memory under 512 MB)."""
    import shutil

    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    target = str(path).replace("'", "''")
    order_by = order if isinstance(order, str) else ", ".join(order)
    con.execute(f"""CREATE OR REPLACE TEMP TABLE numbered_plan AS
                    SELECT *, (pos - 1) // {int(per_task)} AS {column} FROM (
                        SELECT row_number() OVER (ORDER BY {order_by}) AS pos, * FROM ({query}))""", params)
    count = con.execute("SELECT count(*) FROM numbered_plan").fetchone()[0]
    path.mkdir(parents=True)
    rows = ("numbered_plan" if not pairs else
            f"(SELECT n.*, d.uid, d.text FROM numbered_plan n JOIN ({pairs}) d ON n.image_key = d.image_key)")
    if count:
        # a partition's rows are buffered until it holds partitioned_write_flush_threshold (524,288) of them: with
        # thousands of jobs of a few thousand rows nothing was flushed and every row was held (score's plan of 50M
        # pairs ran out of 512 MB). Flushed at a job's size instead, fed in job order, so each job's folder fills and
        # is done in turn.
        threshold = con.execute("SELECT current_setting('partitioned_write_flush_threshold')").fetchone()[0]
        con.execute(f"SET partitioned_write_flush_threshold = {max(2048, int(per_task))}")
        try:
            con.execute(f"COPY (SELECT * FROM {rows} ORDER BY {column}) TO '{target}' (FORMAT parquet, "
                        f"PARTITION_BY ({column}), OVERWRITE_OR_IGNORE)", pairs_params or [])
        finally:
            con.execute(f"SET partitioned_write_flush_threshold = {int(threshold)}")
    con.execute("DROP TABLE numbered_plan")
    return int(count)


def plan_glob(path: str | Path) -> str:
    """Every row of a plan (a file, or a folder of one folder a job) as one glob DuckDB and Spark read."""
    path = Path(path)
    return str(path / "*" / "*.parquet") if path.is_dir() else str(path)


def read_plan(path: str, index: int, column: str = "task", pairs: bool = False) -> list[dict]:
    """The rows of one job of a plan, in plan order: a plan folder's part of the job (PLAN/COLUMN=INDEX/: the job
    reads only its own rows), or a plan file's rows of it (row-group statistics skip the rest of the file).
    `pairs`: a plan of images with their pairs, one row an image with its `uids` and `texts` in uid order (DuckDB
    writes a row a pair, Spark a row an image with its lists)."""
    import pyarrow.parquet as pq

    part = Path(path) / f"{column}={index}"
    if part.is_dir():
        rows = pq.read_table(part, partitioning=None).sort_by("pos").to_pylist()
    elif Path(path).is_dir() and next(Path(path).glob(f"{column}=*"), None) is not None:
        rows = []  # a partitioned plan without this job's part: no row of it
    else:  # a file, or Spark's folder of parts of one plan
        rows = pq.read_table(path, filters=[(column, "=", index)]).sort_by("pos").to_pylist()
    for row in rows:
        del row["pos"]
        row.pop(column, None)
    return _images_with_pairs(rows) if pairs else rows


def _images_with_pairs(rows: list[dict]) -> list[dict]:
    """Rows of a pair each (consecutive for an image) as a row an image with its `uids` and `texts` in uid order;
    rows of an image each (Spark's, with the lists; samples planned from memory) as they are."""
    if not rows or "uid" not in rows[0]:
        return rows
    images: list[dict] = []
    for row in rows:
        if not images or images[-1]["image_key"] != row["image_key"]:
            images.append({k: v for k, v in row.items() if k not in ("uid", "text")} | {"_pairs": []})
        images[-1]["_pairs"].append((row["uid"], row["text"]))
    for image in images:
        found = sorted(image.pop("_pairs"), key=lambda pair: pair[0])
        image["texts"], image["uids"] = [t for _, t in found], [u for u, _ in found]
    return images


def job_id(index: int) -> str:
    return f"{index:06d}"

