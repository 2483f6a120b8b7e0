"""The pair table and the keep-lists: the files the corpus pipeline's stages hand each other.

    pairs.parquet            one row per usable (image, alt-text) pair (`PAIR_SCHEMA`), written by `openalign ingest`
    pairs.manifest.json      written last by ingest: a table is finished only beside the manifest that counts its rows
    DIR/keep.parquet/        a keep-list: the distinct uids a stage keeps, bucketed by uid hash (`bucket=B/` parts, a
                             power of two of them from its size, `_keep.json` says how many), written by either engine
                             (`write_keep_duckdb`, `write_keep_spark`), beside the stage's report (`KEEP_REPORTS`,
                             written last); a single file or Spark's flat parts, as earlier versions wrote, still read
    keep-index/KEY.parquet   data.keep: the (tar path, sample key) every keep-list keeps, for training on the original
                             tars (`build_keep_index`; read one shard at a time by `KeepIndex`)

A pair's uid is a hash of its image's bytes and its normalized text, so every stage, engine and rerun names a pair
the same way. Every stage reads a pair table through `check_pair_table`, and every keep-list through `keep_source`.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from openalign.config import ConfigError
from openalign.outputs import sources_key, staged, write_json

PAIR_SCHEMA = pa.schema([
    ("uid", pa.string()), ("image_key", pa.string()), ("text", pa.string()), ("width", pa.int32()),
    ("height", pa.int32()), ("bytes", pa.int64()), ("format", pa.string()), ("mode", pa.string()),
    ("conversions", pa.string()), ("source", pa.string()), ("path", pa.string()), ("member", pa.string()),
    ("url", pa.string()),
    # the size before a downloader resized it (img2dataset's original_width/height); null when not recorded
    ("original_width", pa.int32()), ("original_height", pa.int32()),
])


FILTER_COLUMNS = ("uid", "image_key", "text", "width", "height")  # what each stage reads of a pair table
SOURCE_COLUMNS = ("uid", "image_key", "text", "path", "member", "url")
IMAGE_COLUMNS = ("uid", "image_key", "path", "member")


# An image found in several places (web corpora repeat an image under other keys and URLs) is read from one of them:
# its first source by (path, member), every column taken from that one row. Two separate minima, min(path) and
# min(member), named a member of another tar: shard skipped the image as a missing file, dedup never hashed it.
# `place` is the sort key (a path holds no NUL); it also orders the plans of the stages that read every image, so a
# task reads a few neighbouring tars instead of every one (image-key order spread each task over all of them).
def first_source(*columns: str) -> str:
    """DuckDB: the aggregate {place, path, member, *columns} of a group's first source row."""
    fields = "".join(f", '{c}': {c}" for c in ("path", "member", *columns))
    return f"min({{'place': path || chr(0) || coalesce(member, ''){fields}}})"


def spark_first_source(*columns: str):
    """The same aggregate in Spark SQL (both order strings by their UTF-8 bytes)."""
    from pyspark.sql import functions as F

    place = F.concat(F.col("path"), F.lit("\0"), F.coalesce(F.col("member"), F.lit("")))
    return F.min(F.struct(place.alias("place"), "path", "member", *columns))


