"""Extract: web pages -> candidate (image URL, alt-text) pairs, before any download (the paper's Section 3 starts here).

    openalign extract SRC... --out DIR

Sources, told by their content (not their names): Common Crawl **WAT** files (`*.warc.wat.gz`: WARC `metadata`
records whose JSON describes each page; see corpora/webpages.py for the layout) and **WARC** files of a crawl (its
HTML `response` records, parsed by selectolax's lexbor back end, chosen by measurement: docs/pipeline.md; see
`warc_candidates` for `data-src`, `srcset` and `<picture>`), each read record by record by FastWARC, never whole;
and **URL tables** made elsewhere (COYO-700M's, LAION's or DataComp's Parquet, a CSV, TSV or JSONL of url and
caption: `table_candidates`), streamed in batches.

The rules are cc2dataset's (`extract_documents_from_wat`, its `image` document type), with these differences:
- **alt-texts**: runs of whitespace become one space and the ends are stripped (cc2dataset keeps the alt as it is);
  an alt that is then empty is dropped (`empty_alt`: cc2dataset keeps an alt of spaces only);
- **empty sources**: an `<img>` without a source is dropped (`empty_src`); cc2dataset resolves "" against the
  page and so pairs the alt with the page's own URL;
- **schemes**: http and https in any case (`HTTP://` too); every other scheme is dropped and counted by name
  (`scheme_data`, `scheme_javascript`, ...);
- **a damaged file**: a record whose JSON does not parse is skipped and counted (`bad_record`); a file whose last
  gzip member is cut short keeps the pairs of its complete records and counts `truncated_record` (cc2dataset's
  stream reader hands on the cut record, which fails to parse); a damaged member mid-file is passed over to the
  next (`damaged_member`), where cc2dataset loses the rest of the file; a record is read under caps, in bounded
  memory and time (extract_records.py; `too_large_record`, `truncated_page`, `too_deep`, `page_images_over_cap`);
- **numbers**: a number that a double or 64 bits cannot hold (`1e999`) does not make a record bad here (simdjson
  refuses the record); the numbers are in fields extract does not read (extract_wat.py);
- **uniqueness**: one row per (url, alt) across the whole output, the first seen kept, in input order; cc2dataset's
  uid is md5(alt + url), so ("ab", "c") and ("a", "bc") collide there; here `uid` is the pair uid of
  (image_key, text) and `image_key` a hash of the url, as a pair table's.

Beyond cc2dataset: each text's language (`language`, `language_score`: data/language.py; `--languages en` keeps
English alone) and, where the language is written without spaces (zh, ja, th), its words (`words`: data/words.py),
which the filter's rules split; `openalign filter DIR/candidates.parquet` runs the text rules before any download.

Output under DIR: `candidates.parquet`, a folder of one part per input file (`part-NNNNNN.parquet`, CANDIDATE_SCHEMA,
each the rows of its file that no earlier file had, in the file's order: read in order, the table is in input
order; every stage, pyarrow and img2dataset read the folder as one table), `candidates.manifest.json` (stage
`extract`, written last: the table is finished), and `parts/` (a part and a status per input file: a rerun skips the
files that are unchanged and redoes the others; both engines run one task per file).

The merge across files (`_merge`) has one global step, a grouping of each row's (uid, place) by uid that finds each
uid's first place (DuckDB on the driver, out of core, or a Spark job), written as the places each file keeps; then a
task per file on the engine writes its part of the table. No row of the table passes through the driver and nothing
is sorted but each file's own rows; at a snapshot (3.8B rows in 64,000 files) the grouping shuffles ~150 GB of
(uid, place) pairs and the tasks are 64,000 more of the same kind as the extraction's.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from operator import itemgetter
from pathlib import Path
from typing import Annotated
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign import plots
from openalign.config import POSITIVE_INT, ConfigError, Options, listed
from openalign.sizes import SIZE, parse_size
from openalign.data import tables
from openalign.data.engine import Engine, Job, driver_duckdb, job_id, recorded_names, run_jobs, spark_session
from openalign.data.language import identify, known_languages
from openalign.data.words import check_segmenters, segment
from openalign.data.pairs import pair_uids, parts_glob, url_keys
from openalign.outputs import leftovers, sources_key, staged, staged_dir
from openalign.data.files import fingerprint, is_url, open_source, suffix_of
from openalign.pipeline.runner import Manifest, Run, Stage, run_stage
from openalign.pipeline.web.extract_inputs import archive_kind, inputs
from openalign.pipeline.web.extract_links import NO_BASE, hosts, pair, pairs, resolve_base, target_uri

__all__ = ["CANDIDATE_SCHEMA", "ExtractOptions", "ExtractResult", "extract"]

CANDIDATE_SCHEMA = pa.schema([
    ("uid", pa.string()),  # the pair uid of (image_key, text), as a pair table's: keep-lists work on it
    ("image_key", pa.string()),  # 128-bit hash of the url
    ("url", pa.string()),  # absolute http(s) URL of the image
    ("text", pa.string()),  # the alt-text, whitespace runs collapsed
    ("language", pa.string()),  # ISO 639-1 code of the text's language (data/language.py), `und` for none; null: off
    ("language_score", pa.float32()),  # the identifier's probability for it
    ("words", pa.string()),  # zh, ja, th: the text's words (data/words.py) joined by spaces; null elsewhere (= text)
    ("page_url", pa.string()),  # the page the image was on
    ("host", pa.string()),  # the image URL's host, lower case
    ("source", pa.string()),  # the input file
    ("offset", pa.int64()),  # the byte offset in it of the record the pair came from
    ("width", pa.int32()),  # as the page declares it, where it does (else null)
    ("height", pa.int32()),
])
PART_SCHEMA = CANDIDATE_SCHEMA.append(pa.field("seq", pa.int64()))  # order within the file, for the merge
IMG_SRC = b'"IMG@/src"'


@dataclass(frozen=True)
class ExtractOptions(Options):
    batch_rows: Annotated[int, POSITIVE_INT] = 8_192  # rows a task buffers before it writes a row group
    max_page_bytes: Annotated[str, SIZE] = "1M"  # of a WARC page's HTML, the part parsed (Common Crawl cuts its
        # records there); the rest is not read (truncated_page)
    max_record_bytes: Annotated[str, SIZE] = "4M"  # a WAT record larger is skipped (too_large_record): its JSON
        # describes one page that Common Crawl cut at 1 MiB
    max_depth: Annotated[int, POSITIVE_INT] = 10_000  # a WARC page whose elements nest deeper is skipped (too_deep):
        # the HTML parser's time grows with the square of the depth (10,000: 0.2 s)
    max_page_images: Annotated[int, POSITIVE_INT] = 10_000  # images read from one page; the rest are dropped and
        # counted (page_images_over_cap)
    language: bool = True  # identify each text's language (fastText lid.176, shipped in its package)
    languages: tuple[str, ...] = ()  # keep only texts in these languages (ISO 639-1, e.g. en: the paper's); ()=all
    words: bool = True  # segment Chinese, Japanese and Thai texts into words (the words column; needs [words])

    def spell(self, name: str) -> str:
        return f"extract.{name}"

    def cross_field_problems(self) -> list[str]:
        if self.languages and not self.language:
            return ["--languages keeps texts by their language, which --no-language leaves unknown; drop one of them"]
        return []

    @property
    def segments(self) -> bool:
        """Whether texts are segmented into words: which ones follows from their language, so not without it."""
        return self.words and self.language


# ---------------------------------------------------------------------------------------------------- reading


def kind_of(path: str) -> str:
    """What an input is, by its content: `table` for a URL table (Parquet by its magic bytes; CSV, TSV or JSONL
    by its name), else `wat` or `warc` (see `archive_kind`)."""
    try:
        with open_source(path) as stream:
            head = stream.read(4)
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    if head == b"PAR1" or (not head.startswith(b"\x1f\x8b") and not head.startswith(b"WARC")
                            and suffix_of(path) in tables.URL_TABLE_SUFFIXES):
        table_columns(path)  # a table with a URL and a text column, or one sentence
        return "table"
    return archive_kind(path)


# A candidate as a reader yields it: (url, text, page_url, offset, width, height)
Found = tuple[str, str, "str | None", int, "int | None", "int | None"]


def wat_candidates(path: str, counts: Counter, options: ExtractOptions) -> Iterator[list[Found]]:
    """The candidates of one WAT file, a page's at a time, in record order (not yet unique), counting what is
    dropped and why. A record without `IMG@/src` is not parsed; the others are parsed by msgspec into the parts
    extract reads (extract_wat.py), their JSON checked as cc2dataset's simdjson checks it (a record that is not
    UTF-8, or escapes a lone surrogate, is a `bad_record`). Records are read through damage, a record larger than
    `max_record_bytes` skipped (extract_records.py); a page's first `max_page_images` image links are read."""
    from fastwarc.warc import WarcRecordType

    from openalign.pipeline.web.extract_records import Archive
    from openalign.pipeline.web.extract_wat import BadRecord, page

    cap = options.max_page_images
    archive = Archive(path, WarcRecordType.metadata, counts, parse_size(options.max_record_bytes))
    for record, data in archive:
        counts["records"] += 1
        if IMG_SRC not in data:  # request records, pages without images: no JSON to parse
            continue
        try:
            target, href, links = page(data)
        except BadRecord:  # perhaps its Content-Length ran into the next records: then its own part parses
            own = archive.overlong(data)
            parsed = _parsed(own) if own is not None else None
            if parsed is None:
                counts["bad_record"] += 1
                continue
            target, href, links = parsed
        counts["pages"] += 1
        if len(links) > cap:
            counts["page_images_over_cap"] += len(links) - cap
            links = links[:cap]
        page_url = target_uri(target)
        base = resolve_base(page_url, href)
        counts["images"] += len(links)
        offset = record.stream_pos
        yield [(url, text, page_url, offset, None, None) for url, text in pairs(links, base, counts)]


