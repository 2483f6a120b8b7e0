"""The per-image stages on Spark `local[2]` give the local engine's outputs; jobs are retried and resumed.

One Spark session serves the whole module (it starts once, ~15 s); every stage's Spark run is compared
with a local run of the same inputs.
"""

import contextlib
import json
import os
import shutil
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from openalign.config import ConfigError
from openalign.data.engine import local_with_retries, spark_session
from openalign.data.pairs import check_pair_table
from openalign.data.engine import Engine, Job, cores, run_jobs
from openalign.pipeline.ingest import IngestOptions, ingest
from openalign.pipeline.shard import ShardOptions, shard

needs_java = pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                                reason="the Spark engine needs Java (apt-get install default-jre-headless)")
SPARK = Engine("spark", "local[2]", retries=2)
LOCAL = Engine("local", workers=2, retries=2)


@pytest.fixture(scope="module")
def spark():
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors get this module's task functions
    session = spark_session("local[2]", retries=2)
    yield session


# ---------------------------------------------------------------------------------------------- runner

def die_once(marker: str, value: int) -> dict:
    """A task whose process is killed the first time it runs (the marker file records that it did)."""
    if not Path(marker).exists():
        Path(marker).write_text("killed once")
        os._exit(3)
    return {"value": value * value, "pid": os.getpid()}


def refuse(value: int) -> dict:
    raise ConfigError(f"input {value} is bad: fix it")


def square(value: int) -> dict:
    return {"value": value * value}


@pytest.mark.parametrize("engine", [LOCAL, pytest.param(SPARK, marks=needs_java)], ids=["local", "spark"])
def test_a_killed_task_is_retried_and_a_rerun_skips_finished_tasks(tmp_path, engine, request):
    if engine.name == "spark":
        request.getfixturevalue("spark")
    jobs = [Job(f"t{i}", square, (i,), key=f"k{i}") for i in range(4)]
    jobs[2] = Job("t2", die_once, (str(tmp_path / "marker"), 2), key="k2")
    results, skipped = run_jobs(jobs, tmp_path / "status", engine, progress=False)
    assert (tmp_path / "marker").exists()  # the task's first process died
    assert [results[f"t{i}"]["value"] for i in range(4)] == [0, 1, 4, 9] and skipped == 0
    status = json.loads((tmp_path / "status" / "t2.json").read_text())
    assert status["key"] == "k2" and status["result"]["value"] == 4

    (tmp_path / "status" / "t1.json").unlink()  # as if the run had stopped before t1 finished
    again, skipped = run_jobs(jobs, tmp_path / "status", engine, progress=False)
    assert skipped == 3 and again == results | {"t1": {"value": 1}}
    changed = [Job(t.id, t.fn, t.args, key=t.key + "'") if t.id == "t3" else t for t in jobs]
    assert run_jobs(changed, tmp_path / "status", engine, progress=False)[1] == 3  # a changed input reruns


@pytest.mark.parametrize("engine", [LOCAL, pytest.param(SPARK, marks=needs_java)], ids=["local", "spark"])
def test_bad_input_fails_at_once_in_one_sentence(tmp_path, engine, request):
    if engine.name == "spark":
        request.getfixturevalue("spark")
    jobs = [Job("a", square, (1,), key="a"), Job("b", refuse, (7,), key="b"), Job("c", square, (3,), key="c")]
    with pytest.raises(ConfigError, match=r"^input 7 is bad: fix it$"):
        run_jobs(jobs, tmp_path / "status", engine, progress=False)
    assert sorted(p.stem for p in (tmp_path / "status").glob("*.json")) == ["a", "c"]  # the others finished


def fill_disk(attempts: str, value: int) -> dict:
    """A task that finds the disk full (each attempt leaves a file in `attempts`, so the test counts them)."""
    import errno

    Path(attempts, f"{value}-{len(list(Path(attempts).glob(f'{value}-*')))}").touch()
    if value == 1:
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(attempts) / "out.tar.tmp"))
    return {"value": value}


@pytest.mark.parametrize("engine", [LOCAL, pytest.param(SPARK, marks=needs_java)], ids=["local", "spark"])
def test_a_full_disk_is_not_retried_and_is_one_sentence(tmp_path, engine, request):
    # Before: Spark retried a task that found the disk full spark.task.maxFailures times (3 attempts), then the
    # stage failed with "failed on Spark after its retries: OSError ...", not the full-disk sentence.
    if engine.name == "spark":
        request.getfixturevalue("spark")
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    jobs = [Job(f"t{i}", fill_disk, (str(attempts), i), key=f"k{i}") for i in range(3)]
    with pytest.raises(ConfigError, match=rf"^the disk is full: writing {attempts / 'out.tar.tmp'} failed with "
                                          r"[\d,]+ MiB free on .+ run the command again \(finished work is kept\)$"):
        run_jobs(jobs, tmp_path / "status", engine, progress=False)
    assert sorted(p.name for p in attempts.iterdir()) == ["0-0", "1-0", "2-0"]  # one attempt each
    assert sorted(p.stem for p in (tmp_path / "status").glob("*.json")) == ["t0", "t2"]


