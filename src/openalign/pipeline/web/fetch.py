"""Fetch: candidate (image URL, alt-text) pairs -> their images, politely and safely, in img2dataset's layout.

    openalign fetch CANDIDATES [--keep DIR ...] --out DIR [--contact you@example.org]

CANDIDATES is `extract`'s candidates.parquet (or its folder) or any URL table (Parquet, CSV, TSV, JSONL) with a url
column (`url`, `image_url`, `img_url`) and an alt-text column (`text`, `caption`, `alt`, `alt_text`, `title`), given
as a file, a directory of its parts (Spark's `part-*.parquet`, DuckDB's partitions) or a glob (data/tables.py's
`dataset`); each `--keep` a keep-list of it (`openalign filter CANDIDATES --rules text`): only the pairs in every one
are fetched.

The output is img2dataset's `webdataset` output, so `openalign ingest DIR` (and anything that reads img2dataset's
output) reads it: per shard `NNNNN.tar` (`KEY.<ext>` as fetched, `KEY.txt`, `KEY.json`), `NNNNN.parquet` (a row per
URL: key, url, caption, status, error_message, width, height, original_width, original_height, sha256, and the
candidate's uid, language and host) and `NNNNN_stats.json`. `status` is `success` or the one error kind the URL
ended with (`timeout`, `http_404`, `robots_disallowed`, `opted_out`, `too_large`, `not_an_image`,
`private_address`, `dns`, `tls`, `connection`, ...: ERROR_KINDS), `error_message` the detail; every URL gets a row.
`fetch_report.json` and `fetch_report.png` (success per host and per error kind) are written last: the output is
finished when they appear.

How the HTTP side behaves (robots.txt, X-Robots-Tag, per-host limits, Retry-After, private addresses, redirects,
size limits) is pipeline/web/fetch_http.py's docstring. Images are kept as fetched unless `--max-side` asks for a
smaller longest side (then resized and re-encoded in their own format); their original size is always recorded;
`data/images.probe` decides what is an image (its pixel limit stops decompression bombs).

OUT is new, empty, or an earlier fetch's (it holds `_fetch/`); another folder is refused. One run writes it at a time
(the output's lock, taken by `fetch()` itself), and a rerun removes only the shard files an earlier run recorded
(`_fetch/written.json`, the task statuses), never a file it did not write.

Plan and resume: the plan puts each origin (scheme, host, port) whole into one shard, `md5(origin) % shards` with
shards = rows / `--shard-size`, so robots.txt is asked once per origin and a host's limits hold across the run; it is
written as one part per shard (OUT/_fetch/plan/shard=N/), so a task reads only its own rows (fetch_plan.py: the local
engine plans with DuckDB out of core, two scans of the candidates, and tasks that number each shard's rows; the Spark
engine with a task per input file and Spark jobs). A shard is one task of the engine (local processes or Spark); its
key is a digest of its rows (in their order) and the options, so a rerun after kill -9 keeps the finished shards and
redoes the rest, and a changed candidate part or keep-list redoes only the shards whose rows changed. A URL table
without a uid column gets a pair table's uids in the tasks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.parquet as pq

from openalign import plots
from openalign.config import NON_NEGATIVE, POSITIVE, POSITIVE_INT, ConfigError, Options, listed
from openalign.sizes import SIZE, parse_size
from openalign.data import images
from openalign.data.engine import Engine, Job, read_plan, recorded_names
from openalign.data.pairs import FETCH_REPORT, FETCH_WORK
from openalign.data.tars import TarWriter
from openalign.outputs import leftovers, staged, staged_dir, write_json
from openalign.pipeline.runner import Manifest, Run, Stage, run_stage
from openalign.pipeline.web.fetch_plan import candidate_table, plan_urls

__all__ = ["ERROR_KINDS", "FETCH_REPORT", "FetchOptions", "FetchResult", "fetch"]

WORK = FETCH_WORK
ERROR_KINDS = ("timeout", "connection", "dns", "tls", "private_address", "bad_url", "too_many_redirects",
               "robots_disallowed", "robots_unreachable", "crawl_delay_too_long", "opted_out", "too_large",
               "not_an_image", "truncated", "too_many_pixels",
               "host_unresponsive")  # and http_<code> for each status code
DECODE_KINDS = ("not_an_image", "truncated", "too_many_pixels")  # img2dataset's failed_to_resize
SCHEMA = pa.schema([
    ("key", pa.string()), ("url", pa.string()), ("caption", pa.string()), ("status", pa.string()),
    ("error_message", pa.string()), ("width", pa.int32()), ("height", pa.int32()), ("original_width", pa.int32()),
    ("original_height", pa.int32()), ("sha256", pa.string()), ("uid", pa.string()), ("language", pa.string()),
    ("host", pa.string()),
])
SHARD_FILES = (".tar", ".parquet", "_stats.json")  # img2dataset's files of one shard, NNNNN + each

@dataclass(frozen=True)
class FetchOptions(Options):
    contact: str = ""  # how a site owner reaches you (an e-mail or URL); put in the User-Agent
    connections: Annotated[int, POSITIVE_INT] = 64  # requests in flight per process (img2dataset's --thread_count)
    per_host: Annotated[int, POSITIVE_INT] = 4  # connections to one host (scheme, name, port) at a time
    min_interval: Annotated[float, NON_NEGATIVE] = 0.0  # seconds between request starts on one host (a
        # robots.txt Crawl-delay raises it)
    max_crawl_delay: Annotated[float, NON_NEGATIVE] = 30.0  # a host whose robots.txt asks more is not fetched
    robots: bool = True  # honour robots.txt (--no-robots: only for your own hosts)
    opt_out: tuple[str, ...] = ("noai", "noimageai", "noindex", "noimageindex")  # X-Robots-Tag directives that
        # forbid the use, repeatable (img2dataset's default set); --opt-out none: read no X-Robots-Tag
    allow_private_addresses: bool = False  # fetch from loopback, private and link-local addresses (tests, intranets)
    allow_network: tuple[str, ...] = ()  # a network fetched from although private, e.g. 10.1.0.0/16 (repeatable)
    http_retries: Annotated[int, NON_NEGATIVE] = 2  # times a transient failure (timeout, 5xx, 429) is asked again
    max_host_failures: Annotated[int, NON_NEGATIVE] = 10  # a host's URLs that fail in a row (timeouts, refused
        # connections, 5xx; each after its retries) before its other URLs are skipped as host_unresponsive; 0: never
    max_retry_after: Annotated[float, NON_NEGATIVE] = 60.0  # longest Retry-After waited for, in seconds
    robots_retry_delay: Annotated[float, NON_NEGATIVE] = 2.0  # seconds before a robots.txt that failed (5xx, a
        # timeout) is asked again, then twice that; unanswered, its host is not fetched
    max_redirects: Annotated[int, NON_NEGATIVE] = 5  # redirects followed, each hop checked as the first request
    connect_timeout: Annotated[float, POSITIVE] = 10.0  # seconds to connect (TLS included)
    read_timeout: Annotated[float, POSITIVE] = 20.0  # seconds without a byte
    timeout: Annotated[float, POSITIVE] = 60.0  # seconds for a whole request, body included
    max_bytes: Annotated[str, SIZE] = "20M"  # a larger image is too_large (counted while reading)
    max_pixels: Annotated[int, POSITIVE_INT] = images.DEFAULT_MAX_PIXELS  # a larger image is too_many_pixels
    max_side: Annotated[int, NON_NEGATIVE] = 0  # resize (and re-encode) images whose longest side is larger; 0: as
        # fetched
    shard_size: Annotated[int, POSITIVE_INT] = 10_000  # URLs per shard, on average (a host is never split)

    def cross_field_problems(self) -> list[str]:
        from openalign.pipeline.web.fetch_http import check_network

        problems = []
        for network in self.allow_network:
            try:
                check_network(network)
            except ValueError as err:
                problems.append(str(err))
        return problems

    def policy(self):
        from importlib.metadata import PackageNotFoundError, version as installed

        from openalign.pipeline.web.fetch_http import Policy

        try:
            version = installed("openalign")
        except PackageNotFoundError:
            version = "dev"

        contact = f"; {self.contact}" if self.contact else ""
        agent = f"openalign/{version} (+https://github.com/openalign/openalign; image-text research{contact})"
        directives = tuple(d for d in self.opt_out if d.strip().lower() not in ("", "none"))
        return Policy(user_agent=agent, per_host=self.per_host, min_interval=self.min_interval,
                      max_crawl_delay=self.max_crawl_delay, connections=self.connections, retries=self.http_retries,
                      max_retry_after=self.max_retry_after, robots=self.robots, opt_out=directives,
                      allow_private_addresses=self.allow_private_addresses, allow_networks=self.allow_network,
                      max_redirects=self.max_redirects, max_bytes=parse_size(self.max_bytes),
                      connect_timeout=self.connect_timeout, read_timeout=self.read_timeout,
                      total_timeout=self.timeout, max_host_failures=self.max_host_failures,
                      robots_retry_delay=self.robots_retry_delay)


@dataclass
class FetchResult:
    out: Path
    urls: int
    successes: int
    shards: int
    skipped: int  # shards finished by an earlier run
    kinds: dict[str, int]  # status -> URLs
    hosts: int
    seconds: float
    report: Path
    figure: Path | None = None


# ---------------------------------------------------------------------------------------------- planning

def shard_names(shards: int, largest: int, shard_size: int) -> tuple[int, int]:
    """(digits of a shard's number, digits of a sample's index in it): img2dataset's key is their concatenation."""
    return max(5, len(str(shards - 1))), max(math.ceil(math.log10(max(shard_size, 2))), len(str(max(largest - 1, 0))))