def _parsed(data: bytes):
    from openalign.pipeline.web.extract_wat import BadRecord, page

    try:
        return page(data)
    except BadRecord:
        return None


HTML_TYPES = ("text/html", "application/xhtml+xml")
TAG = re.compile(rb"<(/?)([A-Za-z][^\s/>]*)")  # a start or end tag's name (what the depth estimate reads)
# elements that hold no others (void) or that the parser closes when the next one opens: not counted as depth
FLAT = frozenset(b"area base br col embed hr img input link meta param source track wbr keygen frame "
                 b"p li dt dd tr td th option optgroup rb rt rp".split())


def html_depth(html: bytes, cap: int) -> int:
    """How deep `html` nests its elements, an estimate that is at least the parser's depth for every kind of
    nesting that costs it time: start tags push their element, an end tag pops up to its element when one is open
    (a stray one is ignored, as the parser ignores it), void and implicitly closed elements are not counted. A
    page with fewer than `cap` tags is not examined (each `<` counted at C speed): it cannot be deeper."""
    if html.count(b"<") <= cap:
        return 0
    stack, open_count, deepest = [], Counter(), 0
    for close, name in TAG.findall(html):
        name = name.lower()
        if name in FLAT:
            continue
        if not close:
            stack.append(name)
            open_count[name] += 1
            deepest = max(deepest, len(stack))
        elif open_count[name]:
            while True:  # amortized: each element is popped once
                top = stack.pop()
                open_count[top] -= 1
                if top == name:
                    break
    return deepest