def worker_state(_: int) -> dict:
    import gc

    from openalign import host

    return {"reuses": host.reuses_freed_memory(), "frozen": gc.get_freeze_count(), "pid": os.getpid()}


@pytest.mark.parametrize("engine", [LOCAL, pytest.param(SPARK, marks=needs_java)], ids=["local", "spark"])
def test_tasks_run_in_processes_that_reuse_freed_memory(tmp_path, engine, request):
    # Before: Spark's Python workers returned every large block to the kernel, as a process does by default, and
    # dedup ran there at 0.6x the local engine's speed per core (bench/data_plane.py).
    if engine.name == "spark":
        request.getfixturevalue("spark")
    results, _ = run_jobs([Job(f"t{i}", worker_state, (i,)) for i in range(4)], tmp_path / "status", engine,
                           progress=False)
    assert all(r["reuses"] for r in results.values())
    assert os.getpid() not in {r["pid"] for r in results.values()}  # asked in the workers, not in this process


@needs_java
def test_spark_workers_do_not_walk_the_imported_modules_after_every_task(tmp_path, spark):
    # PySpark's daemon runs gc.collect() after each task of a reused worker. Before: it walked every object of the
    # modules a stage imports (~125 ms a task here, a third of a 500-image ingest task); now what is alive when a
    # task starts is frozen out of the cyclic collector.
    results, _ = run_jobs([Job(f"t{i}", worker_state, (i,)) for i in range(4)], tmp_path / "status", SPARK,
                           progress=False)
    assert all(r["frozen"] > 1000 for r in results.values())


def test_local_masters_get_task_retries():
    assert local_with_retries("local[2]", 2) == "local[2,3]"
    assert local_with_retries("local[*]", 0) == "local[*,1]"
    assert local_with_retries("local", 1) == "local[1,2]"
    assert local_with_retries("spark://host:7077", 5) == "spark://host:7077"
    with pytest.raises(ConfigError, match="--engine=ray must be local or spark"):
        Engine("ray")


def test_a_stage_s_own_work_uses_the_cores_its_engine_was_given():
    machine = os.cpu_count() or 1
    assert cores(Engine("local", workers=1)) == 1 and cores(Engine("local", workers=3)) == 3
    assert cores(Engine("local")) == machine
    assert cores(Engine("spark", "local[2]")) == 2 and cores(Engine("spark", " local[4,3] ")) == 4
    assert cores(Engine("spark", "local[*]")) == machine and cores(Engine("spark", "yarn")) == machine


# ---------------------------------------------------------------------------------------------- stages