# ---------------------------------------------------------------------------------------------- a shard

def store(body: bytes, options: FetchOptions) -> dict:
    """The image to keep from fetched bytes: as fetched unless it is larger than --max-side (then resized and
    re-encoded in its own format), or in a format ingest does not read (then PNG); or BadImage."""
    info = images.probe(body, options.max_pixels)
    ext = images.EXTENSIONS.get(info.format)
    original = (info.width, info.height)
    if ext and not (options.max_side and max(original) > options.max_side):
        return {"data": body, "ext": ext, "size": original, "original": original}
    import io
    import warnings

    from PIL import Image, ImageOps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image = ImageOps.exif_transpose(images.open_image(body, options.max_pixels))
        if options.max_side and max(original) > options.max_side:
            image.thumbnail((options.max_side, options.max_side), Image.Resampling.LANCZOS)
    fmt = info.format if ext else "PNG"
    if fmt in ("JPEG", "MPO") and image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, "JPEG" if fmt == "MPO" else fmt, **({"quality": 95} if fmt in ("JPEG", "MPO", "WEBP") else {}))
    return {"data": buffer.getvalue(), "ext": ext or "png", "size": image.size, "original": original}


def fetch_shard(plan_path: str, shard: int, out: str, digits: tuple[int, int], options: FetchOptions) -> dict:
    """One shard's URLs fetched and written as img2dataset writes a webdataset shard (NAME.tar, its index
    NAME.parquet and NAME_stats.json); returns its counts."""
    start = time.time()
    name, out = f"{shard:0{digits[0]}d}", Path(out)
    by_url = urls_of(with_uids(read_plan(plan_path, shard, column="shard")))
    with staged(out / f"{name}.tar") as tar_path:  # the tar is in place only with its index beside it
        with TarWriter(tar_path) as tar:
            shard_out = ShardWriter(tar, by_url, name, digits[1], options)
            robots, requests = asyncio.run(fetch_all(list(by_url), options, shard_out.emit))
        write_index(out / f"{name}.parquet", shard_out.records)
    write_json(out / f"{name}_stats.json", shard_stats(shard_out.records, shard_out.kinds, start))
    return {"count": len(shard_out.records), "kinds": dict(shard_out.kinds), "hosts": shard_out.hosts,
            "bytes": shard_out.bytes, "distinct_urls": len(by_url), "requests": requests, "robots": robots,
            "seconds": time.time() - start}