def warc_candidates(path: str, counts: Counter, options: ExtractOptions) -> Iterator[list[Found]]:
    """The candidates of one WARC file's HTML responses, a page's at a time, in record order: each `<img>`'s source
    and alt, parsed by selectolax (lexbor); the source is `data-src` where the tag has one (lazy loading: `src` holds
    a placeholder until a script swaps them), else `src`, else the first `srcset` candidate; width and height where
    the tag declares them as whole numbers. `<picture>`'s `<source>`s are not pairs: its `<img>` (the fallback) carries
    the alt. A page's first `max_page_bytes` are parsed (Common Crawl's own cut), a page nested deeper than
    `max_depth` is skipped (`too_deep`: lexbor's time grows with the square of the depth), and its first
    `max_page_images` images are read; records are read through damage (extract_records.py)."""
    from fastwarc.warc import WarcRecordType
    from selectolax.lexbor import LexborHTMLParser

    from openalign.pipeline.web.extract_records import Archive

    archive = Archive(path, WarcRecordType.response, counts, parse_size(options.max_page_bytes), parse_http=True,
                      truncate=True)
    for record, data in archive:
        counts["records"] += 1
        if (record.http_content_type or "").lower() not in HTML_TYPES:
            continue
        status = record.http_headers.status_code if record.http_headers is not None else None
        if status is not None and status != 200:
            continue
        body = archive.overlong(data) or data  # a Content-Length run into the next records: cut there
        if html_depth(body, options.max_depth) > options.max_depth:
            counts["too_deep"] += 1
            continue
        page_url = target_uri(record.headers.get("WARC-Target-URI"))
        try:
            tree = LexborHTMLParser(body.decode(record.http_charset or "utf-8", "replace"))
        except (LookupError, ValueError):  # an unknown charset name
            tree = LexborHTMLParser(body.decode("utf-8", "replace"))
        counts["pages"] += 1
        tag = tree.css_first("base[href]")
        base = resolve_base(page_url, (tag.attributes.get("href") or "").strip() if tag is not None else None)
        page, tags, offset = [], tree.css("img"), record.stream_pos
        if len(tags) > options.max_page_images:
            counts["page_images_over_cap"] += len(tags) - options.max_page_images
            tags = tags[:options.max_page_images]
        for img in tags:
            counts["images"] += 1
            attrs = img.attributes
            found = pair(attrs.get("alt") or "" if "alt" in attrs else None, _img_source(attrs), base, counts)
            if found:
                page.append((*found, page_url, offset, _dimension(attrs.get("width")),
                             _dimension(attrs.get("height"))))
        yield page


