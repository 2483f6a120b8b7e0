"""The keep-list stages' contract (pipeline/runner.py): a stage declared in this file, one class and one registry row,
is a command on both engines, resumes after a killed job, and writes a keep-list that shard takes."""

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Annotated
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from openalign.cli import main
from openalign.config import POSITIVE_INT, Options
from openalign.data import images, sources
from openalign.data.engine import job_id, read_plan
from openalign.data.pairs import read_keep
from openalign.pipeline import registry
from openalign.pipeline.runner import Run, Stage, check_declaration
from openalign.pipeline.curation.scoring import write_scores

needs_java = pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                                reason="the Spark engine needs Java (apt-get install default-jre-headless)")


# ---------------------------------------------------------------------------------------------- the toy stage

@dataclass(frozen=True)
class BrightOptions(Options):
    at_least: float = 128.0  # images whose mean brightness (0-255) is at or above it are dropped
    images_per_task: Annotated[int, POSITIVE_INT] = 2  # the unit of distribution, retry and resume
    die_while: str = ""  # a file: while it exists, the second job kills its process (after the first job finished)


def brightness_task(plan: str, index: int, scores_path: str, die_while: str) -> dict:
    if index == 1 and die_while and Path(die_while).exists():
        first = Path(scores_path).parent / "_status" / f"{job_id(0)}.json"
        deadline = time.monotonic() + 30
        while not first.exists() and time.monotonic() < deadline:  # the first job finishes before this one dies
            time.sleep(0.05)
        os._exit(3)
    rows = read_plan(plan, index)
    scores = []
    for row in rows:
        data = sources.read_bytes(row["path"], row["member"])
        scores.append(float(np.asarray(images.load_rgb(data).convert("L")).mean()) if data else None)
    write_scores(scores_path, rows, scores, [None] * len(rows))
    return {"images": len(rows)}


@dataclass(frozen=True)
class BrightResult:
    keep: Path
    images: int
    removed_pairs: int
    resumed_tasks: int
    seconds: float
    report: dict


@dataclass(frozen=True)
class BrightReport:
    engine: str
    images: int
    removed_pairs: int
    keep: str
    resumed_tasks: int


class Bright(Stage):
    name = "bright"
    options = BrightOptions
    result = BrightResult

    def plan(self, run: Run) -> list:
        return run.image_jobs(brightness_task, (run.options.die_while,), {"at_least": run.options.at_least},
                              run.options.images_per_task)

    def merge(self, run: Run, results: dict) -> BrightReport:
        removed = run.keep_without(f"score >= {float(run.options.at_least)!r}")
        return BrightReport(engine=run.engine.name, images=run.images, removed_pairs=removed, keep=str(run.keep),
                            resumed_tasks=run.resumed)

    def summary(self, result: BrightResult, options: BrightOptions) -> list[str]:
        return [f"{result.removed_pairs:,} pairs of bright images removed"]


@pytest.fixture
def bright(monkeypatch):
    monkeypatch.setitem(registry.STAGES, "bright", registry.Row(Bright, "drop bright images (a toy stage)"))


# ---------------------------------------------------------------------------------------------- tests

