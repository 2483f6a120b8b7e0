"""Shard: the kept pairs of a pair table -> webdataset shards the training loader reads unchanged.

    openalign shard pairs.parquet --keep FILTER_DIR [--keep DEDUP_DIR ...] --out SHARDS

A pair is written when its uid is in *every* keep-list given (the filter stage's, the dedup stage's, an unsafe-image
classifier's); with no keep-list, every pair is (a collection that is already clean). Kept pairs are grouped by image:
one sample per image, with all its kept alt-texts in `KEY.json["texts"]` (the loader draws one per visit, so an image
never meets itself in a batch) and the first in `KEY.txt`. Images are decoded upright to RGB (see images.to_rgb),
resized so the shorter side is at most `image_size` (paper: 346) keeping the aspect ratio, and stored as JPEG.

Samples are ordered by image key (a content hash, so shards are a fair shuffle) and cut into shards of
`samples_per_shard`; each shard is written to a temporary name and renamed when complete, so a rerun
skips finished shards and redoes only the missing ones.
"""

from __future__ import annotations

import json
import shutil
import re
from dataclasses import asdict, dataclass
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from openalign.config import ConfigError, Options, listed
from openalign.data import images
from openalign.data import tars
from openalign.data.engine import (Engine, Job, driver_duckdb, duckdb_plan, job_id, previous, read_plan, spark_for,
                                   spark_plan)
from openalign.data.pairs import (SOURCE_COLUMNS, blake, first_source, keep_source, keep_table,
                                  spark_first_source)
from openalign.outputs import staged
from openalign.pipeline.runner import Manifest, Run, Stage, run_stage
from openalign.data.tars import MANIFEST, encode_image
from openalign.data.sources import SOURCES, karpathy_items

__all__ = ["ShardOptions", "ShardResult", "shard"]

STATUS = "_status"  # per-shard task status (data/engine.py)


@dataclass(frozen=True)
class ShardOptions(Options):
    image_size: int = 346  # shorter side after resizing (paper: 346; never upscaled); 0 keeps the original size
    samples_per_shard: int = 1000  # images per shard
    quality: int = 90  # JPEG quality of the stored images
    prefix: str = "shard"  # shard names: PREFIX-000000.tar, ...
    workers: int = 0  # local engine: processes writing shards (0: all cores)
    max_pixels: int = images.DEFAULT_MAX_PIXELS  # larger images are skipped (decompression bombs)


SAMPLE_QUERY = f"""
    SELECT image_key, texts, uids, s.path AS path, s.member AS member, s.url AS url FROM (
        SELECT image_key, list(text ORDER BY uid) AS texts, list(uid ORDER BY uid) AS uids, {first_source("url")} AS s
        FROM (SELECT DISTINCT p.uid, p.image_key, p.text, p.path, p.member, p.url
              FROM read_parquet(?) p JOIN keep k ON p.uid = k.uid)
        GROUP BY image_key)"""


@dataclass(frozen=True)
class ShardResult:
    """What `shard` wrote (its manifest, OUT/manifest.json, holds the same and the options)."""

    out: Path  # the shards' folder
    samples: int  # images written, each with all of its texts
    shards: dict[str, int]  # {shard file: its samples}
    skipped: dict[str, int]  # images not written, by reason (e.g. unreadable)
    resumed_shards: int  # shards a rerun did not write again (their plan unchanged)
    seconds: float
    manifest: dict  # the manifest as written


def kept_images(pairs: Path, keep_dirs: list[Path]) -> list[dict]:
    """Kept pairs grouped by image, ordered by image key: [{image_key, texts, uids, path, member, url}]."""
    import duckdb

    with duckdb.connect() as con:
        keep_table(con, pairs, keep_dirs)
        rows = con.execute(SAMPLE_QUERY + " ORDER BY image_key", [str(pairs)]).fetchall()
    return [{"image_key": key, "texts": texts, "uids": uids, "path": path, "member": member, "url": url}
            for key, texts, uids, path, member, url in rows]


