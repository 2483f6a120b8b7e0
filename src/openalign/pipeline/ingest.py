"""Ingest: raw image/alt-text pairs from folders, tables and webdataset tars into one Parquet pair table.

    openalign ingest SRC... --out pairs.parquet

Sources, recognised by what they are:
- a **directory**: every image file (jpg/jpeg/png/webp/gif/bmp/tiff) with a caption sidecar of the same
  stem (`cat.jpg` + `cat.txt`, as img2dataset's `files` output writes; a `cat.json` sidecar may give
  the `url`); sub-directories are walked. A `.txt` of several lines is several captions, a pair each
  (CLIP_benchmark's convention, read so everywhere), except beside img2dataset's `.json`, whose `.txt` is
  one alt-text (`tars.captions`); the same holds for a tar sample's `.txt`;
- a **table** `.csv .tsv .jsonl .json .parquet`, read as eval and embed read it (data/tables.py): one pair per
  caption of each row, an image column (a path relative to the table, a `file://` URL, or an http(s) URL)
  and a text column, found as everywhere (`image`, `filepath`, ... and `text`, `caption`, `title`, ...: OpenCLIP's
  `filepath`/`title` CSV too) or named by --image-column / --text-column; a Karpathy split JSON gives a pair per
  sentence; img2dataset's Parquet output is read as its folder is; what a .json or .parquet is comes from its
  content;
- a **webdataset tar** `.tar`: samples `KEY.jpg|png|webp` + `KEY.txt` (+ `KEY.json`), as img2dataset
  writes them.

Output `pairs.parquet`, one row per usable pair:
    uid (128-bit hash of image key + text), image_key (128-bit hash of the image bytes), text, width,
    height (as displayed), bytes, format, mode, conversions, source, path, member, url
and `pairs.rejects.parquet` (every pair that could not be used, with its reason) and
`pairs.manifest.json` (inputs, options, counts per reason and per conversion). Texts keep their case
and characters; only runs of whitespace (newlines, tabs) become one space. Remote URLs are recorded as
rejects (`remote_not_fetched`): download with img2dataset first and ingest its output.

A source may also be a glob (each match a source), a table written as a **folder of parts** (every file a table of
one format: Spark's `part-*`, `_SUCCESS` and hidden checksums passed over; a unit per part, in natural order), or
fetch's output (a unit per shard: its tar and its index, whose failed URLs are `not_downloaded` rejects). With
`--layout parts` (the default on Spark) OUT and its rejects are folders of the tasks' parts in task order
(`part-NNNNNN.parquet`), written by the tasks themselves: nothing is collected on the driver, a rerun keeps every task
whose inputs are unchanged (their statuses in OUT.parts/), and every stage reads the folder as the file.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from openalign.config import ConfigError, Options, listed
from openalign.data import images
from openalign.data import tars
from openalign.data import tables
from openalign.data.sources import (IMAGE_SUFFIXES, folder_files, karpathy_items, read_caption,
                                    sidecar_meta)
from openalign.data.tables import TABLE_SUFFIXES
from openalign.data.engine import Engine, Job, driver_duckdb, job_id, spark_session
from openalign.data.pairs import (FETCH_REPORT, FETCH_WORK, PAIR_SCHEMA, blake, distinct_counts, normalize_text,
                                  pair_uid, parts_glob)
from openalign.data.workers import process_pool
from openalign.outputs import place, sources_key, staged
from openalign.pipeline.runner import Manifest, Run, Stage, run_stage

__all__ = ["IngestOptions", "IngestResult", "ingest"]

TEXT_REJECTS = ("no_text", "remote_not_fetched", "missing_file", "bad_row", "truncated_tar", "unreadable_tar",
                "not_a_file", "not_downloaded")
REJECT_SCHEMA = pa.schema([("source", pa.string()), ("path", pa.string()), ("member", pa.string()),
                           ("url", pa.string()), ("text", pa.string()), ("reason", pa.string()),
                           ("detail", pa.string())])


@dataclass(frozen=True)
class IngestOptions(Options):
    image_column: str = ""  # tables: the column with an image path or URL (default: the first of image, filepath, file,
                            # path, image_path, url)
    text_column: str = ""  # tables: the column with the alt-text (default: the first of text, caption, captions, title)
    max_pixels: int = images.DEFAULT_MAX_PIXELS  # larger images are rejected (decompression bombs)
    workers: int = 0  # processes reading images (0: all cores)
    batch_rows: int = 50_000  # rows per Parquet row group
    files_per_task: int = 1_000  # distributed: image files of a directory per task (a tar or table is one task)
    layout: Literal["auto", "file", "parts"] = "auto"  # OUT as one file, or a folder of the tasks' parts in task
        # order (no collection on the driver; every stage reads the folder); auto: parts on Spark, else a file


@dataclass
class Record:
    """One candidate pair before its image is read: where the bytes are and the raw alt-text."""

    source: str  # folder | table | webdataset
    path: str
    text: str | None
    member: str | None = None
    url: str | None = None
    data: bytes | None = None  # tar members are read by the main process, files by the worker
    remote: bool = False  # an http(s) URL: not fetched here (img2dataset's job)
    bad: tuple[str, str] | None = None  # (reason, detail): the source itself is broken here (a table row, a tar)
    original: tuple[int, int] | None = None  # (width, height) before img2dataset resized it, from its metadata
















# ---------------------------------------------------------------------------------------------- sources

def file_records(path: Path) -> Iterator[Record]:
    """An image file with its sidecars: a pair per caption of the `.txt` (`tars.captions`: one per line, or one
    alt-text beside img2dataset's `.json`), which may give the url and original size. A FIFO or device named like
    an image is rejected by `examine` (`not_a_file`), and only regular sidecars are read."""
    meta = sidecar_meta(path)
    caption = path.with_suffix(".txt")
    texts = tars.captions(read_caption(caption) if caption.is_file() else None, meta)
    for text in texts or [None]:
        yield Record("folder", str(path), text, url=meta.get("url"), original=original_size(meta))


def original_size(meta: dict) -> tuple[int, int] | None:
    """img2dataset's `original_width` / `original_height` (the size before its resizing), when both are numbers."""
    size = meta.get("original_width"), meta.get("original_height")
    return (int(size[0]), int(size[1])) if all(isinstance(v, (int, float)) and v > 0 for v in size) else None


def folder_records(root: Path) -> Iterator[Record]:
    return (record for path in folder_files(root) for record in file_records(path))


def table_records(path: Path, options: IngestOptions, notes: Counter | None = None) -> Iterator[Record]:
    """A pair per caption of each row of a table (data/tables.py: read as eval and embed read it); an image path
    is relative to the table, an http(s) URL is a `remote_not_fetched` reject, a row that cannot be read a
    `bad_row` one."""
    notes = Counter() if notes is None else notes
    root = path.parent.resolve()
    for row in tables.rows(path, options.image_column, options.text_column, notes):
        if row.bad:
            yield Record("table", str(path), None, bad=("bad_row", row.bad))
            continue
        for text in row.texts or [None]:
            if not row.image:
                yield Record("table", str(path), text, bad=("missing_file", "the row has no image path"))
                continue
            local, remote = tables.location(row.image, root)
            yield Record("table", local or str(path), text, url=remote, remote=remote is not None)


def karpathy_records(path: Path) -> Iterator[Record]:
    """A pair per sentence of every image of a Karpathy split (all splits; images beside the JSON)."""
    for item in karpathy_items(path, path.parent.resolve(), "all"):
        for text in item.texts or [None]:
            yield Record("table", item.path, text)


def tar_records(path: Path) -> Iterator[Record]:
    """Samples of a webdataset tar (read as every shard reader reads them: data/tars.py); a tar cut short
    or unreadable gives one `truncated_tar` / `unreadable_tar` reject."""
    counter: dict = {}
    for sample in tars.tar_samples(str(path), counter):
        key = sample["__key__"]
        try:
            meta = tars.sample_meta(sample)
        except tars.BadSample:
            meta = {}  # only the url and a caption come from it
        texts = tars.captions(sample["txt"].decode("utf-8", "replace") if "txt" in sample else None, meta)
        image_ext = next((e for e in sample if "." + e in IMAGE_SUFFIXES), None)
        for text in texts or [None]:  # a pair per caption: a .txt of several lines holds several
            yield Record("webdataset", str(path), text, member=f"{key}.{image_ext or '*'}", url=meta.get("url"),
                         data=sample[image_ext] if image_ext else b"", original=original_size(meta))
    details = {"truncated_tar": "the tar ends in the middle of a sample", "unreadable_tar": "not a readable tar file"}
    for reason in counter.get("reasons", {}):
        yield Record("webdataset", str(path), None, bad=(reason, details[reason]))


def units(sources: list[str], files_per_unit: int = 0) -> Iterator[tuple]:
    """The sources as units of work, in order: ("tar", path), ("table", path) and, for a directory, ("files",
    [paths]) of up to `files_per_unit` image files each (0: one unit per directory). Paths are absolute."""
    for spec in expanded(sources):
        path = Path(spec)
        if path.is_dir():
            fetched = (path / FETCH_WORK).is_dir()  # `openalign fetch`'s output: its images are in its tars
            if fetched and not (path / FETCH_REPORT).is_file():
                raise ConfigError(f"{spec} is the output of an `openalign fetch` that did not finish (no "
                                  f"{FETCH_REPORT}); run the same fetch again (it keeps the finished shards)")
            if fetched:  # a unit per shard: its tar and its index (the failed downloads), no schema read on the driver
                for tar in sorted(path.glob("*.tar"), key=lambda p: tables.natural(p.name)):
                    index = tar.with_suffix(".parquet")
                    yield ("fetched", [str(tar.resolve()), str(index.resolve()) if index.is_file() else ""])
                continue  # not its report's plot
            parts = table_parts(path)
            if parts:  # a table given as a folder of its parts (Spark's, DuckDB's): a unit per part
                yield from units(parts)
                continue
            # webdataset tars at its top (img2dataset's webdataset output, or any shard folder), img2dataset's
            # parquet output (images in a column) and its status sidecars (the failed downloads), then images
            yield from (("tar", str(t.resolve())) for t in sorted(path.glob("*.tar")))
            for table in sorted(path.glob("*.parquet")):  # img2dataset writes them at its folder's top
                kind = tables.img2dataset_kind(table)
                if kind:
                    yield (kind, str(table.resolve()))
            files = folder_files(path)
            if not files_per_unit:
                yield ("folder", str(path.resolve()))
                continue
            chunk = []
            for file in files:
                chunk.append(str(file))
                if len(chunk) == files_per_unit:
                    yield ("files", chunk)
                    chunk = []
            if chunk:
                yield ("files", chunk)
        elif path.is_file() and path.suffix.lower() == ".tar":
            yield ("tar", str(path.resolve()))
        elif path.is_file() and path.suffix.lower() in TABLE_SUFFIXES:
            kind = tables.kind(path)  # by content, as every reader tells them
            if kind == "pairs":
                raise ConfigError(f"{spec} is already a pair table (from `openalign ingest`); give it to filter, "
                                  "dedup, screen or shard as it is")
            yield ({"rows": "table", "karpathy": "karpathy"}.get(kind) or tables.img2dataset_kind(path),
                   str(path.resolve()))
        elif not path.exists():
            raise ConfigError(f"source {spec} does not exist")
        else:
            raise ConfigError(f"source {spec} is neither a directory, a .tar nor a table "
                              f"({', '.join(sorted(TABLE_SUFFIXES))})")


def expanded(sources: list[str]) -> Iterator[str]:
    """The sources with each glob replaced by what it matches, in natural order; one sentence for a glob that
    matches nothing."""
    import glob

    for spec in sources:
        if not Path(spec).exists() and any(ch in str(spec) for ch in "*?["):
            matches = sorted(glob.glob(str(spec), recursive=True), key=tables.natural)
            if not matches:
                raise ConfigError(f"source {spec} matches no file")
            yield from matches
        else:
            yield spec


def table_parts(folder: Path) -> list[str]:
    """The parts of a table written as a folder (every file a table of one format, beside Spark's _SUCCESS and
    hidden checksums), in natural order; [] for a folder that holds anything else (images, tars, sidecars)."""
    files, suffix = [], None
    for path in folder.rglob("*"):  # the first file of another kind ends the look (an image folder: at once)
        if not path.is_file() or not tables.is_part(path, folder):
            continue
        if path.suffix.lower() not in TABLE_SUFFIXES or path.suffix.lower() == ".json" or suffix not in (
                None, path.suffix.lower()):
            return []
        suffix = path.suffix.lower()
        files.append(str(path))
    return sorted(files, key=tables.natural)


def text_rules_before_download(sources: list[str]) -> list[str]:
    """The text rules' filter reports a fetch's keep-lists name, when every source is the output of such a fetch
    (its `fetch_report.json` says `text_rules`); [] otherwise: a source not filtered so needs the text rules."""
    reports: list[str] = []
    for spec in sources:
        try:
            found = json.loads((Path(spec) / FETCH_REPORT).read_text(encoding="utf-8")).get("text_rules")
        except (OSError, ValueError, AttributeError):
            return []
        if not found or not isinstance(found, list):
            return []
        reports += [str(r) for r in found if str(r) not in reports]
    return reports


def unit_inputs(unit: tuple, options: IngestOptions) -> list[str]:
    """Every file a unit's output depends on, for its task's key (sources_key fingerprints each by size and
    time): a tar; a table and the local images its rows name; image files with their caption and JSON
    sidecars. So an edited caption or a replaced image redoes its own task."""
    kind, where = unit
    if kind in ("tar", "img2dataset", "img2dataset-status"):
        return [where]
    if kind == "fetched":
        return [f for f in where if f]
    if kind in ("table", "karpathy"):
        records = table_records(Path(where), options) if kind == "table" else karpathy_records(Path(where))
        try:
            return [where] + [r.path for r in records if not (r.bad or r.remote)]
        except ConfigError:  # an unreadable table: its task fails with this sentence, the others run
            return [where]
    images = [str(f) for f in folder_files(Path(where))] if kind == "folder" else list(where)
    return [str(f) for image in images for f in (image, Path(image).with_suffix(".txt"),
                                                 Path(image).with_suffix(".json"))]


def img2dataset_records(path: Path, failures_only: bool) -> Iterator[Record]:
    """The rows of an img2dataset Parquet file: each success a pair (its image from the parquet output's column),
    each failed download a reject with img2dataset's own status and message."""
    columns = ["key", "status", "error_message", "caption", "url", "original_width", "original_height"]
    for row in tables.img2dataset_rows(path, columns, images=not failures_only):
        where = dict(member=row["key"], url=row["url"])
        if row["status"] != "success":
            yield Record("img2dataset", str(path), row["caption"], **where,
                         bad=("not_downloaded", f"{row['status']}: {row['error_message']}"))
        elif not failures_only:
            yield Record("img2dataset", str(path), row["caption"], **where, data=row["image"] or b"",
                         original=original_size(row))


def unit_records(unit: tuple, options: IngestOptions, notes: Counter) -> Iterator[Record]:
    kind, where = unit
    if kind in ("img2dataset", "img2dataset-status"):
        return img2dataset_records(Path(where), failures_only=kind == "img2dataset-status")
    if kind == "folder":
        return folder_records(Path(where))
    if kind == "files":
        return (record for f in where for record in file_records(Path(f)))
    if kind == "tar":
        return tar_records(Path(where))
    if kind == "fetched":  # a fetch shard: its samples, then the URLs it could not fetch
        tar, index = where
        failed = img2dataset_records(Path(index), failures_only=True) if index else iter(())
        return itertools.chain(tar_records(Path(tar)), failed)
    if kind == "karpathy":
        return karpathy_records(Path(where))
    return table_records(Path(where), options, notes)


def records(sources: list[str], options: IngestOptions, notes: Counter | None = None) -> Iterator[Record]:
    notes = Counter() if notes is None else notes
    for unit in units(sources):
        yield from unit_records(unit, options, notes)


# ---------------------------------------------------------------------------------------------- workers

def examine(item: tuple[Record, int]) -> tuple[str, dict]:
    """('pair', row) or ('reject', row) for one record; runs in a worker process."""
    record, max_pixels = item
    text = normalize_text(record.text)
    where = {"source": record.source, "path": record.path, "member": record.member, "url": record.url}
    if record.bad:
        return "reject", where | {"text": text, "reason": record.bad[0], "detail": record.bad[1]}
    if record.remote:
        return "reject", where | {"text": text, "reason": "remote_not_fetched", "detail": record.url}
    data = record.data
    if data is None:
        if Path(record.path).exists() and not Path(record.path).is_file():  # a FIFO would block the read forever
            return "reject", where | {"text": text, "reason": "not_a_file", "detail": "not a regular file"}
        try:
            data = Path(record.path).read_bytes()
        except OSError as err:
            return "reject", where | {"text": text, "reason": "missing_file", "detail": str(err)}
    if not text:
        return "reject", where | {"text": text, "reason": "no_text", "detail": "no alt-text (sidecar .txt or column)"}
    try:
        info = images.probe(data, max_pixels)
    except images.BadImage as err:
        return "reject", where | {"text": text, "reason": err.reason, "detail": str(err)}
    key = blake(data)
    original = record.original or (None, None)
    return "pair", {"uid": pair_uid(key, text), "image_key": key, "text": text, "width": info.width,
                    "height": info.height, "bytes": len(data), "format": info.format, "mode": info.mode,
                    "conversions": ",".join(info.conversions), "original_width": original[0],
                    "original_height": original[1]} | where


class Tally:
    """What a run (or one task of it) saw: pairs and rejects by reason, conversions, the first examples."""

    def __init__(self):
        self.counts, self.conversions, self.examples = Counter(), Counter(), {}

    def add(self, kind: str, row: dict) -> None:
        if kind == "pair":
            self.counts["pairs"] += 1
            self.conversions.update(c for c in row["conversions"].split(",") if c)
            return
        self.counts[row["reason"]] += 1
        examples = self.examples.setdefault(row["reason"], [])
        if len(examples) < 3:
            examples.append(row["member"] or row["path"])

    def merge(self, summary: dict) -> None:
        self.counts.update(summary["counts"])
        self.conversions.update(summary["conversions"])
        for reason, examples in summary["examples"].items():
            mine = self.examples.setdefault(reason, [])
            mine.extend(examples[:3 - len(mine)])

    def summary(self) -> dict:
        return {"counts": dict(self.counts), "conversions": dict(self.conversions), "examples": self.examples}


class TableWriter:
    """Pairs and rejects into two Parquet files, written under temporary names and renamed on `close`."""

    def __init__(self, pairs_path: Path, rejects_path: Path, batch_rows: int):
        self.paths = {"pair": Path(pairs_path), "reject": Path(rejects_path)}
        self.tmp = {k: p.with_name(p.name + ".tmp") for k, p in self.paths.items()}
        self.schemas = {"pair": PAIR_SCHEMA, "reject": REJECT_SCHEMA}
        self.writers = {k: pq.ParquetWriter(self.tmp[k], self.schemas[k]) for k in self.paths}
        self.rows: dict[str, list] = {"pair": [], "reject": []}
        self.batch_rows = batch_rows

    def add(self, kind: str, row: dict) -> None:
        self.rows[kind].append(row)
        if len(self.rows[kind]) >= self.batch_rows:
            self._flush(kind)

    def _flush(self, kind: str) -> None:
        if self.rows[kind]:
            self.writers[kind].write_table(pa.Table.from_pylist(self.rows[kind], self.schemas[kind]))
            self.rows[kind].clear()

    def close(self, commit: bool = True) -> None:
        """commit: the two tables replace their final names; otherwise their temporary files are removed."""
        for kind, writer in self.writers.items():
            if commit:
                self._flush(kind)
            writer.close()
            if commit:
                place(self.tmp[kind], self.paths[kind])
            else:
                self.tmp[kind].unlink(missing_ok=True)


def ingest_unit(unit: tuple, pairs_path: str, rejects_path: str, options: IngestOptions) -> dict:
    """One task of a distributed ingest: the pairs and rejects of one unit -> its two part files."""
    tally, notes = Tally(), Counter()
    writer = TableWriter(Path(pairs_path), Path(rejects_path), options.batch_rows)
    try:
        for record in unit_records(unit, options, notes):
            kind, row = examine((record, options.max_pixels))
            writer.add(kind, row)
            tally.add(kind, row)
    except BaseException:
        writer.close(commit=False)
        raise
    writer.close()
    return tally.summary() | {"notes": dict(notes)}


@dataclass(frozen=True)
class IngestResult:
    """What `ingest` wrote and counted (its manifest, OUT.manifest.json, holds the same and more)."""

    table: Path  # the pair table
    pairs: int  # its rows: (image, text) pairs
    images: int  # distinct images among them
    rejected: dict[str, int]  # samples not ingested, by reason; each one is listed in `rejects`
    conversions: dict[str, int]  # images kept after a conversion, by kind (e.g. a CMYK JPEG made RGB)
    repaired: dict[str, int]  # rows read with a repair, by kind (e.g. bytes that are not UTF-8)
    rejects: Path  # OUT.rejects.parquet
    resumed_tasks: int  # tasks a rerun did not redo (their inputs unchanged)
    seconds: float
    manifest: dict  # the manifest as written


class Ingest(Stage):
    """Sources (folders, tars, tables, img2dataset's and fetch's outputs) -> the pair table OUT and its rejects. The
    local engine streams every record in order through a pool of `workers` processes; with many tars or tables,
    and on Spark, one job per unit (a tar, a table, `files_per_task` images of a folder, a fetch shard) writes its
    parts: in OUT.parts/, then concatenated in job order into the file OUT, or (`layout` parts, Spark's default) as
    OUT's own parts (both engines give the same rows)."""

    name = "ingest"
    options = IngestOptions
    result = IngestResult
    reads_pairs = False
    keeps = False
    output_file = True
    work = ".parts"
    record_field = "manifest"

    def __init__(self, sources: list[str]):
        self.sources = sources
        self.tally, self.notes = Tally(), Counter()  # notes: rows read with repairs (not UTF-8 -> U+FFFD)
        self.jobs: list[Job] = []

    def engine(self, options: IngestOptions, engine: Engine) -> Engine:
        return engine  # `plan` chooses between streaming and jobs

    def check(self, run: Run) -> None:
        if not self.sources:
            raise ConfigError("give at least one source: a directory, a .tar or a table")
        if run.out.suffix != ".parquet":
            raise ConfigError(f"--out must end in .parquet, not {run.out.name}")
        for _ in units(self.sources):  # every source exists and is of a known kind, before anything is written
            pass

    def plan(self, run: Run) -> list[Job]:
        options, engine = run.options, run.engine
        workers = options.workers or os.cpu_count() or 1
        self.parts = options.layout == "parts" or (options.layout == "auto" and engine.name == "spark")
        if engine.name == "local" and not self.parts and not (workers > 1 and _enough_units(self.sources, options,
                                                                                              workers)):
            return []  # streamed, in `merge`
        if engine.name == "local":
            # many tars or tables: a worker per unit reads its own bytes (records would ship every image through a
            # pipe to the pool, which costs what the work does); the same tasks and merge as on Spark
            run.engine = Engine("local", workers=workers, retries=engine.retries, memory=engine.memory)
        run.work.mkdir(exist_ok=True)
        found = list(units(self.sources, options.files_per_task))
        if self.parts:  # the tasks write OUT's parts themselves; their statuses stay for a rerun
            self.keeps_work = True
            folders = (run.out, run.out.with_suffix(".rejects.parquet"))
            for folder in folders:
                if folder.is_file():
                    folder.unlink()  # a file-layout run's table
                folder.mkdir(exist_ok=True)
            names = {f"part-{job_id(i)}.parquet" for i in range(len(found))}
            for folder in folders:  # parts of an earlier, larger plan: only our own names
                for stale in folder.glob("part-*.parquet"):
                    if stale.name not in names:
                        stale.unlink()
            targets = [tuple(str(f / f"part-{job_id(i)}.parquet") for f in folders) for i in range(len(found))]
        else:
            targets = [(str(run.work / f"pairs-{job_id(i)}.parquet"), str(run.work / f"rejects-{job_id(i)}.parquet"))
                       for i in range(len(found))]
        self.jobs = [Job(job_id(i), ingest_unit, (unit, *targets[i], options),
                         key=sources_key(unit_inputs(unit, options), asdict(options) | {"workers": 0}),
                         outputs=targets[i])
                     for i, unit in enumerate(found)]
        return self.jobs

    def merge(self, run: Run, results: dict[str, dict]) -> Manifest:
        out, rejects = run.out, run.out.with_suffix(".rejects.parquet")
        if self.jobs:
            for job in self.jobs:
                self.tally.merge(results[job.id])
                self.notes.update(results[job.id]["notes"])
            found(self.tally, self.sources)
            if not self.parts:
                _concatenate(self.jobs, out, rejects, run.work)
        else:
            for folder in (out, rejects):
                if folder.is_dir():  # a parts-layout run's
                    shutil.rmtree(folder)
            _ingest_local(self.sources, out, rejects, run.options, self.tally, self.notes, run.progress)
        distinct = _distinct(out, run)
        counts, tally = self.tally.counts, self.tally
        return Manifest({
            "stage": "ingest", "sources": [str(s) for s in self.sources], "options": asdict(run.options),
            "out": str(out), "engine": run.engine.name, "resumed_tasks": run.resumed, "rejects": str(rejects),
            "pairs": counts["pairs"], "distinct_pairs": distinct[0], "images": distinct[1],
            "rejected": {r: counts[r] for r in (*images.REJECT_REASONS, *TEXT_REJECTS) if counts[r]},
            "reject_examples": tally.examples,
            "conversions": {c: tally.conversions[c] for c in images.CONVERSIONS if tally.conversions[c]},
            "text_normalization": "runs of whitespace collapsed to one space; case and characters kept; bytes that "
                                  "are not UTF-8 become U+FFFD",
            "repaired": dict(self.notes),
            # the filter reports of the text rules that ran on every source's candidates before the download (fetch
            # --keep): `filter --rules auto` then runs the image rules alone
            "text_rules": text_rules_before_download(self.sources),
        })

    def result_fields(self, run: Run, report: Manifest) -> dict:
        return {"table": run.out, "rejects": run.out.with_suffix(".rejects.parquet")}


def ingest(sources: list[str], out: Path, options: IngestOptions = IngestOptions(), progress: bool = True,
           engine: Engine = Engine()) -> IngestResult:
    """Write OUT (pairs), OUT.rejects.parquet and OUT.manifest.json; returns what was written and counted.

    The local engine reads every source in order, the images in `workers` processes. The Spark engine runs one
    task per tar, table file, fetch shard or `files_per_task` images of a directory; each writes its own part files
    (OUT as a folder of them: `options.layout`) and its status under OUT.parts/, and reruns skip finished tasks
    (both engines give the same rows)."""
    return run_stage(Ingest(listed(sources, "sources")), None, out, options, progress, engine)


def _enough_units(sources: list[str], options: IngestOptions, workers: int) -> bool:
    """Whether the sources hold at least two units of work (tars, tables) per worker, without listing folders."""
    files = [s for s in sources if Path(s).is_file()]
    return len(files) == len(sources) and len(files) >= 2 * workers


def _ingest_local(sources, out, rejects_path, options, tally, notes, progress) -> None:
    writer = TableWriter(out, rejects_path, options.batch_rows)
    workers = options.workers or os.cpu_count() or 1
    items = ((record, options.max_pixels) for record in records(sources, options, notes))
    pool = process_pool(workers) if workers > 1 else None
    try:
        results = pool.imap(examine, items, chunksize=16) if pool else map(examine, items)
        for kind, row in tqdm(results, desc="ingest", unit="pair", disable=not progress):
            writer.add(kind, row)
            tally.add(kind, row)
        found(tally, sources)
    except BaseException:  # an error or Ctrl-C: nothing appears under --out (the tables stay as they were)
        writer.close(commit=False)
        raise
    finally:
        if pool:
            pool.terminate()
    writer.close()


def found(tally: Tally, sources: list[str]) -> None:
    """A run that saw no candidate pair at all (not even a reject) is a wrong source, not an empty corpus."""
    if not sum(tally.counts.values()):
        raise ConfigError(f"found no images in {', '.join(map(str, sources))}; give folders of images with .txt "
                          "captions, webdataset .tar files, img2dataset's output folder, or a table of image paths "
                          "and texts")


def _concatenate(jobs: list[Job], out: Path, rejects_path: Path, parts: Path) -> None:
    """The jobs' part files concatenated into OUT and its rejects in job order (the file layout: one thread on the
    driver, a row group at a time; the parts layout skips it)."""
    for kind, target, schema in (("pairs", out, PAIR_SCHEMA), ("rejects", rejects_path, REJECT_SCHEMA)):
        if target.is_dir():  # a parts-layout run's folder
            shutil.rmtree(target)
        with staged(target) as tmp, pq.ParquetWriter(tmp, schema) as writer:  # in job order, a row group at a time
            for job in jobs:
                part = pq.ParquetFile(parts / f"{kind}-{job.id}.parquet")
                for group in range(part.num_row_groups):
                    writer.write_table(part.read_row_group(group))


def _distinct(out: Path, run: Run) -> tuple[int, int]:
    """(distinct uids, distinct images) of the pair table OUT (a file or a folder of parts): a Spark job on Spark,
    else DuckDB on the driver (out of core)."""
    source = parts_glob(out) if out.is_dir() else str(out)
    if run.engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_session(run.engine.master, retries=run.engine.retries, memory=run.engine.memory)
        row = spark.read.parquet(str(out)).agg(F.countDistinct("uid"), F.countDistinct("image_key")).first()
        return int(row[0]), int(row[1])
    with driver_duckdb(run.engine, run.work) as con:
        return distinct_counts(con, source)