def _img_source(attrs: dict) -> str:
    src = (attrs.get("src") or "").strip()
    lazy = (attrs.get("data-src") or "").strip()
    if lazy:  # lazy loading: `src` is a placeholder until a script sets it to data-src
        return lazy
    if not src and attrs.get("srcset"):
        return attrs["srcset"].strip().split(",")[0].strip().split(" ")[0]
    return src


def _dimension(value) -> int | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    value = str(value if value is not None else "").strip().removesuffix("px")
    return int(value) if value.isdigit() and 0 < int(value) < 2**31 else None


def table_columns(path: str) -> dict[str, str | None]:
    """{role: column} of a URL table (url, text, width, height, page_url; the last three where present), by the one
    column vocabulary (data/tables.py); one sentence when it has no URL or no text column."""
    return tables.url_columns(path, tables.stream_names(path))


def table_candidates(path: str, counts: Counter, options: ExtractOptions) -> Iterator[list[Found]]:
    """The candidates of a URL table made elsewhere (COYO-700M's, LAION's or DataComp's Parquet, a CSV of url
    and caption), streamed a batch at a time: the same URL and text rules as pages (an absolute http(s) URL, a text
    after whitespace collapsing), with the table's width and height where it has them; `offset` is the row number."""
    columns = table_columns(path)
    wanted = list(dict.fromkeys(c for c in columns.values() if c))
    number = 0
    for batch in tables.batches(path, wanted, counts):
        found_rows = []
        for row in batch:
            number += 1
            counts["rows"] += 1
            if row is None:
                counts["bad_record"] += 1
                continue
            url, text = str(row[columns["url"]] or ""), row[columns["text"]]
            page = row.get(columns["page_url"]) if columns["page_url"] else None
            size = (_dimension(row.get(columns["width"])) if columns["width"] else None,
                    _dimension(row.get(columns["height"])) if columns["height"] else None)
            # a list of captions is several candidates of one image (an empty list: a row without a text)
            for caption in (text or [""]) if isinstance(text, list) else [text]:
                found = pair(str(caption if caption is not None else ""), url, NO_BASE, counts)
                if found:
                    found_rows.append((*found, str(page) if page else None, number, *size))
        yield found_rows


