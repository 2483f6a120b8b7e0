"""Every corpus stage's one contract, and the one runner that carries every one of them out: the keep-list stages
over a pair table (filter, dedup, screen, score, semdedup, balance), card, and the stages of other inputs and outputs
(extract, fetch, ingest, shard).

A stage declares what it is, in its own module, beside its job functions and its public function:

    class Screen(Stage):
        name = "screen"                       # the command, NAME_report.json (and .png), the progress bars
        options = ScreenOptions               # a frozen `config.Options`: its rules are checked when it is made
        result = ScreenResult                 # built by keyword from the Report that `merge` returns
        columns = IMAGE_COLUMNS               # what it reads of the pair table (checked before anything runs)

        def check(self, run): ...             # what must hold before the output is touched (a model, a classifier)
        def plan(self, run) -> list[Job]: ... # the engine's jobs; `run.image_jobs(...)` cuts the images into jobs
        def merge(self, run, results) -> ScreenReport: ...   # counts, the keep-list (`run.keep_without(...)`);
                                              # a stage of several rounds runs the next ones with `run.jobs(...)`
        def figure(self, run, report): ...    # optional: a matplotlib figure, saved as NAME_report.png
        def summary(self, result, options) -> list[str]: ...  # the command's first lines

and its public function is one line, `return run_stage(Screen(), pairs, out, options, progress, engine)`.
`run_stage` does the rest, the same way for every stage: the options and the engine checked (`expect`), the pair
table checked, the stage's `check`, the output folder made and its old report removed (`outputs.unfinish`: the
old keep-list is no longer the folder's until a new report says so), the jobs run on either engine (each job
resumed only when its key covers everything it read: the pair table by size and time, the stage's key, the
plan), the figure written, the report written last (`pairs.write_keep_report`: `stage` and `pairs` first,
`seconds` last, then `pair_table`), the work folder removed, and the Result built by keyword from the report.
The runner knows no stage: it is handed one, so no stage module imports another (tests/test_layering.py). Every
run holds its output's lock (`outputs.owned`: an API call too, not only a command).

A stage that reads no pair table (`reads_pairs = False`: extract's web archives, fetch's URL table, ingest's
sources, a built-in corpus's samples) takes its inputs in its constructor and checks them in `check`. Its report
is its output's manifest (`keeps = False`, `report_file`; beside an OUT that is a file, `output_file`: ingest's
pairs.manifest.json), built by `merge` as a `Manifest` (the fields in their order, `seconds` before `after`); its
work folder may outlive a success (`keeps_work`: extract's parts, fetch's plan and statuses) and its jobs' statuses
may live outside it (`status`: shard's OUT/_status, read by a rerun that plans again).

The command line comes from the same declaration (cli/stages.py): a stage registered in `pipeline/registry.py`
gets its command, its flags (the pair table, its `inputs`, --out, its options' fields, the engine's) and its
printout (`summary`, then the files it wrote). A new keep-list stage is one module and one registry row.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Callable

from openalign import plots
from openalign.config import ConfigError, Options, expect
from openalign.data.engine import Engine, Job, driver_duckdb, duckdb_plan, job_id, run_jobs, spark_for, spark_plan
from openalign.data.pairs import (IMAGE_COLUMNS, check_pair_table, distinct_counts, first_source, manifest_path,
                                  parts_glob, spark_first_source, write_keep_duckdb, write_keep_report,
                                  write_keep_spark)
from openalign.outputs import owned, sources_key, unfinish, write_json

__all__ = ["Input", "Manifest", "Run", "Stage", "run_stage"]

KEEP = "keep.parquet"
WORK = "_work"  # the plan, the evaluation hashes or embeddings, each task's scores and status


IMAGE_QUERY = f"""SELECT image_key, s.place AS place, s.path AS path, s.member AS member FROM (
                      SELECT image_key, {first_source()} AS s FROM read_parquet(?) GROUP BY image_key)"""
PLAN_ORDER = ("place", "image_key")  # by source: a task reads a few neighbouring tars, not every one


def plan_images(pairs: str, plan: Path, per_task: int, engine: Engine, with_pairs: bool = False) -> int:
    """Every distinct image of the pair table, ordered by key and cut into tasks of `per_task` images (the
    local engine plans with DuckDB, the Spark engine with Spark SQL); returns the count. `with_pairs`: each
    image's pairs too (`uids`, `texts`: lists in uid order, as `read_plan(..., pairs=True)` gives a job's rows)."""
    if engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_for(engine, pairs)
        table = spark.read.parquet(pairs)
        frame = (table.groupBy("image_key").agg(spark_first_source().alias("s"))
                 .select("image_key", *(F.col(f"s.{c}").alias(c) for c in ("place", "path", "member"))))
        if with_pairs:
            listed = (table.select("image_key", "uid", "text").distinct().groupBy("image_key")
                      .agg(F.sort_array(F.collect_list(F.struct("uid", "text"))).alias("p"))
                      .select("image_key", F.col("p.uid").alias("uids"), F.col("p.text").alias("texts")))
            frame = frame.join(listed, "image_key")
        return spark_plan(frame, PLAN_ORDER, per_task, plan)
    with driver_duckdb(engine, plan.parent) as con:
        pairs_query = "SELECT DISTINCT image_key, uid, text FROM read_parquet(?)" if with_pairs else ""
        return duckdb_plan(con, IMAGE_QUERY, [str(pairs)], PLAN_ORDER, per_task, plan, pairs=pairs_query,
                           pairs_params=[str(pairs)] if with_pairs else [])


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


def write_keep_without_images(pairs: str, scores: list[str], where: str, out: Path, engine=None) -> int:
    """Keep-list `out/keep.parquet` of every pair whose image is not removed: the images of the Parquet files
    `scores` (image_key, score, ...) that match the SQL condition `where` (the dedup and screen stages). The
    Spark engine joins on the executors and writes the buckets there; returns how many pairs were removed."""
    scores = list(scores)
    keep = out / "keep.parquet"
    if engine is not None and engine.name == "spark":
        spark = spark_for(engine, pairs, *scores)
        table = spark.read.parquet(str(pairs))
        removed = spark.read.parquet(*scores).where(where).select("image_key")
        write_keep_spark(table.join(removed, "image_key", "left_anti"), keep)
        return table.join(removed, "image_key", "left_semi").count()
    removed = f"SELECT image_key FROM read_parquet(?) WHERE {where}"
    with driver_duckdb(engine or Engine(), out / WORK) as con:
        write_keep_duckdb(con, f"SELECT uid FROM read_parquet(?) WHERE image_key NOT IN ({removed})",
                          [str(pairs), scores], keep)
        return con.execute(f"SELECT count(*) FROM read_parquet(?) WHERE image_key IN ({removed})",
                           [str(pairs), scores]).fetchone()[0]


def table_counts(table: str, engine: Engine, work: Path) -> tuple[int, int]:
    """(distinct uids, distinct images) of a pair table (a file, a glob, or a folder read as its parts' glob): a Spark
    job on Spark, else groupings in DuckDB on the driver that spill into WORK (ingest's manifest, score's report)."""
    if engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_for(engine, table)
        row = spark.read.parquet(str(table)).agg(F.countDistinct("uid"), F.countDistinct("image_key")).first()
        return int(row[0]), int(row[1])
    source = parts_glob(Path(table)) if Path(table).is_dir() else str(table)
    with driver_duckdb(engine, work) as con:
        return distinct_counts(con, source)


@dataclass(frozen=True)
class Manifest:
    """The Report of a stage whose report is its output's manifest (extract, fetch, ingest, shard): the manifest's
    fields in their order, `seconds` before the fields named in `after` (else last). The Result reads its fields
    by name (`manifest.candidates`)."""

    fields: dict
    after: tuple[str, ...] = ()

    def __getattr__(self, name: str):
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(name) from None

    def layout(self, head: dict, seconds: float) -> dict:
        record = {**head, **{k: v for k, v in self.fields.items() if k not in self.after}, "seconds": seconds}
        return record | {k: self.fields[k] for k in self.after if k in self.fields}


@dataclass(frozen=True)
class Input:
    """An input a stage reads besides the pair table (dedup's evaluation images): its keyword in the stage's
    constructor, and its flag."""

    name: str  # the stage's constructor keyword, and the flag --NAME
    help: str  # one complete sentence: the flag's help line
    required: bool = True
    repeat: bool = False  # a list: the flag may be given several times


@dataclass
class Run:
    """One run of a stage: what it was given, as checked, and what the runner keeps count of for it."""

    pairs: str  # the pair table, as given (a path, a glob, a URL the cluster reads); "" for a stage of other inputs
    out: Path
    options: Any  # the stage's options
    engine: Engine  # as the stage chose it for this run (`Stage.engine`)
    progress: bool
    stage: Stage  # what is run: where its work folder, statuses and report lie
    started: float = field(default_factory=time.perf_counter)
    images: int = 0  # distinct images planned by `image_jobs`
    score_files: list[str] = field(default_factory=list)  # the score file of each image job of this plan
    resumed: int = 0  # jobs a rerun did not redo, over every round

    @property
    def work(self) -> Path:
        """OUT/_work: the plan, each job's output and status; removed when the stage has succeeded (unless the stage
        keeps it: `Stage.keeps_work`). Beside an OUT that is a file, OUT with its suffix (pairs.parts)."""
        work = self.stage.work
        return self.out.with_suffix(work) if self.stage.output_file else self.out / work

    @property
    def status(self) -> Path:
        """Where the jobs' statuses are kept: OUT/_work/_status, unless the stage names a folder of OUT."""
        return self.out / self.stage.status if self.stage.status else self.work / "_status"

    @property
    def keep(self) -> Path:
        return self.out / KEEP

    def image_jobs(self, fn: Callable[..., dict], args: tuple, key: dict, per_task: int,
                   with_pairs: bool = False) -> list[Job]:
        """Every distinct image of the pair table in jobs of `per_task` (`with_pairs`: each with its pairs):
        `fn(plan, index, scores_path, *args)` writes each job's scores (pipeline/curation/scoring.py). `key`: what the
        scores depend on besides the images (options, a model's fingerprint)."""
        self.images, jobs, self.score_files = plan_image_jobs(self.pairs, self.out, fn, args, key, per_task,
                                                              self.engine, with_pairs)
        return jobs

    def jobs(self, jobs: list[Job], desc: str) -> dict[str, dict]:
        """A round of jobs on the engine (their statuses in OUT/_work/_status); returns {id: result}."""
        if not jobs:
            return {}
        results, resumed = run_jobs(jobs, self.status, self.engine, desc, self.progress)
        self.resumed += resumed
        return results

    def keep_without(self, where: str, files: list[str] | None = None) -> int:
        """The keep-list of every pair whose image is not removed: an image is removed when its row of the score
        files (`files`, else this plan's) matches the SQL condition `where`. Returns the pairs removed."""
        return int(write_keep_without_images(self.pairs, self.score_files if files is None else files, where,
                                             self.out, self.engine))


class Stage:
    """What a corpus stage over a pair table declares (see the module's docstring); `run_stage` carries it out.
    A keep-list stage writes OUT/keep.parquet and NAME_report.json; a stage with `keeps = False` (card) writes
    its own files and, last, its `report_file`."""

    name: ClassVar[str]  # the command and NAME_report.json
    options: ClassVar[type[Options]]
    result: ClassVar[type]  # a frozen dataclass; `keep`, `seconds` and `report` are the runner's
    columns: ClassVar[tuple[str, ...]] = IMAGE_COLUMNS  # the pair table's columns it reads
    reads_pairs: ClassVar[bool] = True  # False: it reads no pair table, only its own inputs (extract's web archives)
    inputs: ClassVar[tuple[Input, ...]] = ()  # inputs besides the pair table (constructor keywords, flags)
    pairs_help: ClassVar[str] = "the pair table from `openalign ingest` (pairs.parquet)"
    writes: ClassVar[str] = ""  # what else OUT holds, for --out's help: " and scores.parquet"
    files: ClassVar[tuple[tuple[str, str], ...]] = ()  # (label, Result field) of the files the printout names
    flags: ClassVar[dict[str, str]] = {}  # {option field: its flag} where it is not --field-name
    deprecated_flags: ClassVar[dict[str, str]] = {}  # {an old flag: its field}: still taken, with a note
    first_round: ClassVar[str] = ""  # the progress label of the planned jobs (default: the name)
    overrides: ClassVar[bool] = False  # its options are also set by key=value arguments (filter's thresholds)
    engine_options: ClassVar[dict] = {}  # how its engine's flags differ ({"rename": {...}, "skip": (...)})
    keeps: ClassVar[bool] = True  # it writes OUT/keep.parquet; False: its report is its output's manifest (card)
    report_file: ClassVar[str] = ""  # the report's name (default NAME_report.json)
    record_field: ClassVar[str] = "report"  # the Result field that holds the report as written ("": none does)
    out_help: ClassVar[str] = ""  # --out's help (default: the keep-list, the report and `writes`)
    provenance: ClassVar[bool] = False  # its constructor takes `command`, the command line as typed
    output_file: ClassVar[bool] = False  # OUT is a file (ingest's pairs.parquet): the report is its manifest beside
    # it (pairs.manifest.json), the work folder OUT with the suffix `work` (pairs.parts)
    work: ClassVar[str] = WORK  # its work folder in OUT
    status: ClassVar[str] = ""  # its jobs' statuses' folder in OUT, where they outlive the work folder (shard's);
    # "": _status in the work folder
    keeps_work: ClassVar[bool] = False  # the work folder stays after success (extract's parts: a rerun reads again
    # only the files that changed)
    figure_file: ClassVar[str] = ""  # the figure's name (default NAME_report.png beside a keep-list, else the
    # report's name with .png)
    figure_dpi: ClassVar[int] = 110

    @property
    def report_name(self) -> str:
        return self.report_file or f"{self.name}_report.json"

    def report_path(self, out: Path) -> Path:
        return manifest_path(out) if self.output_file else out / self.report_name

    @property
    def figure_name(self) -> str:
        return self.figure_file or (f"{self.name}_report.png" if self.keeps else
                                    Path(self.report_name).with_suffix(".png").name)

    def engine(self, options, engine: Engine) -> Engine:
        """The engine this run uses: the local engine with the options' `workers` when they have any (0: one process
        per core)."""
        workers = getattr(options, "workers", None)
        if engine.name == "local" and workers is not None:
            return Engine(workers=workers, retries=engine.retries)
        return engine

    def check(self, run: Run) -> None:
        """What must hold before the output folder is touched; one ConfigError sentence otherwise."""

    def plan(self, run: Run) -> list[Job]:
        raise NotImplementedError

    def merge(self, run: Run, results: dict[str, dict]) -> Any:
        """The keep-list written, and the Report: a dataclass whose fields, in order, are the report's."""
        raise NotImplementedError

    def figure(self, run: Run, report) -> Any:
        """A matplotlib figure of the report (saved as NAME_report.png), or None."""
        return None

    def result_fields(self, run: Run, report) -> dict:
        """The Result's fields the report does not hold under their own names (an output's path)."""
        return {}

    def summary(self, result, options) -> list[str]:
        """The command's lines before the one naming the files."""
        return []

    def files_line(self, result, out: Path) -> str:
        """The command's last line: the files it wrote."""
        files = "".join(f"{label}: {getattr(result, attribute)}, " for label, attribute in self.files)
        return (f"keep-list: {result.keep}, {files}report: {Path(out) / self.report_name}"
                + (" (+ .png)" if self.draws() else ""))

    @classmethod
    def draws(cls) -> bool:
        return cls.figure is not Stage.figure


def run_stage(stage: Stage, pairs: str | Path | None, out: str | Path, options, progress: bool = True,
              engine: Engine = Engine()):
    """Carry `stage` out over the pair table `pairs` (None for a stage that reads none: `reads_pairs`) into the folder
    `out` (the module's docstring says how)."""
    options, engine = expect(options, stage.options), expect(engine, Engine, "engine")
    run = Run(str(pairs) if stage.reads_pairs else "", Path(out), options, stage.engine(options, engine), progress,
              stage)
    if stage.reads_pairs:
        check_pair_table(run.pairs, stage.columns)
    stage.check(run)
    with owned(run.out):  # one run per output (the command's driver holds it already; an API call takes it here)
        return _carry_out(stage, run)


def _carry_out(stage: Stage, run: Run):
    run.started = time.perf_counter()
    folder = run.out.parent if stage.output_file else run.out
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"cannot write {run.out}: {folder if stage.output_file else 'it'}, or a folder above it, is "
                          "a file; choose another --out") from None
    report_path = stage.report_path(run.out)
    unfinish(report_path)  # the old output (a keep-list) is no longer this folder's until the new report says so
    results = run.jobs(stage.plan(run), stage.first_round or stage.name)
    report = stage.merge(run, results)
    if not is_dataclass(report) or isinstance(report, type):
        raise TypeError(f"{type(stage).__name__}.merge must return its Report dataclass, not {type(report).__name__}")
    if stage.keeps and not run.keep.exists():
        raise RuntimeError(f"{type(stage).__name__}.merge wrote no keep-list ({run.keep})")
    figure = stage.figure(run, report)
    if figure is not None:
        plots.save(figure, run.out / stage.figure_name, dpi=stage.figure_dpi)
    seconds = round(time.perf_counter() - run.started, 2)
    head = {"stage": stage.name, "pairs": run.pairs} if stage.keeps else {}
    if hasattr(report, "layout"):  # a Report may lay out its record itself
        record = report.layout(head, seconds)
    else:
        record = {**head, **asdict(report), "seconds": seconds}
    if stage.keeps:
        record = write_keep_report(run.out, stage.report_name, record, run.pairs)  # last: the keep-list is finished
    else:
        write_json(report_path, record)  # last: the output is finished
    if not stage.keeps_work:
        shutil.rmtree(run.work, ignore_errors=True)
    given = stage.result_fields(run, report) | {"seconds": seconds} | (
        {stage.record_field: record} if stage.record_field else {})
    if stage.keeps:
        given["keep"] = run.keep
    values = {f.name: given[f.name] if f.name in given else getattr(report, f.name) for f in fields(stage.result)}
    return stage.result(**values)


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (for provenance), paths as given."""
    import shlex
    import sys

    return "openalign " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))


def check_declaration(stage: type[Stage]) -> list[str]:
    """What is wrong with a stage's declaration (tests/pipeline/test_stage_runner.py runs it over the registry)."""
    problems = []
    for attribute in ("name", "options", "result"):
        if not hasattr(stage, attribute):
            problems.append(f"{stage.__name__} declares no {attribute}")
    if hasattr(stage, "options") and not (isinstance(stage.options, type) and issubclass(stage.options, Options)):
        problems.append(f"{stage.__name__}.options is not an Options dataclass")
    if hasattr(stage, "result") and not is_dataclass(stage.result):
        problems.append(f"{stage.__name__}.result is not a dataclass")
    if stage.plan is Stage.plan or stage.merge is Stage.merge:
        problems.append(f"{stage.__name__} must define plan and merge")
    return problems

