"""Extract's inputs: local paths, directories, globs and fsspec URLs (s3://, gs://, https://) found (opened as
streams by data/files.py), and which kind of web archive a WARC file is."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from openalign.config import ConfigError
from openalign.data.files import filesystem, is_url, open_source
from openalign.data.tables import is_part

__all__ = ["archive_kind", "inputs"]


def archive_kind(path: str) -> str:
    """`wat` for a WARC file of metadata records (Common Crawl's WAT), `warc` for one of HTTP records (a crawl's
    WARC: request, response, revisit, resource); one sentence for anything else."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    try:
        with open_source(path) as stream:
            for record in ArchiveIterator(stream, parse_http=False):
                if record.record_type == WarcRecordType.warcinfo:
                    continue
                if record.record_type == WarcRecordType.metadata:
                    return "wat"
                if record.record_type in (WarcRecordType.request, WarcRecordType.response, WarcRecordType.revisit,
                                          WarcRecordType.resource):
                    return "warc"
                raise ConfigError(f"{path} is a WARC of {record.headers.get('WARC-Type')} records; give Common "
                                  "Crawl WAT files (*.warc.wat.gz) or a crawl's WARC files (*.warc.gz)")
    except OSError as err:
        if err.errno is not None:
            raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
        raise ConfigError(f"{path} holds no WARC records ({err}); give Common Crawl WAT files (*.warc.wat.gz), a "
                          "crawl's WARC files (*.warc.gz) or URL tables (.parquet, .csv, .tsv, .jsonl)") from None
    raise ConfigError(f"{path} holds no WARC records; give Common Crawl WAT files (*.warc.wat.gz), a crawl's WARC "
                      "files (*.warc.gz) or URL tables (.parquet, .csv, .tsv, .jsonl)")


def inputs(sources: list[str]) -> list[str]:
    """The input files: each source a file, a directory (its files, sorted; as Spark and Hadoop do, names starting
    with `.` or `_` are not read, nor what lies under such a folder: Spark's `_SUCCESS` and `_temporary/` beside a
    table's parts) or a glob, local or an fsspec URL (an HTTP(S) URL ending in `/` is a directory: its index page's
    links); one sentence for a missing one."""
    import glob

    files: list[str] = []
    for source in sources:
        if is_url(source):
            files += remote_files(source)
            continue
        path = Path(source)
        if path.is_dir():  # its files, but not Spark's _SUCCESS, _temporary/ or checksums beside a table's parts
            files += sorted(str(p) for p in path.rglob("*") if p.is_file() and is_part(p, path))
        elif path.is_file():
            files.append(source)
        elif path.exists():
            raise ConfigError(f"{source} is not a regular file (a FIFO, a device or a socket: it cannot be read twice, "
                              "and extract reads each input twice); give web archives or URL tables as files")
        elif any(ch in source for ch in "*?["):
            matched = sorted(p for p in glob.glob(source, recursive=True) if Path(p).is_file())
            if not matched:
                raise ConfigError(f"{source} matches no file")
            files += matched
        else:
            raise ConfigError(f"{source} does not exist; give web archives or URL tables, a directory of them or a "
                              "glob")
    if not files:
        raise ConfigError(f"found no files in {', '.join(sources)}")
    return list(dict.fromkeys(files))


def remote_files(source: str) -> list[str]:
    fs, path = filesystem(source)
    # what this process listed or asked before (fsspec keeps filesystems and their listings for the process's life)
    # is not what the store holds now: a stale ETag would be sent with the read and refused (412)
    fs.invalidate_cache()
    http = source.split(":", 1)[0].lower() in ("http", "https")
    try:
        if any(ch in path for ch in "*?["):
            found = fs.glob(path)
        elif (http and path.endswith("/")) or (not http and fs.isdir(path)):  # an HTTP file is never probed
            found = fs.find(path)
        else:
            return [source]
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot list {source}: {err}") from None
    files = sorted(fs.unstrip_protocol(p) if not http else p for p in found
                   if not PurePosixPath(urlsplit(p).path if http else p).name.startswith("."))
    if not files:
        raise ConfigError(f"{source} matches no file")
    return files