def part_table(found: list[Found], source: str, start: int, counts: Counter,
               options: ExtractOptions = ExtractOptions()) -> pa.Table:
    """Candidates as a part's rows (PART_SCHEMA), numbered from `start` in their file's order, with their hosts (a
    URL without one is dropped and counted, `bad_url`), their texts' languages (one not in `options.languages` is
    dropped and counted, `other_language`) and keys, as a pair table's: image_key = a hash of the url, uid = the
    pair uid of (image_key, text)."""
    import pyarrow.compute as pc

    if not found:  # pc.all of nothing is null, not true
        return PART_SCHEMA.empty_table()
    # a column at a time (zip(*found) took four times as long)
    urls, texts, pages, offsets, widths, heights = (list(map(itemgetter(i), found)) for i in range(6))
    keys = url_keys(urls)
    url = pa.array(urls, pa.string())
    if options.language:
        found_languages, scores = identify(list(texts))
        language, score = pa.array(found_languages, pa.string()), pa.array(scores, pa.float32())
    else:
        found_languages = [None] * len(found)
        language, score = pa.nulls(len(found), pa.string()), pa.nulls(len(found), pa.float32())
    split = (pa.array(segment(list(texts), found_languages), pa.string()) if options.segments
             else pa.nulls(len(found), pa.string()))
    columns = {"uid": pa.array(pair_uids(keys, texts), pa.string()),
               "image_key": pa.array(keys, pa.string()), "url": url, "text": pa.array(texts, pa.string()),
               "language": language, "language_score": score, "words": split,
               "page_url": pa.array(pages, pa.string()), "host": hosts(url),
               "source": pa.array([source], pa.string()).take(np.zeros(len(found), np.int32)),
               "offset": pa.array(offsets, pa.int64()), "width": _sizes(widths), "height": _sizes(heights),
               "seq": pa.array(np.arange(start, start + len(found)))}
    table = pa.table([columns[f.name] for f in PART_SCHEMA], schema=PART_SCHEMA)
    known = pc.not_equal(columns["host"], "")
    if not pc.all(known).as_py():
        counts["bad_url"] += len(found) - pc.sum(known).as_py()
        table = table.filter(known)
    if options.languages:
        wanted = pc.is_in(table["language"], pa.array(options.languages, pa.string()))
        counts["other_language"] += (table.num_rows - pc.sum(wanted).as_py()) if table.num_rows else 0
        table = table.filter(wanted)
    counts["pairs"] += table.num_rows
    return table


def _sizes(values: list) -> pa.Array:
    """A width or height column: all null without a look at each (a WAT file's links carry no sizes)."""
    return pa.nulls(len(values), pa.int32()) if values.count(None) == len(values) else pa.array(values, pa.int32())


def extract_file(path: str, part: str, options: ExtractOptions, kind: str = "wat") -> dict:
    """One task: the candidates of one input file -> PART, in the file's order, a row group per `batch_rows` (the
    task's memory does not grow with the file: pairs repeated within it are removed by the merge, out of core);
    returns the counts."""
    counts: Counter = Counter()
    read = {"wat": wat_candidates, "warc": warc_candidates, "table": table_candidates}[kind]
    batch: list[Found] = []
    written = 0
    # dictionaries for the columns that repeat (a page's, a file's, a host's rows): trying them on the unique ones
    # (url, text, hashes) was half the write's time
    repeating = ["language", "page_url", "source", "host"]
    with staged(Path(part)) as tmp, pq.ParquetWriter(tmp, PART_SCHEMA, compression="lz4",
                                                     use_dictionary=repeating) as writer:
        for found in read(path, counts, options):
            batch += found  # a page's pairs at most max_page_images: the batch never holds many more than batch_rows
            while len(batch) >= options.batch_rows:
                rows, batch = batch[:options.batch_rows], batch[options.batch_rows:]
                writer.write_table(part_table(rows, path, written, counts, options))
                written += len(rows)
        if batch:
            writer.write_table(part_table(batch, path, written, counts, options))
    counts["pairs"] += 0  # present when a file has none
    return dict(counts)