def plan_duckdb(pairs: Path, keep_dirs: list[Path], plan: Path, per_shard: int, engine: Engine = Engine()) -> int:
    """The shard plan: every kept image with its position (`pos`, by image key) and `shard`, its kept pairs a row
    each (read back as lists: `read_plan(..., pairs=True)`); returns the count (DuckDB on the driver, its spill files
    in the plan's folder: the kept pairs, the images' grouping, their numbering and the join all spill, where lists of
    each image's texts did not: 5M pairs ran out of memory under 512 MB)."""
    with driver_duckdb(engine, plan) as con:
        keep_table(con, pairs, keep_dirs)
        con.execute("CREATE TEMP TABLE kept_pairs AS SELECT DISTINCT p.uid, p.image_key, p.text, p.path, p.member, "
                    "p.url FROM read_parquet(?) p JOIN keep k ON p.uid = k.uid", [str(pairs)])
        images = (f"SELECT image_key, s.path AS path, s.member AS member, s.url AS url FROM (SELECT image_key, "
                  f"{first_source('url')} AS s FROM kept_pairs GROUP BY image_key)")
        return duckdb_plan(con, images, [], "image_key", per_shard, plan / "plan.parquet", "shard",
                           pairs="SELECT DISTINCT image_key, uid, text FROM kept_pairs")


def plan_spark(pairs: str, keep_dirs: list[Path], plan: Path, per_shard: int, engine: Engine) -> int:
    """The same plan from Spark SQL: the grouping, the global order and the positions all run on the executors."""
    from pyspark.sql import functions as F

    spark = spark_for(engine, pairs)
    table = spark.read.parquet(pairs).select("uid", "image_key", "text", "path", "member", "url")
    if keep_dirs:
        keep = None
        for k in keep_dirs:
            uids = spark.read.parquet(keep_source(k)).select("uid")
            keep = uids.distinct() if keep is None else keep.intersect(uids)
    else:
        keep = table.select("uid").distinct()
    grouped = (table.join(keep, "uid").distinct().groupBy("image_key")
               .agg(F.sort_array(F.collect_list(F.struct("uid", "text"))).alias("ut"),
                    spark_first_source("url").alias("s"))
               .select("image_key", F.col("ut.text").alias("texts"), F.col("ut.uid").alias("uids"),
                       F.col("s.path").alias("path"), F.col("s.member").alias("member"), F.col("s.url").alias("url")))
    return spark_plan(grouped, "image_key", per_shard, plan / "plan.parquet", "shard")