def make_sources(root: Path) -> list[str]:
    """A folder, two webdataset tars (one cut short mid-sample) and a CSV table: every ingest input kind."""
    from openalign.data.tars import ShardWriter

    rng = np.random.default_rng(0)

    def image(i, size=(64, 48)):
        return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))

    folder = root / "folder"
    folder.mkdir(parents=True)
    for i in range(23):
        image(i).save(folder / f"f{i:02d}.png")
        (folder / f"f{i:02d}.txt").write_text(f"folder picture {i % 9}")  # repeated texts: several per image key
    (folder / "broken.jpg").write_bytes(b"not an image")
    (folder / "broken.txt").write_text("a broken one")
    tars = []
    for t in range(2):
        writer = ShardWriter(root / "tars", f"web{t}", 100)
        for i in range(12):
            import io

            buf = io.BytesIO()
            image(i).save(buf, format="JPEG")
            writer.write(f"w{t}_{i:02d}", buf.getvalue(), "jpg", f"web picture {i}", {"url": f"http://x/{i}"})
        writer.close()
        tars.append(root / "tars" / f"web{t}-000000.tar")
    data = tars[1].read_bytes()
    tars[1].write_bytes(data[:len(data) // 2 + 100])  # a truncated download
    table_dir = root / "table"
    table_dir.mkdir()
    rows = ["image,text"]
    for i in range(10):
        image(i, (50, 70)).save(table_dir / f"t{i}.png")
        rows.append(f"t{i}.png,table picture {i}")
    rows.append("missing.png,no such file")
    (table_dir / "pairs.csv").write_text("\n".join(rows) + "\n")
    return [str(folder), str(tars[0]), str(tars[1]), str(table_dir / "pairs.csv")]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return make_sources(tmp_path_factory.mktemp("sources"))


def without_engine(result) -> dict:
    """A stage's record (its result's manifest) without what differs between engines and runs."""
    manifest = getattr(result, "manifest", None) or getattr(result, "report", result)
    return {k: v for k, v in manifest.items() if k not in ("engine", "out", "rejects", "keep", "seconds", "resumed_tasks",
                                                           "resumed_shards", "options")}


@needs_java
def test_ingest_on_spark_equals_local_and_resumes(tmp_path, sources, spark):
    options = IngestOptions(files_per_task=5, workers=2)
    local = ingest(sources, tmp_path / "local.parquet", options, progress=False)
    assert local.rejected["truncated_tar"] == 1 and local.rejected["missing_file"] == 1
    # a table that cannot be read stops the Spark run in one sentence; the other jobs are already done
    table = Path(sources[3])
    good = table.read_text()
    table.write_text(good.replace("image,text", "picture,text"))
    with pytest.raises(ConfigError, match="has no image column: none of image"):
        ingest(sources, tmp_path / "spark.parquet", options, progress=False, engine=SPARK)
    table.write_text(good)
    distributed = ingest(sources, tmp_path / "spark.parquet", options, progress=False, engine=SPARK)
    assert distributed.resumed_tasks == 7  # 5 folder jobs and 2 tars were kept; only the table ran again
    assert without_engine(distributed) == without_engine(local)  # counts per reason, examples, conversions
    for suffix in (".parquet", ".rejects.parquet"):
        a = pq.read_table(tmp_path / f"local{suffix}").to_pylist()
        b = pq.read_table(tmp_path / f"spark{suffix}").to_pylist()
        assert a == b and len(a) > 0  # the same rows, even in the same order
    # Spark's pair table is a folder of the tasks' parts (nothing collected on the driver), its statuses kept: a
    # rerun redoes nothing; the local engine writes the same folder when asked, and reads it back as a pair table
    assert (tmp_path / "spark.parquet").is_dir() and len(list((tmp_path / "spark.parquet").glob("part-*"))) == 8
    assert ingest(sources, tmp_path / "spark.parquet", options, progress=False, engine=SPARK).resumed_tasks == 8
    parts = ingest(sources, tmp_path / "parts.parquet", replace(options, layout="parts"), progress=False)
    assert without_engine(parts) == without_engine(local)
    assert pq.read_table(tmp_path / "parts.parquet").to_pylist() == pq.read_table(tmp_path / "local.parquet").to_pylist()
    assert check_pair_table(tmp_path / "parts.parquet", ("uid", "path")) == str(tmp_path / "parts.parquet" / "*.parquet")


@needs_java
def test_extract_on_spark_equals_local(tmp_path, spark):
    from openalign.pipeline.web.extract import extract

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "web"
    wats = [str(fixtures / "crawl-00000.warc.wat.gz"), str(fixtures / "truncated.warc.wat.gz")]
    local = extract(wats, tmp_path / "local", engine=LOCAL, progress=False)
    distributed = extract(wats, tmp_path / "spark", engine=SPARK, progress=False)
    assert distributed.counts == local.counts and distributed.per_file == local.per_file
    a = pq.read_table(tmp_path / "local" / "candidates.parquet").to_pylist()
    b = pq.read_table(tmp_path / "spark" / "candidates.parquet").to_pylist()
    assert a == b and len(a) == local.candidates == 30  # the truncated copy's pairs are all in the first


@needs_java
def test_shard_on_spark_writes_the_same_bytes_and_resumes(tmp_path, sources, spark):
    pairs = tmp_path / "pairs.parquet"
    ingest(sources, pairs, IngestOptions(workers=1), progress=False)
    options = ShardOptions(image_size=40, samples_per_shard=7, workers=2)
    Path(sources[2]).rename(Path(sources[2]) .with_suffix(".gone"))  # a source tar lost after ingest
    try:
        local = shard(pairs, [], tmp_path / "local", options, progress=False)
        distributed = shard(pairs, [], tmp_path / "spark", options, progress=False, engine=SPARK)
    finally:
        Path(sources[2]).with_suffix(".gone").rename(sources[2])
    assert local.skipped == distributed.skipped == {"missing_file": 6}  # the 6 whole samples of the cut tar
    assert without_engine(local) == without_engine(distributed)
    names = sorted(local.shards)
    assert len(names) == 8 and names == sorted(p.name for p in (tmp_path / "spark").glob("*.tar"))
    for name in names:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "spark" / name).read_bytes()

    # a task killed mid-write leaves a temporary file and no status: the rerun redoes that shard alone
    (tmp_path / "spark" / names[3]).rename(tmp_path / "spark" / (names[3] + ".tmp"))
    (tmp_path / "spark" / "_status" / "000003.json").unlink()
    Path(sources[2]).rename(Path(sources[2]).with_suffix(".gone"))
    try:
        again = shard(pairs, [], tmp_path / "spark", options, progress=False, engine=SPARK)
    finally:
        Path(sources[2]).with_suffix(".gone").rename(sources[2])
    assert again.resumed_shards == 7 and again.shards == local.shards
    assert (tmp_path / "spark" / names[3]).read_bytes() == (tmp_path / "local" / names[3]).read_bytes()


@needs_java
def test_an_image_in_two_places_is_read_from_the_same_one_on_spark(tmp_path, spark):
    """The same image in two tars under two names: both engines take its path and member from one row (the first
    by path, then member), and plan the images by that place, so their plans and shards are equal."""
    import io

    import pyarrow.parquet as pq

    from openalign.data.tars import TarWriter
    from openalign.pipeline.runner import plan_images

    rng = np.random.default_rng(3)
    blobs = []
    for _ in range(4):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(buf, format="PNG")
        blobs.append(buf.getvalue())
    for name, keys in (("t1", ["z0", "b", "z1"]), ("t2", ["a", "z2", "z3"])):  # t1's b and t2's a: one image
        with TarWriter(tmp_path / f"{name}.tar") as writer:
            for key in keys:
                blob = blobs[0] if key in ("a", "b") else blobs[1 + int(key[1]) % 3]
                writer.write({"__key__": key, "png": blob, "txt": f"picture {name} {key}"})
    pairs = tmp_path / "pairs.parquet"
    ingest([str(tmp_path / "t1.tar"), str(tmp_path / "t2.tar")], pairs, IngestOptions(workers=1), progress=False)
    plans = {}
    for engine in (LOCAL, SPARK):
        plan_images(str(pairs), tmp_path / f"{engine.name}.parquet", 2, engine)
        plans[engine.name] = (pq.read_table(tmp_path / f"{engine.name}.parquet")
                              .select(["pos", "image_key", "path", "member", "task"]).to_pylist())
    assert plans["local"] == plans["spark"]
    assert [(Path(r["path"]).name, r["member"]) for r in plans["local"]][:2] == [("t1.tar", "b.png"), ("t1.tar", "z0.png")]
    options = ShardOptions(samples_per_shard=2, workers=2)
    local = shard(pairs, [], tmp_path / "local", options, progress=False)
    distributed = shard(pairs, [], tmp_path / "spark", options, progress=False, engine=SPARK)
    assert local.samples == distributed.samples == 4 and not local.skipped and not distributed.skipped
    for name in local.shards:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "spark" / name).read_bytes()