def probe(files: list[str], threads: int = 32) -> tuple[dict[str, str], dict[str, list]]:
    """({file: its kind}, {file: its fingerprint}): URLs are probed by `threads` at a time (a snapshot's 64,000 WAT
    files are 64,000 round trips each), local files one after the other."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> tuple[str, list]:
        return kind_of(name), fingerprint(name)

    if not any(is_url(f) for f in files):
        found = [one(f) for f in files]
    else:
        with ThreadPoolExecutor(threads) as pool:
            found = list(pool.map(one, files))
    return {f: k for f, (k, _) in zip(files, found)}, {f: v for f, (_, v) in zip(files, found)}


@dataclass(frozen=True)
class ExtractResult:
    """What `extract` wrote and counted (its manifest, `candidates.manifest.json`, holds the same and more)."""

    table: Path  # OUT/candidates.parquet
    candidates: int  # its rows: unique (url, text) pairs
    files: int  # input files read
    counts: dict[str, int]  # over all files: records, pages, images, rows read; each reason a link was dropped
    per_file: dict[str, dict[str, int]]  # the same, per input file
    duplicates_across_files: int  # pairs unique within their file that an earlier file already had
    hosts: int  # distinct image hosts
    top_hosts: list[tuple[str, int]]  # the hosts with the most candidates
    languages: dict[str, int]  # candidates per language of their text, the most first ({} with --no-language)
    resumed_tasks: int  # files a rerun did not read again (unchanged since the run that read them)
    seconds: float
    report: Path  # OUT/extract_report.png: what was dropped and why, and the top hosts
    manifest: dict  # the manifest as written


class Extract(Stage):
    """Web archives and URL tables -> OUT/candidates.parquet: one task per input file, its part kept in OUT/parts
    (a rerun reads again only the files that changed), the parts merged with the first row of each uid kept (a
    grouping of keys, then a task per part: `_merge`)."""

    name = "extract"
    options = ExtractOptions
    result = ExtractResult
    reads_pairs = False
    keeps = False
    report_file = "candidates.manifest.json"
    record_field = "manifest"
    work = "parts"
    keeps_work = True
    figure_file = "extract_report.png"
    figure_dpi = 100

    def __init__(self, sources: list[str]):
        self.sources = sources
        self.files: list[str] = []

    def check(self, run: Run) -> None:
        options, out = run.options, run.out
        unknown = sorted(set(options.languages) - known_languages()) if options.languages else []
        if unknown:
            raise ConfigError(f"--languages {','.join(unknown)}: not a language the identifier knows (ISO 639-1 "
                              f"codes such as en, de, zh, ja; 'und' for texts with none)")
        if options.segments:
            check_segmenters()
        for source in self.sources:
            if not is_url(source) and Path(source).is_dir() and out.resolve().is_relative_to(Path(source).resolve()):
                raise ConfigError(f"--out {out} is inside the source folder {source}, so a rerun would read "
                                  "extract's own output as input; choose an --out outside it")
        self.files = inputs(self.sources)
        self.kinds, self.versions = probe(self.files)  # every input is readable and of a known kind, before any work

    def plan(self, run: Run) -> list[Job]:
        parts = run.work
        parts.mkdir(exist_ok=True)
        self.jobs = [Job(job_id(i), extract_file, (f, str(parts / f"{job_id(i)}.parquet"), run.options,
                                                   self.kinds[f]),
                         key=sources_key(self.versions[f], asdict(run.options)),
                         outputs=(str(parts / f"{job_id(i)}.parquet"),))
                     for i, f in enumerate(self.files)]
        names, recorded = {Path(t.outputs[0]).name for t in self.jobs}, recorded_names(parts / "_status")
        for stale in recorded - names:
            (parts / stale).unlink(missing_ok=True)  # parts of files no longer given: only those a task recorded
        for partial in leftovers(parts, names | recorded):  # a part a killed task was writing
            partial.unlink(missing_ok=True)
        return self.jobs

    def merge(self, run: Run, results: dict[str, dict]) -> Manifest:
        table = run.out / "candidates.parquet"
        counts: Counter = Counter()
        per_file = {}
        rows, unique = _merge(self.jobs, table, run)
        hosts, top, languages = _tallies(table, run, run.options.language)
        for job, f, distinct in zip(self.jobs, self.files, unique):
            summary = {k: v for k, v in results[job.id].items() if isinstance(v, int)}
            summary["duplicate"] = summary.pop("pairs") - distinct  # a pair its own file already had
            summary["candidates"] = distinct
            per_file[str(f)] = summary
            counts.update(summary)
        return Manifest({
            "stage": "extract", "sources": [str(s) for s in self.sources], "files": len(self.files),
            "kinds": dict(Counter(self.kinds.values())), "options": asdict(run.options), "engine": run.engine.name,
            "resumed_tasks": run.resumed, "out": str(table), "candidates": rows,
            "duplicates_across_files": counts["candidates"] - rows, "counts": dict(sorted(counts.items())),
            "per_file": per_file, "hosts": hosts, "top_hosts": top, "languages": languages,
            "text_normalization": "runs of whitespace collapsed to one space, ends stripped; case and characters kept",
        })

    def figure(self, run: Run, report: Manifest):
        return report_figure(report.fields)

    def result_fields(self, run: Run, report: Manifest) -> dict:
        return {"table": run.out / "candidates.parquet", "report": run.out / self.figure_file,
                "top_hosts": [tuple(t) for t in report.top_hosts]}


def extract(sources: list[str], out: Path, options: ExtractOptions = ExtractOptions(), engine: Engine = Engine(),
            progress: bool = True) -> ExtractResult:
    """Write OUT/candidates.parquet, OUT/extract_report.png and, last, OUT/candidates.manifest.json from web
    archives and URL tables (see the module); returns what was written and counted."""
    return run_stage(Extract(listed(sources, "sources")), None, out, options, progress, engine)


READ_COUNTS = ("records", "pages", "images", "rows", "candidates", "duplicate")  # the rest are reasons for dropping,
NOTES = ("rows_with_invalid_utf8", "damaged_bytes")  # but these: kept with U+FFFD, and the bytes damage passed over
NOT_DROPS = READ_COUNTS + NOTES


def report_figure(manifest: dict, top: int = 15):
    """Three panels: why links were dropped (and how many became candidates), the hosts with the most candidates,
    and the candidates' languages (where they were identified)."""
    plt = plots.pyplot()

    counts = manifest["counts"]
    reasons = sorted(((k, v) for k, v in counts.items() if k not in NOT_DROPS), key=lambda kv: -kv[1])
    bars = [("candidates", manifest["candidates"]), ("duplicate (within or across files)",
                                                     counts.get("duplicate", 0) + manifest["duplicates_across_files"])]
    bars += reasons
    hosts = manifest["top_hosts"][:top]
    languages = list(manifest.get("languages", {}).items())[:top]
    rows = max(len(bars), len(hosts), len(languages))
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, max(3.5, 0.35 * rows + 1.5)))
    left.barh([b[0] for b in bars], [b[1] for b in bars], color=["tab:green", "tab:gray"] + ["tab:red"] * len(reasons))
    left.invert_yaxis()
    left.set_xlabel("links or rows")
    read = ", ".join(f"{counts[k]:,} {k}" for k in ("pages", "images", "rows") if counts.get(k))
    left.set_title(f"{manifest['files']} file(s): {read}", fontsize=10)
    middle.barh([h for h, _ in hosts], [n for _, n in hosts], color="tab:blue")
    middle.invert_yaxis()
    middle.set_xlabel("candidate pairs")
    middle.set_title(f"top {len(hosts)} of {manifest['hosts']:,} image hosts", fontsize=10)
    if languages:
        right.barh([str(lang) for lang, _ in languages], [n for _, n in languages], color="tab:purple")
        right.invert_yaxis()
        right.set_xlabel("candidate pairs")
        right.set_title(f"top {len(languages)} of {len(manifest['languages'])} languages (fastText lid.176)",
                        fontsize=10)
    else:
        right.axis("off")
        right.set_title("languages not identified (--no-language)", fontsize=10)
    fig.suptitle(f"extract: {manifest['candidates']:,} candidate pairs")
    return fig