def pair_table(tmp_path: Path) -> Path:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, grey in enumerate([10, 240, 30, 250, 60, 200]):
        Image.new("RGB", (64, 64), (grey, grey, grey)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a grey square number {i}")
    assert main(["ingest", str(folder), "--out", str(tmp_path / "p.parquet"), "--quiet", "--workers", "1"]) == 0
    return tmp_path / "p.parquet"


def engine_flags(engine: str, request) -> list[str]:
    if engine == "spark":
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors get this module's task function
        return ["--engine", "spark", "--master", "local[2]"]
    return ["--engine", "local"]


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=needs_java)])
def test_a_stage_declared_in_one_class_and_one_row_runs_and_resumes_after_a_killed_job(tmp_path, engine, bright,
                                                                                       capsys, request):
    pairs = pair_table(tmp_path)
    flags = [*engine_flags(engine, request), "--quiet"]
    assert main(["bright", str(pairs), "--out", str(tmp_path / "clean"), *flags]) == 0
    assert "3 pairs of bright images removed" in capsys.readouterr().out
    kept = read_keep(tmp_path / "clean")
    assert len(kept) == 3

    marker = tmp_path / "die"
    marker.write_text("")
    args = ["bright", str(pairs), "--out", str(tmp_path / "b"), "--die-while", str(marker), *flags]
    with pytest.raises(RuntimeError, match="failed"):  # the second job's process dies on every try
        main(args)
    assert not (tmp_path / "b" / "bright_report.json").exists()  # no report: no reader takes the keep-list
    capsys.readouterr()
    assert main(["shard", str(pairs), "--keep", str(tmp_path / "b"), "--out", str(tmp_path / "shards"),
                 "--quiet"]) == 2
    assert "keep-list" in capsys.readouterr().err
    first = tmp_path / "b" / "_work" / "_status" / f"{job_id(0)}.json"
    finished = first.stat().st_mtime_ns

    marker.unlink()
    assert main(args) == 0
    report = json.loads((tmp_path / "b" / "bright_report.json").read_text())
    assert 1 <= report["resumed_tasks"] < 3  # the first job was not run again; the killed one was
    assert (report["stage"], report["engine"], report["images"], report["removed_pairs"]) == ("bright", engine, 6, 3)
    assert list(report)[:2] == ["stage", "pairs"] and list(report)[-2:] == ["seconds", "pair_table"]
    assert read_keep(tmp_path / "b") == kept
    assert not (tmp_path / "b" / "_work").exists() and finished  # the work folder goes when the stage succeeded
    assert main(["shard", str(pairs), "--keep", str(tmp_path / "b"), "--out", str(tmp_path / "shards"),
                 "--quiet"]) == 0


def test_its_flags_and_help_come_from_its_declaration(bright, capsys):
    with pytest.raises(SystemExit):
        main(["bright", "--help"])
    shown = capsys.readouterr().out
    assert "drop bright images (a toy stage)" in shown and "--at-least" in shown and "--images-per-task" in shown
    assert "--engine {local,spark}" in shown and "bright_report.json" in shown
    assert main(["bright", "p.parquet", "--out", "o", "--images-per-task", "0"]) == 2
    assert "--images-per-task" in capsys.readouterr().err  # the options' rules, checked when they are made


def test_every_registered_stage_declares_what_the_runner_needs():
    for name in registry.STAGES:
        stage = registry.declaration(name)
        assert stage.name == name and not check_declaration(stage), (name, check_declaration(stage))
    assert not check_declaration(Bright)

    class Half(Stage):
        name = "half"

    assert check_declaration(Half) == ["Half declares no options", "Half declares no result",
                                       "Half must define plan and merge"]


# ---------------------------------------------------------------------------------------------- a stage of its own inputs

def count_words(path: str, part: str) -> dict:
    words = len(Path(path).read_text().split())
    Path(part).write_text(str(words))
    return {"words": words}


@dataclass(frozen=True)
class WordsOptions(Options):
    per_file: bool = True


@dataclass(frozen=True)
class WordsResult:
    table: Path
    words: int
    resumed_tasks: int
    seconds: float
    manifest: dict


class Words(Stage):
    """Text files -> a table file OUT: reads no pair table, its report the manifest beside OUT, its parts kept."""

    name = "words"
    options = WordsOptions
    result = WordsResult
    reads_pairs = False
    keeps = False
    output_file = True
    work = ".parts"
    keeps_work = True
    record_field = "manifest"

    def __init__(self, files: list[Path]):
        self.files = files

    def plan(self, run: Run) -> list:
        from openalign.data.engine import Job
        from openalign.outputs import sources_key

        run.work.mkdir(exist_ok=True)
        return [Job(job_id(i), count_words, (str(f), str(run.work / f"{i}.txt")), key=sources_key(str(f)),
                    outputs=(str(run.work / f"{i}.txt"),)) for i, f in enumerate(self.files)]

    def merge(self, run: Run, results: dict):
        from openalign.pipeline.runner import Manifest

        total = sum(r["words"] for r in results.values())
        run.out.write_text(f"{total}\n")
        return Manifest({"stage": "words", "files": len(self.files), "words": total, "resumed_tasks": run.resumed,
                         "per_file": [r["words"] for r in results.values()]}, after=("per_file",))

    def result_fields(self, run: Run, report) -> dict:
        return {"table": run.out}