CLASSIFIER = '''
import numpy as np

def redness(images):
    return [float(np.asarray(im)[..., 0].mean() / 255) for im in images]
'''


def pairs_and_copies(tmp_path, sources, names) -> tuple[Path, Path]:
    """The sources ingested into a pair table, and a folder of evaluation images that copy training images `names`."""
    pairs = tmp_path / "pairs.parquet"
    ingest(sources, pairs, IngestOptions(workers=1), progress=False)
    held = tmp_path / "held"
    held.mkdir()
    for name in names:
        shutil.copy(Path(sources[0]) / name, held / name)
    return pairs, held


@contextlib.contextmanager
def no_driver_duckdb():
    """Fails when the code inside opens a DuckDB connection in this process (the driver): on Spark every step between
    the tasks is a Spark job."""
    import duckdb

    opened = []
    real = duckdb.connect

    def connect(*args, **kwargs):
        opened.append(traceback.extract_stack(limit=6)[-2])
        return real(*args, **kwargs)

    duckdb.connect = connect
    try:
        yield
    finally:
        duckdb.connect = real
    assert not opened, f"a DuckDB connection on the driver: {opened}"


@needs_java
def test_dedup_and_screen_on_spark_give_the_local_keep_lists(tmp_path, sources, spark):
    from openalign.pipeline.curation.dedup import DedupOptions, dedup
    from openalign.data.pairs import read_keep
    from openalign.pipeline.curation.screen import ScreenOptions, screen

    pairs, held = pairs_and_copies(tmp_path, sources, ("f03.png", "f11.png"))  # two are also evaluation images
    Image.open(Path(sources[3]).parent / "t4.png").resize((40, 56)).save(held / "t4_small.png")
    lost = Path(sources[0]) / "f20.png"
    lost.rename(lost.with_suffix(".gone"))  # an image lost after ingest: unreadable on both engines
    (tmp_path / "clf.py").write_text(CLASSIFIER)
    try:
        options = DedupOptions(images_per_task=9, workers=2)
        local = dedup(pairs, str(held), tmp_path / "dl", options, progress=False)
        with no_driver_duckdb():  # plans, keep-lists, reports: Spark jobs
            distributed = dedup(pairs, str(held), tmp_path / "ds", options, progress=False, engine=SPARK)
        screening = ScreenOptions(classifier=f"{tmp_path / 'clf.py'}:redness", threshold=0.5, images_per_task=9)
        local_screen = screen(pairs, tmp_path / "sl", screening, progress=False, engine=LOCAL)
        with no_driver_duckdb():
            spark_screen = screen(pairs, tmp_path / "ss", screening, progress=False, engine=SPARK)
    finally:
        lost.with_suffix(".gone").rename(lost)
    assert local.removed_images >= 3 and local.unreadable_images == 1
    assert without_engine(local) == without_engine(distributed)
    assert read_keep(tmp_path / "dl") == read_keep(tmp_path / "ds") and len(read_keep(tmp_path / "dl")) > 0
    assert 0 < local_screen.removed_images < local_screen.images and local_screen.unreadable_images == 1
    assert without_engine(local_screen) == without_engine(spark_screen)
    assert read_keep(tmp_path / "sl") == read_keep(tmp_path / "ss")