def _tallies(table: Path, run: Run, languages: bool, top: int = 50) -> tuple[int, list[list], dict[str, int]]:
    """(distinct image hosts, the `top` hosts with the most candidates, {language: candidates} the most first, or {}
    where languages were not identified) of the finished table (a folder of parts): one grouping by host and one by
    language, a Spark job each on Spark, else DuckDB on the driver."""
    if run.engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_session(run.engine.master, retries=run.engine.retries, memory=run.engine.memory)
        written = spark.read.parquet(str(table))
        by_host = written.groupBy("host").count().cache()
        distinct = by_host.count()
        hosts = [[r["host"], int(r["count"])] for r in by_host.orderBy(F.desc("count"), "host").limit(top).collect()]
        by_host.unpersist()
        found = ({r["language"]: int(r["count"]) for r in
                  written.groupBy("language").count().orderBy(F.desc("count"), "language").collect()}
                 if languages else {})
        return int(distinct), hosts, found
    source = parts_glob(table)
    with driver_duckdb(run.engine, run.work) as con:
        con.execute("CREATE TEMP TABLE hosts AS SELECT host, count(*) AS n FROM read_parquet(?) GROUP BY host",
                    [source])
        distinct = con.execute("SELECT count(*) FROM hosts").fetchone()[0]
        hosts = [[h, int(n)] for h, n in con.execute(f"SELECT host, n FROM hosts ORDER BY n DESC, host "
                                                     f"LIMIT {int(top)}").fetchall()]
        found = ({language: int(n) for language, n in con.execute(
            "SELECT language, count(*) AS n FROM read_parquet(?) GROUP BY language ORDER BY n DESC, language",
            [source]).fetchall()} if languages else {})
    return int(distinct), hosts, found


