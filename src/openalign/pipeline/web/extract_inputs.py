"""Extract's inputs: local paths, directories, globs and fsspec URLs (s3://, gs://, https://) found and opened as
streams, what tells whether one changed, and which kind of web archive a WARC file is."""

from __future__ import annotations

import io
import re
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from openalign.config import ConfigError

__all__ = ["Stream", "archive_kind", "filesystem", "fingerprint", "inputs", "is_url", "open_lines", "open_source",
           "suffix_of"]


SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # an fsspec URL's start: s3://, gs://, https://, file://


def is_url(name: str) -> bool:
    return SCHEME.match(name) is not None


def suffix_of(name: str) -> str:
    """A local path's or a URL's suffix, in lower case (a URL's query is not part of it)."""
    return PurePosixPath(urlsplit(name).path if is_url(name) else name).suffix.lower()


def filesystem(url: str):
    """(fsspec's filesystem for a URL, the path within it); one sentence where fsspec cannot read such URLs (a
    protocol it does not know, or one whose package is missing: s3fs for s3://, gcsfs for gs://)."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        extra = " (pip install 'openalign[s3]')" if url.lower().startswith(("s3://", "s3a://")) else ""
        raise ConfigError(f"cannot read {url}: {str(err).splitlines()[0]}{extra}") from None
    except ValueError as err:
        raise ConfigError(f"cannot read {url}: {err}") from None


def open_source(name: str, random_access: bool = False):
    """A binary stream of an input file: a local file, or an fsspec URL. Over HTTP(S) it is one GET read as it
    arrives (no range requests: any server will do), unless `random_access` (Parquet's footer) asks for range
    requests; object stores (s3://, gs://) are read in blocks with read-ahead."""
    if not is_url(name):
        return open(name, "rb")
    fs, path = filesystem(name)
    if random_access or name.split(":", 1)[0].lower() not in ("http", "https"):
        return fs.open(path, "rb")
    return fs.open(path, "rb", block_size=0)  # FastWARC asks where it is (tell), which this file answers


def open_lines(name: str) -> io.BufferedReader:
    """An input read front to back, line by line (a CSV's header, JSONL), never seeking."""
    return io.BufferedReader(Stream(open_source(name)), buffer_size=1 << 20)


class Stream(io.RawIOBase):
    """A file read front to back that says so (`seekable()` is False), so that Arrow's CSV reader does not try to
    seek it: fsspec's streamed HTTP file says it can, then refuses."""

    def __init__(self, file):
        super().__init__()
        self.file = file

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:
        data = self.file.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.file.close()
        super().close()


def fingerprint(name: str) -> list:
    """What tells whether an input changed: a local file's size and mtime (sources_key), a URL's size and whatever
    version its store reports (ETag, Last-Modified, mtime, ...)."""
    if not is_url(name):
        return [name]
    fs, path = filesystem(name)
    try:
        info = fs.info(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {name}: {err}") from None
    return [name] + [[key, str(info[key])] for key in sorted(info, key=str) if str(key).lower() in VERSION_KEYS]


VERSION_KEYS = ("size", "etag", "last-modified", "lastmodified", "last_modified", "mtime", "md5", "content-md5",
                "generation", "version_id")


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
    """The input files: each source a file, a directory (its files, sorted) or a glob, local or an fsspec URL (an
    HTTP(S) URL ending in `/` is a directory: its index page's links); one sentence for a missing one."""
    import glob

    files: list[str] = []
    for source in sources:
        if is_url(source):
            files += remote_files(source)
            continue
        path = Path(source)
        if path.is_dir():
            files += sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
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