def with_uids(rows: list[dict]) -> list[dict]:
    """The plan's rows, each with its uid: a URL table made elsewhere has none, and gets the uid a pair table gives
    (url's image_key, text), here in its task, not row by row on the driver."""
    missing = [row for row in rows if row["uid"] is None]
    if missing:
        from openalign.data.pairs import normalize_text, pair_uids, url_keys

        uids = pair_uids(url_keys([row["url"] for row in missing]),
                         [normalize_text(row["text"] or "") for row in missing])
        for row, uid in zip(missing, uids):
            row["uid"] = uid
    return rows


def urls_of(rows: list[dict]) -> dict[str, list[dict]]:
    """The plan's rows by URL, in plan order: a URL that several candidates share is fetched once."""
    by_url: dict[str, list[dict]] = {}
    for row in rows:
        by_url.setdefault(row["url"], []).append(row)
    return by_url


class ShardWriter:
    """What one shard writes as its URLs come back: each of the URL's rows as an index record, and a fetched image
    as a sample of the tar (img2dataset's keys: the shard's number, then the row's index)."""

    def __init__(self, tar: TarWriter, by_url: dict[str, list[dict]], name: str, index_digits: int,
                 options: FetchOptions):
        self.tar, self.by_url, self.name, self.index_digits, self.options = tar, by_url, name, index_digits, options
        self.records: list[dict] = []
        self.kinds: Counter = Counter()
        self.hosts: dict[str, list[int]] = {}  # origin -> [successes, URLs]
        self.bytes = 0

    def emit(self, url: str, fetched) -> None:
        kind, detail, kept = outcome(fetched, self.options)
        for row in self.by_url[url]:
            record = index_record(f"{self.name}{row['idx']:0{self.index_digits}d}", url, row, kind, detail)
            if kept is not None:
                record.update(width=kept["size"][0], height=kept["size"][1], original_width=kept["original"][0],
                              original_height=kept["original"][1], sha256=hashlib.sha256(fetched.body).hexdigest())
                self.tar.write({"__key__": record["key"], kept["ext"]: kept["data"], "txt": row["text"] or "",
                                "json": json.dumps(record, indent=4).encode()})
                self.bytes += len(kept["data"])
            self.records.append(record)
            self.kinds[kind] += 1
            host = self.hosts.setdefault(origin_key(url), [0, 0])
            host[0] += kind == "success"
            host[1] += 1