def check_pair_table(spec, columns: tuple[str, ...] = ()) -> str:
    """A pair table: one Parquet file, a glob of them (`pairs/*.parquet`, one per ingest job), or (Spark)
    a URL such as s3a://bucket/pairs/ that only the cluster can check. A local table must be Parquet and
    hold `columns`; otherwise one sentence says what is wrong."""
    text = str(spec)
    if "://" in text:
        return text
    folder = Path(text) if Path(text).is_dir() else None
    if folder is not None:  # a folder of parts (Spark's, ingest's): read as their glob
        if "path" in columns:
            refuse_candidates(folder)
        text = parts_glob(folder)
    if any(c in text for c in "*?["):
        import glob

        matches = sorted(glob.glob(text))
        if not matches:
            raise ConfigError(f"no pair tables match {text}; build them with `openalign ingest SRC --out FILE.parquet`")
    elif not Path(text).is_file():
        raise ConfigError(f"pair table {text} does not exist; build it with `openalign ingest SRC --out {text}`")
    else:
        matches = [text]
    if "path" in columns:  # a stage that reads the images (dedup, screen, shard)
        refuse_candidates(Path(matches[0]))
    try:
        schema = pq.read_schema(matches[0])
        names = schema.names
    except (OSError, pa.ArrowException):
        raise ConfigError(f"{matches[0]} is not a Parquet pair table; build one with `openalign ingest SRC --out "
                          "pairs.parquet`") from None
    missing = [c for c in columns if c not in names]
    if missing:
        raise ConfigError(f"{matches[0]} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)} (it "
                          f"has {', '.join(names)}); a pair table comes from `openalign ingest`")
    for name in columns:
        wanted = PAIR_SCHEMA.field(name).type if name in PAIR_SCHEMA.names else None
        found = schema.field(name).type
        if wanted is not None and not _same_kind(found, wanted):
            raise ConfigError(f"{matches[0]}'s column {name} holds {found}, not {_kind_name(wanted)} as a pair "
                              "table's does; a pair table comes from `openalign ingest`")
    if "uid" in columns:
        missing_uids = sum(_null_count(Path(m), "uid") for m in matches)  # from the footers' statistics
        if missing_uids:
            raise ConfigError(f"{text} has {missing_uids:,} row{'s' * (missing_uids != 1)} without a uid, and a "
                              "keep-list names pairs by uid; make the table with `openalign ingest` or `openalign "
                              "extract`, which give every pair one")
    for match in [folder] if folder is not None else matches:  # a folder's manifest is beside the folder
        check_finished(Path(match))
    return text


def _null_count(path: Path, column: str) -> int:
    """Nulls in a Parquet column by its row groups' statistics (a file without them: its column read)."""
    meta = pq.ParquetFile(path).metadata
    index = meta.schema.to_arrow_schema().get_field_index(column)
    total = 0
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(index).statistics
        if stats is None or not stats.has_null_count:
            return pq.read_table(path, columns=[column]).column(column).null_count
        total += stats.null_count
    return total