def plan_samples(samples: list[dict], plan: Path, per_shard: int) -> int:
    """A plan from samples already in memory (built-in corpora, evaluation sets), in their given order."""
    rows = [s | {"pos": i + 1, "shard": i // per_shard} for i, s in enumerate(samples)]
    pq.write_table(pa.Table.from_pylist(rows), plan / "plan.parquet", row_group_size=max(per_shard, 2048))
    return len(samples)


def resize_short_side(image: Image.Image, size: int) -> Image.Image:
    short = min(image.size)
    if not size or short <= size:
        return image
    scale = size / short
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BICUBIC)


def write_shard(path: Path, samples: list[dict], options: ShardOptions) -> dict:
    """Write one shard atomically; returns its counts (samples written, skipped with reasons)."""
    written, skipped = 0, dict[str, int]()
    # fixed mtime: reruns give identical bytes
    with staged(path, tmp=path.with_suffix(".tar.tmp")) as tmp, tars.TarWriter(tmp, mtime=0.0) as writer:
        for sample in samples:
            try:
                image = images.load_rgb(SOURCES.read(sample["path"], sample["member"]), options.max_pixels)
            except images.BadImage as err:
                skipped[err.reason] = skipped.get(err.reason, 0) + 1
                continue
            except OSError:
                skipped["missing_file"] = skipped.get("missing_file", 0) + 1
                continue
            image = resize_short_side(image, options.image_size)
            meta = {"texts": sample["texts"], "uids": sample["uids"], "source": sample["path"],
                    "member": sample["member"], "url": sample["url"]}
            if sample.get("name"):  # a built-in corpus's category: the sample's label for zero-shot evaluation
                meta["name"] = sample["name"]
            writer.write({"__key__": sample["image_key"], "jpg": encode_image(image, quality=options.quality),
                          "txt": sample["texts"][0], "json": json.dumps(meta, ensure_ascii=False).encode()})
            written += 1
    return {"name": path.name, "samples": written, "skipped": skipped}


def shard_task(plan: str, index: int, out: str, options: ShardOptions) -> dict:
    """One task: shard `index` of the plan. A shard finished earlier for exactly these samples and options is
    kept as it is."""
    samples = read_plan(plan, index, "shard", pairs=True)
    path = Path(out) / f"{options.prefix}-{index:06d}.tar"
    key = blake(json.dumps([asdict(options) | {"workers": 0}, samples], sort_keys=True, default=str).encode())
    done = previous(Path(out) / STATUS, job_id(index))
    if path.is_file() and done and done["result"].get("key") == key and done["result"].get("file") == _file_stat(path):
        return done["result"] | {"resumed": True}  # the same samples and options, and the tar as it was written
    result = write_shard(path, samples, options)
    return result | {"key": key, "resumed": False, "file": _file_stat(path)}


def _file_stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


class Shard(Stage):
    """The kept pairs of a pair table -> webdataset shards: the plan (which image goes to which shard) by SQL,
    DuckDB's on the local engine and Spark's on the Spark engine, into OUT/_plan; then one job per shard. Each
    shard's status stays in OUT/_status, so a rerun keeps the shards whose samples and options are unchanged."""

    name = "shard"
    options = ShardOptions
    result = ShardResult
    columns = SOURCE_COLUMNS
    keeps = False
    report_file = MANIFEST
    record_field = "manifest"
    work = "_plan"
    status = STATUS

    def __init__(self, keep_dirs: Sequence[Path] = (), info: dict | None = None):
        self.keep_dirs, self.info = [Path(k) for k in keep_dirs], info or {}

    def engine(self, options: ShardOptions, engine: Engine) -> Engine:
        if engine.name == "local":
            return Engine(workers=options.workers or engine.workers, retries=engine.retries)
        return engine

    def check(self, run: Run) -> None:
        if run.options.samples_per_shard < 1:
            raise ConfigError("--samples-per-shard must be at least 1")
        try:  # what an earlier run wrote, before this run unfinishes it: its shards that this plan does not have go
            self.previous = json.loads((run.out / MANIFEST).read_text()) if (run.out / MANIFEST).is_file() else {}
        except ValueError:  # damaged: its stale shards, if any, are found by name below
            self.previous = {}

    def planned(self, run: Run) -> int:
        """The plan's samples, written to OUT/_plan/plan.parquet."""
        pairs, keep, options = run.pairs, self.keep_dirs, run.options
        if run.engine.name == "spark":
            count = plan_spark(pairs, keep, run.work, options.samples_per_shard, run.engine)
        else:
            count = plan_duckdb(Path(pairs), keep, run.work, options.samples_per_shard, run.engine)
        if count == 0:
            raise ConfigError(f"nothing to shard: {'the keep-lists keep no pair of ' if keep else ''}{pairs}"
                              f"{' holds no pairs' if not keep else ''}; check the keep-lists' reports (each stage's "
                              "removed_pairs), or that they come from this pair table")
        check_sources_exist(run.work, pairs)
        return count

    def plan(self, run: Run) -> list[Job]:
        shutil.rmtree(run.work, ignore_errors=True)
        run.work.mkdir(parents=True)
        self.count = self.planned(run)
        options, out = run.options, run.out
        n_shards = -(-self.count // options.samples_per_shard)
        names = {f"{options.prefix}-{i:06d}.tar" for i in range(n_shards)}
        for stale in set(self.previous.get("shards", {})) - names:  # ours, from an earlier, larger plan
            (out / stale).unlink(missing_ok=True)
        return [Job(job_id(i), shard_task, (str(run.work / "plan.parquet"), i, str(out), options))
                for i in range(n_shards)]

    def merge(self, run: Run, results: dict[str, dict]) -> Manifest:
        counts, skipped = dict[str, int](), dict[str, int]()
        for result in results.values():
            counts[result["name"]] = result["samples"]
            for reason, k in result["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + k
        if self.count and not sum(counts.values()):
            reasons = ", ".join(f"{k} {v:,}" for k, v in skipped.items())
            raise ConfigError(f"no image of the {self.count:,} to shard could be read ({reasons}); the shards in "
                              f"{run.out} are empty")
        return Manifest({**self.info, "stage": "shard", "engine": run.engine.name, "options": asdict(run.options),
                         "complete": True, "n_samples": sum(counts.values()), "skipped": skipped,
                         "resumed_shards": sum(r["resumed"] for r in results.values()),
                         "shards": dict(sorted(counts.items()))}, after=("shards",))

    def result_fields(self, run: Run, report: Manifest) -> dict:
        return {"out": run.out, "samples": report.n_samples}


class ShardSamples(Shard):
    """Samples already in memory (built-in corpora, evaluation sets) -> shards, in their given order."""

    reads_pairs = False

    def __init__(self, samples: list[dict], info: dict):
        super().__init__((), info)
        self.samples = samples

    def engine(self, options: ShardOptions, engine: Engine) -> Engine:
        return Engine(workers=options.workers)

    def planned(self, run: Run) -> int:
        return plan_samples(self.samples, run.work, run.options.samples_per_shard)


def shard(pairs: str | Path, keep_dirs: list[Path], out: Path, options: ShardOptions = ShardOptions(),
          progress: bool = True, split_name: str = "", engine: Engine = Engine()) -> ShardResult:
    """Write the kept pairs of `pairs` as shards in `out`; finished shards of an earlier run are kept (`Shard`).
    Both engines give the same bytes."""
    keep_dirs = listed(keep_dirs, "keep_dirs")
    info = {"pairs": str(pairs), "keep": [str(k) for k in keep_dirs], "split": split_name}
    return run_stage(Shard(keep_dirs, info), pairs, out, options, progress, engine)


def check_sources_exist(plan: Path, pairs, probe: int = 100) -> None:
    """Fail in one sentence when none of the first `probe` distinct source files exist from here, instead of
    writing empty shards (pair tables from before absolute paths hold paths relative to where ingest ran)."""
    import pyarrow.dataset as ds

    head = ds.dataset(str(plan / "plan.parquet")).head(20 * probe, columns=["path"]).column("path").to_pylist()
    paths = list(dict.fromkeys(head))[:probe]
    if paths and not any(Path(p).is_file() for p in paths):
        raise ConfigError(f"none of the {len(paths)} source files checked from {pairs} exist from here "
                          f"(e.g. {paths[0]}); a relative path is relative to where `openalign ingest` ran: run "
                          "shard from there, or ingest again (it now records absolute paths)")


def write_samples(samples: list[dict], out: Path, options: ShardOptions, progress: bool, info: dict) -> ShardResult:
    """Shard samples already in memory, in their order (built-in corpora, evaluation sets)."""
    return run_stage(ShardSamples(samples, info), None, out, options, progress)


def karpathy_shards(path: Path, images_root: Path, split: str, out: Path, progress: bool = True) -> ShardResult:
    """Shard a Karpathy split for training or evaluation (every caption of an image kept, the shorter side at
    most 346, unreadable images skipped and counted); reruns reuse finished shards."""
    keys: dict[str, int] = {}
    samples = []
    for item in karpathy_items(path, images_root, split):
        key = re.sub(r"[^A-Za-z0-9_-]", "_", Path(item.path).stem)  # webdataset keys: no dots
        keys[key] = keys.get(key, 0) + 1
        samples.append({"image_key": key if keys[key] == 1 else f"{key}_{keys[key]}", "texts": item.texts,
                        "uids": item.caption_ids, "path": item.path, "member": None, "url": ""})
    return write_samples(samples, out, ShardOptions(prefix=f"{path.stem}-{split.replace(',', '-')}"), progress,
                         {"source": str(path), "split": split, "images": str(images_root)})