@needs_java
def test_bucket_dedup_on_spark_gives_the_local_keep_list(tmp_path, sources, spark):
    import torch

    from openalign import presets
    from openalign.data.pairs import read_keep
    from openalign.data.transforms import to_tensor
    from openalign.model.dual_encoder import DualEncoder
    from openalign.model.hub import save_pretrained
    from openalign.pipeline.curation.dedup import DedupOptions, dedup
    from openalign.tokenizer import train_tokenizer

    pairs, held = pairs_and_copies(tmp_path, sources, ("f03.png", "f11.png", "f12.png", "f13.png"))
    cfg = presets.get("tiny")
    torch.manual_seed(0)
    model = DualEncoder(cfg.model)
    with torch.no_grad():  # BatchNorm statistics of real images: random statistics embed everything near 0
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None
        model.encode_image(torch.stack([to_tensor(Image.open(f).convert("RGB").resize((32, 32)))
                                        for f in sorted(Path(sources[0]).glob("f*.png"))[:16]]))
    save_pretrained(model.eval(), train_tokenizer(["a b c"] * 10, 120, 16), tmp_path / "model", cfg)
    options = DedupOptions(mode="buckets", model=str(tmp_path / "model"), threshold=0.99999, clusters=4,
                           top_clusters=3, choose=2, images_per_task=9, workers=1)
    local = dedup(pairs, str(held), tmp_path / "dl", options, progress=False)
    distributed = dedup(pairs, str(held), tmp_path / "ds", options, progress=False, engine=SPARK)
    assert local.removed_images >= 4 and local.report["clusters"] == 4
    # the same decisions; the scores agree to float rounding (the model runs on 2 threads here, 1 on an executor)
    scored = ("closest_score_percentiles", "examples")
    assert {k: v for k, v in without_engine(local).items() if k not in scored} == {
        k: v for k, v in without_engine(distributed).items() if k not in scored}
    assert {(e["train"], e["eval"]) for e in local.report["examples"]} == {
        (e["train"], e["eval"]) for e in distributed.report["examples"]}  # copies: all ~1.0
    assert local.report["closest_score_percentiles"] == pytest.approx(
        distributed.report["closest_score_percentiles"], abs=1e-5)
    assert read_keep(tmp_path / "dl") == read_keep(tmp_path / "ds")


@needs_java
def test_index_shards_added_by_spark_tasks_equal_local_ones(tmp_path, spark):
    """The add phase of an index over its memory budget, as Spark jobs: the same IVF shards."""
    from openalign.index import build as build_lib
    from openalign.index.embed import MANIFEST, _write_part

    rng = np.random.default_rng(0)
    x = rng.normal(size=(6_000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    emb = tmp_path / "emb"
    emb.mkdir()
    for i in range(3):
        rows = [{"key": f"k{i}-{j}", "path": "", "caption": "", "width": 1, "height": 1} for j in range(2_000)]
        _write_part(emb, i, x[i * 2_000:(i + 1) * 2_000].astype(np.float16), rows)
    (emb / MANIFEST).write_text(json.dumps({"complete": True, "parts": {str(i): {"rows": 2_000} for i in range(3)},
                                            "model": "m", "dim": 16}))
    options = build_lib.IndexOptions(kind="ivf", nlist=32, train_per_cell=39, memory=100_000, block_rows=1_500)
    local = build_lib.build(emb, tmp_path / "local", options, engine=LOCAL)
    distributed = build_lib.build(emb, tmp_path / "spark", options, engine=SPARK)
    assert local.info["storage"] == distributed.info["storage"] == "shards" and len(local.info["shards"]) == 4
    for name in local.info["shards"]:
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "spark" / name).read_bytes()
    assert local.params == distributed.params


def test_local_ingest_of_many_tars_runs_a_task_per_tar_with_the_same_rows(tmp_path, sources):
    """Four tars for two workers: each worker reads its own tars (no image bytes through a pipe); the rows
    are those of one process reading every record in order."""
    tars = [sources[1], sources[2], sources[1], sources[2]]
    one = ingest(tars, tmp_path / "one.parquet", IngestOptions(workers=1), progress=False)
    two = ingest(tars, tmp_path / "two.parquet", IngestOptions(workers=2), progress=False)
    assert pq.read_table(tmp_path / "one.parquet").equals(pq.read_table(tmp_path / "two.parquet"))
    assert without_engine(one) == without_engine(two) and one.rejected == {"truncated_tar": 2}


DRIVER = """
import time
from openalign.data.engine import Engine, Job, cores, run_jobs
run_jobs([Job(f"{{i:06d}}", time.sleep, (300,)) for i in range(2)], {status!r}, Engine("local", workers=2), "sleep",
          progress=False)
"""


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_killing_a_local_engine_driver_leaves_no_process_running(tmp_path):
    # Before: kill -9 of the driver left 4 processes running (the resource tracker, the fork server, two workers
    # waiting on their task queue for ever).
    import os
    import signal
    import subprocess
    import sys
    import time

    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(status=str(tmp_path / "status"))])
    deadline = time.monotonic() + 60
    while len(_descendants(driver.pid)) < 3:  # the fork server and the two workers (and the resource tracker)
        assert time.monotonic() < deadline and driver.poll() is None, "the workers did not start"
        time.sleep(0.2)
    time.sleep(1)  # the workers are in their jobs
    children = _descendants(driver.pid)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{p}").exists() and "zombie" not in _state(p) for p in children):
        if time.monotonic() > deadline:
            for p in children:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"still running after the driver was killed: {sorted(children)}")
        time.sleep(0.2)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    except (OSError, IndexError):
        return "zombie"


CALLS: list = []


def _write_rows(path: str, n: int) -> dict:
    CALLS.append(path)
    Path(path).write_text("row\n" * n)
    return {"rows": n}