def _same_kind(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column's type reads as the pair table's (any string for a string, any integer for an integer)."""
    for kind in (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t),
                 pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean):
        if kind(wanted):
            return kind(found) or pa.types.is_null(found)
    return True


def _kind_name(kind: pa.DataType) -> str:
    return "text" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else \
        "integers" if pa.types.is_integer(kind) else str(kind)


def refuse_candidates(table: Path) -> None:
    """`openalign extract`'s candidate table holds image URLs, not images: a stage that reads image bytes refuses it
    in one sentence that says how to download them."""
    try:
        written = json.loads(manifest_path(table).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(written, dict) and written.get("stage") == "extract":
        raise ConfigError(f"{table} is a candidate table from `openalign extract`: image URLs, not yet images; "
                          f"download them first (img2dataset --url_list {table} --input_format parquet --url_col url "
                          "--caption_col text --output_folder DIR) and give `openalign ingest DIR`'s pair table")


def manifest_path(table: Path) -> Path:
    return Path(table).with_suffix(".manifest.json")


def check_finished(table: Path) -> None:
    """A pair table is finished when the manifest its ingest writes last is beside it and counts its rows (a
    candidate table: its extract's manifest); a table an interrupted run left (no manifest, or another run's) is
    refused in one sentence."""
    manifest = manifest_path(table)
    try:
        written = json.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{table} has no {manifest.name} beside it, so the ingest that wrote it did not finish (or "
                          f"it was not written by `openalign ingest`); run `openalign ingest SRC --out {table}` "
                          "again") from None
    except (OSError, ValueError):
        raise ConfigError(f"{manifest} is damaged (not JSON); run the stage that wrote {table} again") from None
    stage = written.get("stage") if isinstance(written, dict) else None
    again = (f"run `openalign extract SRC --out {table.parent}` again" if stage == "extract"
             else f"run `openalign ingest SRC --out {table}` again")
    try:
        rows = table_rows(table)
    except (OSError, pa.ArrowException, ConfigError):
        raise ConfigError(f"{table} is not a readable Parquet file (cut short?); {again}") from None
    said = written.get({"extract": "candidates"}.get(stage, "pairs")) if isinstance(written, dict) else None
    if stage not in ("ingest", "extract") or said != rows:
        raise ConfigError(f"{table} holds {rows:,} pairs but {manifest.name} says {said}: the table is not the one "
                          f"that manifest describes (changed, or a rerun was interrupted); {again}")


def table_rows(table: Path) -> int:
    """The rows of a Parquet table, a file or a folder of parts, from the footers."""
    from openalign.data.tables import dataset

    return sum(pq.read_metadata(f).num_rows for f in dataset(table, (".parquet",)).files)


def parts_glob(folder: Path) -> str:
    """A folder of Parquet parts (Spark's `part-*.parquet`, a partitioned write's `KEY=VALUE/`) as the glob that DuckDB
    and Spark both read as one table; one sentence when it holds none."""
    from openalign.data.tables import dataset

    files = dataset(folder, (".parquet",), "a Parquet table").files
    nested = any(Path(f).parent != Path(folder) for f in files)
    return str(Path(folder) / ("*/*.parquet" if nested else "*.parquet"))


def distinct_counts(con, source: str) -> tuple[int, int]:
    """(distinct uids, distinct images) of a pair table (a file or a glob) on a DuckDB connection: each a grouping,
    which spills (`count(DISTINCT ...)` does not: 1M uids ran out of memory under 64 MB, 50M under 512 MB)."""
    found = con.execute("""SELECT (SELECT count(*) FROM (SELECT DISTINCT uid FROM read_parquet($source))),
                                  (SELECT count(*) FROM (SELECT DISTINCT image_key FROM read_parquet($source)))""",
                        {"source": source}).fetchone()
    return int(found[0]), int(found[1])


def normalize_text(text: str | None) -> str:
    return " ".join(text.split()) if text else ""


def blake(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def pair_uid(image_key: str, text: str) -> str:
    return pair_uids([image_key], [text])[0]


def url_keys(urls) -> list[str]:
    """`blake` of each URL's UTF-8 (a lone surrogate kept as its bytes): the image_key of a pair that is not yet
    downloaded; a list at a time, as `pair_uids`, for the stages that hash millions (a call a row costs a third, and
    copying a blank hash a third less than making one)."""
    blank, keys = hashlib.blake2b(digest_size=16), []
    for url in urls:
        hashed = blank.copy()
        try:
            hashed.update(url.encode())
        except UnicodeEncodeError:
            hashed.update(url.encode("utf-8", "surrogatepass"))
        keys.append(hashed.hexdigest())
    return keys


def pair_uids(image_keys, texts) -> list[str]:
    """`pair_uid` of each (image_key, text)."""
    blank, uids = hashlib.blake2b(digest_size=16), []
    for key, text in zip(image_keys, texts):
        hashed = blank.copy()
        hashed.update(f"{key}\t{text}".encode())
        uids.append(hashed.hexdigest())
    return uids


# ---------------------------------------------------------------------------------------------- keep-lists

KEEP_REPORTS = ("filter_report.json", "dedup_report.json", "screen_report.json", "score_report.json",
                "semdedup_report.json", "balance_report.json")  # written last, beside keep.parquet
KEEP_REPORT_SUFFIX = "_report.json"  # any stage's: STAGE_report.json (a stage registered by a plug-in too)
FETCH_REPORT = "fetch_report.json"  # written last into a fetch's output folder (img2dataset's layout + its report)
FETCH_WORK = "_fetch"  # the fetch's plan and task statuses, beside its shards
PAIR_TABLE = "pair_table"  # the field of every keep-list report naming the pair table it was made from


def keep_reports(folder: Path) -> list[Path]:
    """The reports beside a keep-list in `folder` (a stage writes one, last): the built-in stages' names first,
    then any other STAGE_report.json (a stage registered in pipeline/registry.py by a plug-in)."""
    folder = Path(folder)
    known = [folder / name for name in KEEP_REPORTS if (folder / name).is_file()]
    others = sorted(p for p in folder.glob(f"*{KEEP_REPORT_SUFFIX}")
                    if p.name not in KEEP_REPORTS and p.name != FETCH_REPORT and p.is_file())
    return known + others


def write_keep_report(out: Path, name: str, report: dict, pairs: str) -> dict:
    """A keep-list stage's report, written last (the keep-list is finished when it appears), naming its pair table
    under one key for every stage (`pair_table_of` reads it)."""
    assert name.endswith(KEEP_REPORT_SUFFIX) and name != FETCH_REPORT, name
    report = report | {PAIR_TABLE: str(pairs)}
    write_json(Path(out) / name, report)
    return report


# A keep-list is a dataset bucketed by a hash of the uid, the same on DuckDB, Spark and in Python: the first 32 bits of
# md5(uid), modulo a power of two chosen from its size (so a list of B buckets and one of 2B agree bucket by bucket:
# bucket b of the first holds the uids of buckets b and b + B of the second). No part is ever the whole list: a
# stage's tasks write and read it in parallel, and at 1.8B uids it is ~512 parts of ~4M uids, not one 54 GB file.
KEEP_BUCKET_UIDS = 4_000_000  # the uids a bucket holds at most, about (~140 MB of Parquet: hex uids do not compress)
KEEP_LAYOUT = "_keep.json"  # inside a bucketed keep-list: {"buckets", "bucket" (the rule), "uids"}
BUCKET_SQL = {"duckdb": "((('0x' || substr(md5(uid), 1, 8))::UBIGINT) % {buckets})",
              "spark": "pmod(CAST(conv(substr(md5(uid), 1, 8), 16, 10) AS BIGINT), {buckets})"}


def keep_buckets(uids: int) -> int:
    """The buckets of a keep-list of `uids` uids: the power of two that holds at most ~KEEP_BUCKET_UIDS in each."""
    return 1 << max(0, math.ceil(math.log2(max(1, -(-int(uids) // KEEP_BUCKET_UIDS)))))


def uid_bucket(uid: str, buckets: int) -> int:
    """A uid's bucket, as BUCKET_SQL computes it on either engine."""
    return int(hashlib.md5(uid.encode("utf-8", "surrogatepass")).hexdigest()[:8], 16) % buckets


def _clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _finish_keep(path: Path, buckets: int, uids: int) -> None:
    """A bucketed keep-list's layout file; an empty list gets one empty part, so every reader reads it as a table."""
    if uids == 0:
        empty = path / "bucket=0" / "empty.parquet"
        empty.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"uid": pa.array([], pa.string())}), empty)
    write_json(path / KEEP_LAYOUT, {"buckets": buckets, "bucket": BUCKET_SQL["duckdb"].format(buckets=buckets),
                                    "uids": int(uids)})