def test_a_stage_of_its_own_inputs_writes_a_file_its_manifest_beside_it_and_keeps_its_parts(tmp_path):
    from openalign.data.engine import Engine
    from openalign.pipeline.runner import run_stage

    files = []
    for i, text in enumerate(["one two", "three four five", "six"]):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text(text)
    out = tmp_path / "out" / "words.txt"
    result = run_stage(Words(files), None, out, WordsOptions(), progress=False, engine=Engine(workers=1))
    assert (result.table, result.words, result.resumed_tasks) == (out, 6, 0) and out.read_text() == "6\n"
    manifest = json.loads((tmp_path / "out" / "words.manifest.json").read_text())
    assert manifest == result.manifest and list(manifest) == ["stage", "files", "words", "resumed_tasks", "seconds",
                                                              "per_file"]
    assert sorted(p.name for p in (tmp_path / "out" / "words.parts").iterdir()) == ["0.txt", "1.txt", "2.txt",
                                                                                   "_status"]
    files[1].write_text("three four")
    again = run_stage(Words(files), None, out, WordsOptions(), progress=False, engine=Engine(workers=1))
    assert (again.words, again.resumed_tasks) == (5, 2)  # only the changed file's job ran again


def test_a_second_run_into_one_output_through_the_api_is_refused(tmp_path):
    # Before: the CLI took the output's lock, a stage's public function did not, so two API calls (two notebooks, a
    # scheduler's retries) wrote one keep-list at once. Now the runner takes it for every stage.
    from conftest import held_elsewhere
    from openalign.config import ConfigError
    from openalign.pipeline.curation.dedup import DedupOptions, dedup

    pairs = pair_table(tmp_path)
    out = tmp_path / "dedup"
    with held_elsewhere(out), pytest.raises(ConfigError, match="is being written by"):
        dedup(str(pairs), str(tmp_path / "imgs"), out, DedupOptions(), progress=False)
    assert not (out / "dedup_report.json").exists()
    assert dedup(str(pairs), str(tmp_path / "imgs"), out, DedupOptions(), progress=False).keep.exists()


def test_an_image_plan_with_pairs_spills_instead_of_running_out_of_memory(tmp_path):
    """Before: each image's pairs were gathered as ordered lists, an aggregate DuckDB cannot spill: 1M pairs ran out
    of memory under 256 MB (score's plan and shard's; 5M under 512 MB in P19). Now a row a pair, joined to the
    numbered images and written job by job (the partitioned write had buffered every job's rows until one held
    524,288: score's plan of 50M pairs ran out of 512 MB in P19). Score's plan now fits 192 MB; shard's, measured the
    same way, has too thin a margin under a limit the old one fails for a test, so it is checked for its rows."""
    import duckdb
    import pyarrow.parquet as pq

    from openalign.data.engine import Engine, read_plan
    from openalign.pipeline.runner import plan_images
    from openalign.pipeline.shard import plan_duckdb

    table = tmp_path / "pairs.parquet"
    with duckdb.connect() as con:
        con.execute(f"""COPY (SELECT md5('p' || g) AS uid, md5('i' || (g // 3)) AS image_key,
            'an alt text about thing number ' || g AS text, '/data/' || (g // 30000) || '.tar' AS path,
            (g % 10000) || '.jpg' AS member, 'https://x/' || g AS url FROM range(1000000) t(g))
            TO '{table}' (FORMAT parquet)""")
    pairs = {r["uid"]: r for r in pq.read_table(table, columns=["uid", "image_key", "text"]).to_pylist()}
    plan = tmp_path / "work" / "plan.parquet"
    assert plan_images(str(table), plan, 2_000, Engine(workers=2, memory="256M"), with_pairs=True) == 333_334
    rows = read_plan(str(plan), 7, pairs=True)
    assert len(rows) == 2_000 and all(r["uids"] == sorted(r["uids"]) and len(r["uids"]) == len(r["texts"]) == 3
                                      for r in rows)
    for row in rows:
        assert {pairs[u]["image_key"] for u in row["uids"]} == {row["image_key"]}
        assert [pairs[u]["text"] for u in row["uids"]] == row["texts"]
    (tmp_path / "shard").mkdir()
    assert plan_duckdb(table, [], tmp_path / "shard", 10_000, Engine(workers=2, memory="1G")) == 333_334
    samples = read_plan(str(tmp_path / "shard" / "plan.parquet"), 3, "shard", pairs=True)
    assert len(samples) == 10_000 and [s["image_key"] for s in samples] == sorted(s["image_key"] for s in samples)
    assert all([pairs[u]["text"] for u in s["uids"]] == s["texts"] and len(s["uids"]) == 3 for s in samples)