def outcome(fetched, options: FetchOptions) -> tuple[str, str | None, dict | None]:
    """(status, error detail, the image as stored or None) of one fetched URL: a body that is no image it can store
    is a decode failure."""
    if fetched.kind != "success":
        return fetched.kind, fetched.detail, None
    try:
        return "success", fetched.detail, store(fetched.body, options)
    except images.BadImage as err:
        return ("not_an_image" if err.reason in ("empty", "unreadable") else err.reason), str(err)[:300], None


def index_record(key: str, url: str, row: dict, kind: str, detail: str | None) -> dict:
    """A row of the shard's index (img2dataset's columns and openalign's uid, language and host), before any image
    fields; a failure's message, or None."""
    error = (detail or None) if kind != "success" else None
    return {"key": key, "url": url, "caption": row["text"], "status": kind, "error_message": error, "width": None,
            "height": None, "original_width": None, "original_height": None, "sha256": None, "uid": row["uid"],
            "language": row["language"], "host": row["host"]}


def write_index(path: Path, records: list[dict]) -> None:
    """The shard's index, NAME.parquet, in key order."""
    with staged(path) as tmp:
        pq.write_table(pa.Table.from_pylist(sorted(records, key=lambda r: r["key"]), SCHEMA), tmp)


def shard_stats(records: list[dict], kinds: Counter, start: float) -> dict:
    """NAME_stats.json as img2dataset writes it."""
    failed_decode = sum(kinds[k] for k in DECODE_KINDS)
    return {"count": len(records), "successes": kinds["success"],
            "failed_to_download": len(records) - kinds["success"] - failed_decode, "failed_to_resize": failed_decode,
            "duration": time.time() - start, "start_time": start, "end_time": time.time(),
            "status_dict": dict(kinds.most_common())}


def origin_key(url: str) -> str:
    from openalign.pipeline.web.fetch_http import origin_of

    try:
        return origin_of(url)
    except ValueError:
        return ""


async def fetch_all(urls: list[str], options: FetchOptions, emit) -> tuple[dict, int]:
    """Fetches distinct URLs, each origin's by `per_host` workers of its own; `emit(url, Fetched)` as each ends.
    Returns how each origin's robots.txt answered (counts) and the requests made."""
    from openalign.pipeline.web.fetch_http import Client

    client = Client(options.policy())
    queues: dict[str, deque] = {}
    for url in urls:
        queues.setdefault(origin_key(url), deque()).append(url)

    async def worker(queue: deque) -> None:
        while queue:
            url = queue.popleft()
            emit(url, await client.fetch(url))

    try:
        await asyncio.gather(*(worker(q) for q in queues.values() for _ in range(min(options.per_host, len(q)))))
    finally:
        await client.close()
    return dict(Counter(client.robots_status.values())), sum(o.requests for o in client.origins.values())