@pytest.mark.parametrize("damage", ["not json", "a list", "no result", "count edited", "output deleted",
                                    "output changed"])
def test_a_damaged_or_edited_status_or_a_lost_output_runs_its_task_again(tmp_path, damage, capsys):
    # Before: 5 of 7 corrupted status files gave tracebacks, a deleted part with its status left behind blocked every
    # rerun, and a hand-edited count was trusted.
    import json as json_lib

    from openalign.data.engine import Engine, Job, run_jobs, status_path

    jobs = [Job(f"{i:06d}", _write_rows, (str(tmp_path / f"out-{i}.txt"), i + 1), key=f"k{i}",
                  outputs=(str(tmp_path / f"out-{i}.txt"),)) for i in range(3)]
    status = tmp_path / "status"
    first, _ = run_jobs(jobs, status, Engine("local", workers=1), progress=False)
    CALLS.clear()
    path, output = status_path(status, "000001"), tmp_path / "out-1.txt"
    if damage == "not json":
        path.write_text('{"id": "000001", "key": "k1", "res')
    elif damage == "a list":
        path.write_text("[1, 2, 3]")
    elif damage == "no result":
        path.write_text(json_lib.dumps({"id": "000001", "key": "k1"}))
    elif damage == "count edited":
        path.write_text(path.read_text().replace('"rows": 2', '"rows": 7'))
    elif damage == "output deleted":
        output.unlink()
    else:
        output.write_text("something else\n")
    capsys.readouterr()
    again, resumed = run_jobs(jobs, status, Engine("local", workers=1), "rows", progress=True)
    assert again == first and resumed == 2 and CALLS == [str(output)] and output.read_text() == "row\n" * 2
    reason = "its output files are gone or changed" if damage.startswith("output") else \
        "its status file was damaged or edited"
    assert f"rows: running again 1 job ({reason})" in capsys.readouterr().err  # a rerun says what it redid, and why


def broken(value: int) -> dict:
    raise ValueError(f"a bug, not bad input ({value})")


def pid_of(value: int) -> dict:
    import os

    return {"pid": os.getpid(), "value": value}


def test_the_local_pool_stays_warm_for_the_stages_of_a_command_and_ends_with_it(tmp_path):
    # Before: every stage started its own pool, and each worker imported the stage's modules again: dedup's
    # import of transformers took ~8 s a worker, so 2 workers ran no faster than 1 (bench/data_plane.py, P11).
    from openalign import host
    from openalign.data import engine as engine_lib

    two = Engine("local", workers=2)
    with host.command_scope():
        first, _ = run_jobs([Job(f"a{i}", pid_of, (i,)) for i in range(4)], tmp_path / "a", two, progress=False)
        pool = engine_lib._POOLS[2]
        workers = set(pool._processes)
        again, _ = run_jobs([Job(f"b{i}", pid_of, (i,)) for i in range(4)], tmp_path / "b", two, progress=False)
        # the same pool and workers (which of them takes a task is the scheduler's: one may take all four)
        assert engine_lib._POOLS[2] is pool and set(pool._processes) == workers
        assert {r["pid"] for r in (*first.values(), *again.values())} <= workers
        assert [r["value"] for r in again.values()] == [0, 1, 2, 3]
        assert engine_lib._POOLS
    assert not engine_lib._POOLS  # the command's end stops them
    with host.command_scope():
        with pytest.raises(RuntimeError, match="failed 1 times"):  # a stage that fails stops the pool: none of its
            run_jobs([Job("a", square, (1,)), Job("b", broken, (7,))], tmp_path / "c",  # jobs runs on after it
                      Engine("local", workers=2, retries=0), progress=False)
        assert not engine_lib._POOLS
        fresh, _ = run_jobs([Job(f"d{i}", pid_of, (i,)) for i in range(2)], tmp_path / "d", two, progress=False)
        assert {r["pid"] for r in fresh.values()}.isdisjoint(r["pid"] for r in first.values())


def test_a_driver_duckdb_has_an_explicit_limit_and_spills_inside_the_output(tmp_path, monkeypatch):
    # Before: every DuckDB step on the driver (a plan, a merge, a count) ran with DuckDB's default, 80% of the RAM,
    # and spilled into ./.tmp of the directory the command ran from.
    from openalign.data import engine as engine_lib

    with engine_lib.driver_duckdb(Engine(memory="64M", workers=1), tmp_path / "out") as con:
        limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        spill = con.execute("SELECT current_setting('temp_directory')").fetchone()[0]
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
        # a sort of ~200 MB of rows under 64 MiB: it must spill, and into the output folder
        con.execute("CREATE TABLE t AS SELECT range AS i, md5(range::VARCHAR) || md5((range + 1)::VARCHAR) AS s "
                    "FROM range(2000000)")
        assert con.execute("SELECT count(*) FROM (SELECT * FROM t ORDER BY s)").fetchone()[0] == 2_000_000
    assert limit == "64.0 MiB"
    assert Path(spill) == tmp_path / "out" / engine_lib.SPILL and threads == 1
    assert not (tmp_path / "out" / engine_lib.SPILL).exists()  # removed when the step ends
    assert engine_lib.driver_memory(Engine()) == int(engine_lib.machine_memory() * engine_lib.DRIVER_MEMORY_SHARE)
    with pytest.raises(ConfigError, match="ran out of memory under its limit of 32M .* raise the engine's memory"):
        with engine_lib.driver_duckdb(Engine(memory="32M", workers=1), tmp_path / "out") as con:  # cannot spill
            con.execute("SELECT length(string_agg(md5(range::VARCHAR), ',' ORDER BY range)) FROM range(3000000)")
    assert not (tmp_path / "out" / engine_lib.SPILL).exists()
    assert engine_lib.driver_memory(Engine("spark", memory="1G")) == engine_lib.driver_memory(Engine())