def write_keep_duckdb(con, query: str, params: list | dict, path: Path) -> int:
    """The keep-list at `path` of the distinct uids of `query` (its `uid` column) on a DuckDB connection: counted,
    then written in buckets (a partitioned write: nothing but the distinct uids, which spill, is held); returns the
    uids. The folder is the list only once its stage's report is written (the runner's `unfinish` before)."""
    path = Path(path)
    _clear(path)
    con.execute(f"CREATE OR REPLACE TEMP TABLE keep_uids AS SELECT DISTINCT uid FROM ({query})", params)
    uids = con.execute("SELECT count(*) FROM keep_uids").fetchone()[0]
    buckets = keep_buckets(uids)
    path.mkdir(parents=True)
    if uids:
        bucket = BUCKET_SQL["duckdb"].format(buckets=buckets)
        con.execute(f"COPY (SELECT uid, {bucket} AS bucket FROM keep_uids) TO '{sql_path(path)}' "
                    "(FORMAT parquet, PARTITION_BY (bucket), OVERWRITE_OR_IGNORE)")
    con.execute("DROP TABLE keep_uids")
    _finish_keep(path, buckets, uids)
    return int(uids)


def write_keep_spark(frame, path: Path) -> int:
    """The same keep-list from a Spark DataFrame with a `uid` column: the distinct uids counted, then shuffled by
    bucket so each bucket is one task's part, sorted, on the executors; returns the uids."""
    from pyspark.sql import functions as F

    path = Path(path)
    _clear(path)
    distinct = frame.select("uid").distinct().persist()
    try:
        uids = distinct.count()
        buckets = keep_buckets(uids)
        if uids:
            (distinct.withColumn("bucket", F.expr(BUCKET_SQL["spark"].format(buckets=buckets)))
             .repartition("bucket").sortWithinPartitions("uid")
             .write.mode("overwrite").partitionBy("bucket").parquet(str(path)))
        else:
            path.mkdir(parents=True)
    finally:
        distinct.unpersist()
    _finish_keep(path, buckets, uids)
    return int(uids)