FILE_ROWS = 1 << 40  # a part's rows: a row's place across parts is its job x FILE_ROWS + its seq
MERGE = "_merge"  # in OUT: each job's first rows (firsts/job=N/) and the merge tasks' statuses, removed after


def _firsts(paths: list[str], firsts: Path, run: Run) -> None:
    """The one global step: each uid's first row, its least (job, seq), found by a grouping of (uid, place) pairs
    (not whole rows) and written as the seqs each job keeps, one part per job (FIRSTS/job=N/). DuckDB on the driver,
    out of core, or a Spark job (each row's job from its part's name, parts/NNNNNN.parquet)."""
    if run.engine.name == "spark":
        from pyspark.sql import functions as F

        spark = spark_session(run.engine.master, retries=run.engine.retries, memory=run.engine.memory)
        job = F.regexp_extract(F.input_file_name(), r"([0-9]+)\.parquet$", 1).cast("long")
        place = (spark.read.parquet(*paths).select("uid", (job * FILE_ROWS + F.col("seq")).alias("key"))
                 .groupBy("uid").agg(F.min("key").alias("key")))
        (place.select((F.col("key") / FILE_ROWS).cast("long").alias("job"), (F.col("key") % FILE_ROWS).alias("seq"))
         .write.mode("overwrite").partitionBy("job").parquet(str(firsts)))
        return
    with driver_duckdb(run.engine, firsts.parent) as con:
        con.execute("SET preserve_insertion_order = false")
        con.execute(f"""COPY (SELECT key // {FILE_ROWS} AS job, key % {FILE_ROWS} AS seq FROM (
                            SELECT min(CAST(file_index AS BIGINT) * {FILE_ROWS} + seq) AS key
                            FROM read_parquet($paths) GROUP BY uid))
                        TO '{str(firsts).replace("'", "''")}' (FORMAT parquet, PARTITION_BY (job))""",
                    {"paths": paths})


def first_rows(part: str, kept: str, out: str) -> dict:
    """One merge task: the rows of one part that are their uid's first (their seqs in KEPT, a folder of the firsts;
    absent: none), in the part's order -> OUT (CANDIDATE_SCHEMA); returns {rows, distinct} (the part's distinct
    uids, for its file's count of duplicates within it)."""
    import duckdb

    columns = ", ".join(f'"{name}"' for name in CANDIDATE_SCHEMA.names)
    with duckdb.connect(config={"threads": 1, "memory_limit": "1GB"}) as con:
        distinct = con.execute("SELECT count(DISTINCT uid) FROM read_parquet(?)", [part]).fetchone()[0]
        with staged(Path(out)) as tmp:
            if Path(kept).is_dir():
                con.execute(f"""COPY (SELECT {columns} FROM read_parquet($part)
                                      WHERE seq IN (SELECT seq FROM read_parquet($kept)) ORDER BY seq)
                                TO '{str(tmp).replace("'", "''")}' (FORMAT parquet)""",
                            {"part": part, "kept": f"{kept}/*.parquet"})
            else:  # every row of the part was an earlier part's
                pq.write_table(CANDIDATE_SCHEMA.empty_table(), tmp)
    return {"rows": pq.read_metadata(out).num_rows, "distinct": int(distinct)}


def _merge(jobs: list[Job], table: Path, run: Run) -> tuple[int, list[int]]:
    """The parts -> OUT/candidates.parquet, a folder of one part per input file (part-NNNNNN.parquet: read in
    order, the table is in input order), each holding its rows that are their uid's first: the grouping of
    (uid, place) pairs is the one global step (`_firsts`), the rest one task per part on the engine (no row of the
    table passes through the driver, nothing is sorted but each part's own rows). Returns the rows written and
    each part's distinct uids."""
    paths = [job.outputs[0] for job in jobs]
    work = run.out / MERGE
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    _firsts(paths, work / "firsts", run)
    with staged_dir(table) as tmp:
        merging = [Job(job_id(i), first_rows, (path, str(work / "firsts" / f"job={i}"),
                                               str(tmp / f"part-{job_id(i)}.parquet")))
                   for i, path in enumerate(paths)]
        results, _ = run_jobs(merging, work / "status", run.engine, "extract merge", run.progress)
    shutil.rmtree(work, ignore_errors=True)
    return (sum(results[j.id]["rows"] for j in merging), [results[j.id]["distinct"] for j in merging])