def test_extract_s_merge_and_tallies_run_on_a_driver_duckdb_in_its_output(tmp_path, monkeypatch):
    import duckdb

    from openalign.pipeline.web.extract import extract

    seen = []
    real = duckdb.connect

    def connect(*args, **kwargs):
        seen.append(kwargs.get("config", {}))
        return real(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", connect)
    table = tmp_path / "urls.csv"
    table.write_text("url,caption\nhttps://a.example/1.jpg,a red bicycle\nhttps://a.example/2.jpg,two cats\n")
    out = tmp_path / "out"
    extract([str(table)], out, engine=Engine(workers=1, memory="128M"), progress=False)
    driver = [c for c in seen if c.get("temp_directory")]
    assert len(driver) == 2 and all(Path(c["temp_directory"]).is_relative_to(out) for c in driver)  # merge, tallies
    assert {c["memory_limit"] for c in driver} == {"128MiB"}


# ---------------------------------------------------------------------------------------------- at a snapshot's size

def test_a_shuffle_s_partitions_follow_the_data_and_the_cluster_not_the_driver():
    from openalign.data.engine import SHUFFLE_EXPANSION, SHUFFLE_PARTITION_BYTES, shuffle_partitions

    assert shuffle_partitions(0, 4) == 8  # small input: two a core of the cluster
    assert shuffle_partitions(0, 2_000) == 4_000
    pair_table = 400 * 10**9  # 1.8B pairs
    assert shuffle_partitions(pair_table, 4) == -(-pair_table * SHUFFLE_EXPANSION // SHUFFLE_PARTITION_BYTES) == 23_842
    assert shuffle_partitions(10**18, 4) == 200_000


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=needs_java)])
def test_a_plan_is_a_folder_a_job_and_each_job_reads_only_its_rows(tmp_path, engine, request):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from openalign.data.engine import driver_duckdb, duckdb_plan, plan_glob, read_plan, spark_plan

    rows = [{"key": f"k{(i * 7919) % 1000:04d}", "value": i} for i in range(1000)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    plan = tmp_path / "plan"
    if engine == "spark":
        spark = request.getfixturevalue("spark")
        count = spark_plan(spark.read.parquet(str(tmp_path / "rows.parquet")), "key", 64, plan)
    else:
        with driver_duckdb(Engine(workers=1), tmp_path) as con:
            count = duckdb_plan(con, "SELECT * FROM read_parquet(?)", [str(tmp_path / "rows.parquet")], "key", 64, plan)
    ordered = sorted(rows, key=lambda r: r["key"])
    assert count == 1000 and sorted(p.name for p in plan.iterdir() if p.is_dir()) == sorted(
        f"task={i}" for i in range(16))
    for i in range(16):
        assert read_plan(str(plan), i) == ordered[64 * i: 64 * (i + 1)]
        files = [f for f in (plan / f"task={i}").iterdir() if f.suffix == ".parquet"]
        assert sum(pq.read_metadata(f).num_rows for f in files) == len(ordered[64 * i: 64 * (i + 1)])
    assert read_plan(str(plan), 16) == []
    import duckdb

    with duckdb.connect() as con:
        assert con.execute(f"SELECT count(*) FROM read_parquet('{plan_glob(plan)}')").fetchone()[0] == 1000


def keep_list(folder, uids, write) -> Path:
    """A finished keep-list of `uids` in `folder` (its report beside it), written by `write(path, uids)`."""
    from openalign.data.pairs import write_keep_report

    folder.mkdir(parents=True)
    write(folder / "keep.parquet", uids)
    write_keep_report(folder, "filter_report.json", {"stage": "filter"}, "pairs.parquet")
    return folder


def single_file(path, uids):
    import pyarrow as pa

    pq.write_table(pa.table({"uid": pa.array(sorted(uids), pa.string())}), path)


def bucketed(path, uids):
    import duckdb
    import pyarrow as pa

    from openalign.data.pairs import write_keep_duckdb

    with duckdb.connect() as con:
        con.register("given", pa.table({"uid": pa.array(list(uids) * 2, pa.string())}))  # repeated: kept once
        assert write_keep_duckdb(con, "SELECT uid FROM given", [], path) == len(set(uids))


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=needs_java)])
def test_a_keep_list_is_bucketed_by_uid_hash_the_same_way_on_both_engines(tmp_path, engine, monkeypatch, request):
    import pyarrow as pa

    from openalign.data import pairs as pairs_lib

    monkeypatch.setattr(pairs_lib, "KEEP_BUCKET_UIDS", 7)
    uids = [pairs_lib.blake(str(i).encode()) for i in range(40)] + ["", "é", "'quoted'"]
    path = tmp_path / "keep.parquet"
    if engine == "spark":
        spark = request.getfixturevalue("spark")
        frame = spark.createDataFrame(pa.table({"uid": uids * 2}).to_pandas())
        assert pairs_lib.write_keep_spark(frame, path) == 43
    else:
        bucketed(path, uids)
    layout = pairs_lib.keep_layout(path)
    assert layout["buckets"] == 8 == pairs_lib.keep_buckets(43) and layout["uids"] == 43  # 43 / 7 -> 7 -> 8
    for b in range(8):
        part = sorted(u for f in (path / f"bucket={b}").glob("*.parquet") for u in pq.read_table(f).column("uid")
                      .to_pylist())
        assert part == sorted(u for u in uids if pairs_lib.uid_bucket(u, 8) == b)  # the Python rule, bucket by bucket
    assert pairs_lib.keep_buckets(0) == 1 and pairs_lib.keep_buckets(7) == 1 and pairs_lib.keep_buckets(8) == 2