def keep_layout(path: Path) -> dict | None:
    """A bucketed keep-list's `_keep.json` (None: a single file or flat parts, as earlier versions wrote)."""
    try:
        layout = json.loads((Path(path) / KEEP_LAYOUT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return layout if isinstance(layout, dict) and isinstance(layout.get("buckets"), int) else None


def keep_source(path: Path) -> str:
    """A keep-list written by either engine, as a `read_parquet` argument (a glob DuckDB and Spark both read): a
    bucketed folder's parts, a single file, or Spark's flat part files. `path` may also be the stage's output
    directory. A keep-list is read only beside the report its stage writes last (an interrupted stage leaves
    none)."""
    path = Path(path)
    if path.is_dir() and (path / "keep.parquet").exists():
        path = path / "keep.parquet"
    elif path.is_dir() and not any(path.glob("*.parquet")) and keep_layout(path) is None:  # no stage's output
        raise ConfigError(f"{path} holds no keep-list (keep.parquet); give the output folder of filter, dedup, screen, "
                          "score, semdedup or balance")
    if not path.exists():
        raise ConfigError(f"no keep-list at {path}; run `openalign filter` (or `openalign dedup`) first")
    if not keep_reports(path.parent):
        raise ConfigError(f"{path} has no report of its stage beside it (filter, dedup, screen, score, semdedup or "
                          f"balance), so the stage that wrote it did not finish; run that stage again into "
                          f"{path.parent}")
    return parts_glob(path) if path.is_dir() else str(path)


def read_keep(path: Path) -> list[str]:
    """Sorted uids of a keep-list."""
    import duckdb

    with duckdb.connect() as con:
        rows = con.execute("SELECT uid FROM read_parquet(?) ORDER BY uid", [keep_source(path)]).fetchall()
        return [r[0] for r in rows]


def sql_path(path: Path) -> str:
    """A path inside a single-quoted SQL string."""
    return str(path).replace("'", "''")


def keep_table(con, pairs: Path, keep_dirs: list[Path]) -> None:
    if keep_dirs:
        keep = " INTERSECT ".join("SELECT uid FROM read_parquet(?)" for _ in keep_dirs)  # in SQL: no uid set in Python
        con.execute(f"CREATE TEMP TABLE keep AS {keep}", [keep_source(k) for k in keep_dirs])
    else:  # no keep-list: every pair (an already clean collection)
        con.execute("CREATE TEMP TABLE keep AS SELECT DISTINCT uid FROM read_parquet(?)", [str(pairs)])


def pair_table_of(keep_dir: Path) -> str:
    """The pair table a keep-list directory was made from (its stage's report says, under `pair_table`)."""
    reports = keep_reports(keep_dir)
    if not reports:
        raise ConfigError(f"{keep_dir} holds no report of a keep-list stage; data.keep takes the --out directories of "
                          "`openalign filter`, `dedup`, `screen`, `score`, `semdedup` and `balance`")
    try:
        report = json.loads(reports[0].read_text())
    except ValueError:
        report = None
    if isinstance(report, dict) and isinstance(report.get(PAIR_TABLE), str):
        return report[PAIR_TABLE]
    raise ConfigError(f"{reports[0]} is damaged (not the report its stage writes); run that stage again into "
                      f"{keep_dir}")


def build_keep_index(keep_dirs: list[str], out_dir: Path) -> str:
    """data.keep: the (tar path, sample key) of every kept pair whose image came from a webdataset tar, sorted
    by path, as one Parquet file under `out_dir` named by a fingerprint of its inputs (built once, reused).
    The training loader then reads the original shards and skips what this does not list: the corpus is not
    rewritten, and each reader holds one shard's keys at a time (shards.KeepIndex)."""
    tables = {str(pair_table_of(Path(k))) for k in keep_dirs}
    if len(tables) != 1:
        raise ConfigError(f"the keep-lists {', '.join(keep_dirs)} come from different pair tables "
                          f"({', '.join(sorted(tables))}); give keep-lists of one pair table")
    pairs = tables.pop()
    sources = [keep_source(Path(k)) for k in keep_dirs]
    key = sources_key(pairs, *[str(Path(k).resolve() / "keep.parquet") for k in keep_dirs], *sources)
    out = Path(out_dir) / "keep-index" / f"{key}.parquet"
    if out.is_file():
        return str(out)
    import duckdb

    out.parent.mkdir(parents=True, exist_ok=True)
    with staged(out) as tmp, duckdb.connect() as con:
        keep_table(con, Path(pairs), [Path(k) for k in keep_dirs])
        con.execute(f"""COPY (SELECT DISTINCT p.path, regexp_replace(p.member, '\\.[^.]*$', '') AS key
                              FROM read_parquet(?) p JOIN keep k ON p.uid = k.uid
                              WHERE p.source = 'webdataset' ORDER BY path, key)
                        TO '{str(tmp).replace("'", "''")}' (FORMAT parquet, ROW_GROUP_SIZE 100000)""", [pairs])
    return str(out)


class KeepIndex:
    """Which samples of the original shards the keep-lists keep (`data.keep`; pipeline/shard.py `build_keep_index`
    writes it): a Parquet table of (path, key) sorted by path. A reader loads the keys of one shard at a time
    (row-group statistics skip the rest), so no worker ever holds the corpus-wide set."""

    def __init__(self, path: str):
        self.path = path
        self.shard, self.allowed = None, frozenset()

    def keys(self, shard: str) -> frozenset:
        shard = str(Path(shard).resolve())
        if shard != self.shard:
            table = pq.read_table(self.path, columns=["key"], filters=[("path", "=", shard)])
            self.shard, self.allowed = shard, frozenset(table.column("key").to_pylist())
        return self.allowed


_KEEP_INDEXES: dict[str, KeepIndex] = {}


def open_keep_index(path: str) -> KeepIndex:
    """One KeepIndex per process and path (a DataLoader worker keeps its current shard's keys)."""
    if path not in _KEEP_INDEXES:
        _KEEP_INDEXES[path] = KeepIndex(path)
    return _KEEP_INDEXES[path]
