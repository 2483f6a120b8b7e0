"""Input files, local or remote: a path, or an fsspec URL (s3://, gs://, https://, file://) opened as a stream,
and what tells whether one changed. Every reader of a file a user names by URL (extract's inputs, a URL table)
opens it here."""

from __future__ import annotations

import io
import re
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from openalign.config import ConfigError

__all__ = ["Stream", "filesystem", "fingerprint", "is_url", "open_lines", "open_source", "suffix_of"]


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