# ---------------------------------------------------------------------------------------------- the stage

WRITTEN = "written.json"  # in WORK: the names of every shard file a run of fetch may have written into OUT


def written(out: Path) -> set[str]:
    """The shard files fetch may have left in `out`: those its record names (written before its jobs run, so a
    killed job's files are named too) and those its task statuses name. Only these are ever removed."""
    try:
        names = set(json.loads((out / WORK / WRITTEN).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        names = set()
    names |= recorded_names(out / WORK / "status")
    return {n for n in names if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")}


def claim(out: Path, names: set[str]) -> None:
    """Before this run's jobs write `names`: the files of an earlier plan that this one does not have are removed
    (only names fetch itself recorded), and the record then names what this run may write."""
    before = written(out)
    write_json(out / WORK / WRITTEN, sorted(before | names))  # a kill from here on still knows every name
    for name in sorted(before - names):
        (out / name).unlink(missing_ok=True)
    for leftover in leftovers(out, before | names | {FETCH_REPORT, "fetch_report.png"}):  # what a killed run wrote
        leftover.unlink(missing_ok=True)
    write_json(out / WORK / WRITTEN, sorted(names))


def usable_out(out: Path) -> Path:
    """`out` as a folder fetch may write: new, empty, or an earlier fetch's; else one sentence."""
    from openalign.outputs import foreign_files

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the fetched shards")
    foreign = foreign_files(out, (WORK, FETCH_REPORT))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else "")
        raise ConfigError(f"--out {out} already holds files fetch did not write ({shown}); give a new or empty "
                          "folder (fetch writes numbered shards there and replaces its own)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"cannot write {out}: a folder above it is a file; choose another --out") from None
    return out


class Fetch(Stage):
    """A candidate table -> its images in img2dataset's webdataset layout: the URLs planned into shards by their
    origin (DuckDB), one job per shard, the largest first; OUT/_fetch keeps the plan, the statuses and the names
    fetch wrote (a rerun redoes only the shards whose rows or options changed)."""

    name = "fetch"
    options = FetchOptions
    result = FetchResult
    reads_pairs = False
    keeps = False
    report_file = FETCH_REPORT
    record_field = ""  # FetchResult.report is the report's path
    work = WORK
    status = f"{WORK}/status"
    keeps_work = True
    figure_file = "fetch_report.png"
    figure_dpi = 90

    def __init__(self, candidates: Path, keep: tuple[Path, ...] = ()):
        self.candidates, self.keep = candidates, keep

    def check(self, run: Run) -> None:
        self.table = candidate_table(Path(self.candidates))
        usable_out(run.out)

    def plan(self, run: Run) -> list[Job]:
        table, out, options = self.table, run.out, run.options
        run.work.mkdir(exist_ok=True)
        plan_path = run.work / "plan"
        for old in (plan_path, run.work / "plan.parquet"):  # the last plan, an older layout's
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
        with staged_dir(plan_path) as building:  # in place only when whole
            planned, self.left_out, count = plan_urls(run.engine, table, [Path(k) for k in self.keep],
                                                      options.shard_size, building, run.work, run.progress)
        if not planned:
            if self.left_out["not_kept"]:
                raise ConfigError(f"none of the {self.left_out['not_kept']:,} candidates of {table} is in every "
                                  "--keep list; were the keep-lists made from this table (`openalign filter "
                                  f"{table} --rules text`)?")
            rows = self.left_out["no_url"]
            raise ConfigError(f"{table} holds no URL to fetch ({rows:,} row{'s' * (rows != 1)} without one)")
        largest = max((p["rows"] for p in planned), default=0)
        digits = shard_names(count, largest, options.shard_size)
        claim(out, {f"{p['shard']:0{digits[0]}d}{suffix}" for p in planned for suffix in SHARD_FILES})
        settings = json.dumps([asdict(options) | {"shard_size": None}, digits], sort_keys=True, default=str)
        jobs = []
        for p in sorted(planned, key=lambda p: (-p["rows"], p["shard"])):  # the largest first: a shorter tail
            name = f"{p['shard']:0{digits[0]}d}"
            key = hashlib.blake2b(f"{p['digest']}|{settings}".encode(), digest_size=16).hexdigest()
            jobs.append(Job(name, fetch_shard, (str(plan_path), p["shard"], str(out), digits, options), key=key,
                            outputs=tuple(str(out / f"{name}{s}") for s in SHARD_FILES)))
        return jobs

    def merge(self, run: Run, results: dict[str, dict]) -> Manifest:
        kinds, hosts, robots = Counter(), {}, Counter()
        for result in results.values():
            kinds.update(result["kinds"])
            robots.update(result.get("robots", {}))
            for host, (ok, total) in result["hosts"].items():
                seen = hosts.setdefault(host, [0, 0])
                seen[0] += ok
                seen[1] += total
        urls = sum(kinds.values())
        by_host = sorted(hosts.items(), key=lambda kv: (-kv[1][1], kv[0]))
        found = list(results.values())
        self.hosts = hosts  # {host: [successes, URLs]}, for the figure
        return Manifest({
            "stage": "fetch", "candidates": str(self.table), "urls": urls, "successes": kinds["success"],
            "success_rate": round(kinds["success"] / urls, 4) if urls else 0.0,
            "statuses": dict(kinds.most_common()), "left_out": dict(self.left_out), "shards": len(found),
            "shards_reused": run.resumed, "distinct_urls": sum(r.get("distinct_urls", 0) for r in found),
            "requests": sum(r.get("requests", 0) for r in found), "bytes": sum(r.get("bytes", 0) for r in found),
            "robots_txt": dict(robots), "hosts": len(hosts),
            "by_host": {h: {"urls": t, "successes": ok, "success_rate": round(ok / t, 4)}
                        for h, (ok, t) in by_host[:200]},
            "task_seconds": round(sum(r.get("seconds", 0.0) for r in found), 2), "options": asdict(run.options),
            "keep": [str(k) for k in self.keep], "text_rules": text_rule_reports(self.keep),
        }, after=("options", "keep", "text_rules"))

    def figure(self, run: Run, report: Manifest):
        return report_figure(report.fields, self.hosts)

    def result_fields(self, run: Run, report: Manifest) -> dict:
        return {"out": run.out, "skipped": report.shards_reused, "kinds": report.statuses,
                "report": run.out / FETCH_REPORT, "figure": run.out / self.figure_file}


def fetch(candidates: Path, out: Path, options: FetchOptions = FetchOptions(), keep: tuple[Path, ...] = (),
          engine: Engine = Engine(), progress: bool = True) -> FetchResult:
    """Fetches the images of a candidate table into `out` (img2dataset's webdataset layout); see the module's
    docstring."""
    return run_stage(Fetch(candidates, tuple(listed(keep, "keep"))), None, out, options, progress, engine)


def text_rule_reports(keep) -> list[str]:
    """The filter reports among the keep-lists whose text rules ran (--rules text, all or auto on the candidates):
    ingest carries them into the pair table's manifest, and the filter does not run those rules again."""
    from openalign.data.pairs import KEEP_REPORTS

    found = []
    for directory in keep:
        report = Path(directory) / KEEP_REPORTS[0]  # filter_report.json
        try:
            rules = json.loads(report.read_text(encoding="utf-8"))["config"]["rules"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if rules in ("text", "all", "auto"):
            found.append(str(report.resolve()))
    return found


def report_figure(report: dict, hosts: dict[str, list[int]]):
    """Two panels: URLs per status, and the hosts' success rates (a histogram, weighted by their URLs)."""
    plt = plots.pyplot()

    statuses = report["statuses"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(statuses)
    left.barh(names[::-1], [statuses[n] for n in names[::-1]],
              color=["tab:green" if n == "success" else "tab:red" for n in names[::-1]])
    left.set_xlabel("URLs")
    left.set_title(f"{report['urls']:,} URLs, {report['success_rate']:.1%} fetched")
    rates = [ok / total for ok, total in hosts.values() if total]
    weights = [total for ok, total in hosts.values() if total]
    right.hist(rates, bins=20, range=(0, 1), weights=weights, color="tab:blue")
    right.set_xlabel("a host's success rate")
    right.set_ylabel("URLs on hosts with that rate")
    right.set_title(f"{len(hosts):,} hosts")
    return fig