def test_an_empty_keep_list_is_a_table_of_no_uids(tmp_path):
    from openalign.data.pairs import read_keep

    keep = keep_list(tmp_path / "k", [], bucketed)
    assert read_keep(keep) == []


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=needs_java)])
def test_a_bucketed_keep_list_joins_to_the_same_pairs_as_a_single_file(tmp_path, sources, engine, request):
    """shard (its plan is the join) and data.keep's index read a keep-list of either layout alike."""
    from openalign.data.pairs import build_keep_index, read_keep

    if engine == "spark":
        request.getfixturevalue("spark")
    pairs = tmp_path / "pairs.parquet"
    ingest(sources, pairs, IngestOptions(workers=1), progress=False)
    uids = sorted(pq.read_table(pairs, columns=["uid"]).column("uid").to_pylist())[::2]
    single = keep_list(tmp_path / "single", uids, single_file)
    buckets = keep_list(tmp_path / "buckets", uids, bucketed)
    assert read_keep(single) == read_keep(buckets) == sorted(set(uids))
    run = SPARK if engine == "spark" else LOCAL
    options = ShardOptions(image_size=40, samples_per_shard=5, workers=2)
    one = shard(pairs, [single], tmp_path / "one", options, progress=False, engine=run)
    other = shard(pairs, [buckets], tmp_path / "other", options, progress=False, engine=run)
    assert one.samples == other.samples > 0 and one.shards == other.shards
    for name in one.shards:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "other" / name).read_bytes()
    for folder in (single, buckets):
        (folder / "filter_report.json").write_text(json.dumps({"stage": "filter", "pair_table": str(pairs)}))
    index = [pq.read_table(build_keep_index([str(k)], tmp_path / f"idx-{k.name}")).to_pylist()
             for k in (single, buckets)]
    assert index[0] == index[1] and len(index[0]) > 0


@needs_java
def test_on_spark_score_semdedup_balance_and_card_open_no_duckdb_on_the_driver(tmp_path, sources, spark):
    """Before: score's cut and report, semdedup's sample and report, balance's counts, keep-list and report, and every
    number of the card ran in a DuckDB on the driver, whatever the engine."""
    from conftest import save_tiny_model
    from openalign.data.pairs import read_keep
    from openalign.pipeline.curation.balance import BalanceOptions, balance
    from openalign.pipeline.curation.card import CardOptions, card
    from openalign.pipeline.curation.score import ScoreOptions, score
    from openalign.pipeline.curation.semdedup import SemDedupOptions, semdedup

    pairs = tmp_path / "pairs.parquet"
    ingest(sources, pairs, IngestOptions(workers=1), progress=False)
    texts = pq.read_table(pairs, columns=["text"]).column("text").to_pylist()
    model = save_tiny_model(tmp_path / "model", texts)
    meta = tmp_path / "meta.txt"
    meta.write_text("picture\nweb\ntable\nfolder\n")
    with no_driver_duckdb():
        scored = score(pairs, tmp_path / "score", ScoreOptions(model=str(model), keep_fraction=0.3,
                                                               images_per_task=7), progress=False, engine=SPARK)
        deduped = semdedup(pairs, tmp_path / "semdedup", SemDedupOptions(model=str(model), clusters=3, eps=0.3,
                                                                         images_per_task=7), progress=False,
                           engine=SPARK)
        balanced = balance(pairs, tmp_path / "balance", BalanceOptions(metadata=str(meta), per_entry=3),
                           progress=False, engine=SPARK)
        carded = card(pairs, [tmp_path / "score", tmp_path / "balance"], tmp_path / "card",
                      CardOptions(metadata=str(meta)), progress=False, engine=SPARK)
    assert scored.kept_pairs == len(read_keep(tmp_path / "score")) > 0 and deduped.images > 0
    assert balanced.kept_pairs == len(read_keep(tmp_path / "balance"))
    assert carded.kept_pairs == len(set(read_keep(tmp_path / "score")) & set(read_keep(tmp_path / "balance")))
