"""A web archive's records, read through the damage a crawl holds, in bounded memory.

    archive = Archive(path, WarcRecordType.metadata, counts, limit=4 << 20)
    for record, data in archive: ...          # FastWARC's record (headers, stream_pos: its offset), its bytes

FastWARC reads the records; this module decides what happens when a file is not what it says:

- **a damaged gzip member** (Common Crawl writes one member per record): FastWARC stops at the first error, and
  every later record would be lost. Here the file is scanned for the next gzip member header after the last record
  read whole (for an uncompressed file, the next line that starts `WARC/1.`), the records are read on from there,
  and the damage is counted: `damaged_member` (members passed over, at least one a damaged stretch; Common
  Crawl's are one record each) and `damaged_bytes` (the compressed bytes passed over). A file that ends inside a
  record, with no member after it, counts `truncated_record`, as before.
- **a Content-Length that runs past the record** into the records after it (their text would be read as this
  record's, their pairs given this record's page): the content is cut where the next record's header starts
  (`\\r\\n\\r\\nWARC/1.`), counted `overlong_record`, and the records it swallowed are read again from the next
  member. An HTML body is checked always (the search costs little beside the parse); a WAT record when it does not
  parse (`overlong`), so a good one costs nothing.
- **a record larger than `limit`**: with `truncate` (an HTML page), its first `limit` bytes are read and the rest is
  not (`truncated_page`: Common Crawl itself cuts its records at 1 MiB); without (a WAT record's JSON, which cannot
  be parsed in part), the record is skipped unread (`too_large_record`). FastWARC passes over the unread rest in
  blocks (a 1 GiB record: 0.1 s and no memory), so a task's memory is bounded by `limit`, not by its largest record.
"""

from __future__ import annotations

import gzip
import zlib
from collections import Counter
from typing import Any
from collections.abc import Iterator

from openalign.data.files import open_source

__all__ = ["Archive", "SEPARATOR"]

GZIP_MEMBER = b"\x1f\x8b\x08"  # RFC 1952: ID1 ID2 CM=deflate
WARC_LINE = b"\nWARC/1."  # an uncompressed record's first line (after the previous record's separator)
SEPARATOR = b"\r\n\r\nWARC/1."  # a record's end (WARC 1.1 section 4: two CRLFs) and the next one's header
SCAN = 1 << 20  # bytes read at a time while looking for the next member
FAILURES = (OSError, EOFError, zlib.error, gzip.BadGzipFile)  # FastWARC: "Gzip decompression error", "Invalid WARC
# header", a stream that ends early


class Archive:
    """The records of `types` in one WARC file (a local path or an fsspec URL), in file order, through damage (the
    module's docstring); what was lost is counted in `counts`."""

    def __init__(self, path: str, types, counts: Counter, limit: int, parse_http: bool = False,
                 truncate: bool = False):
        self.path, self.types, self.counts, self.limit = path, types, counts, limit
        self.parse_http, self.truncate = parse_http, truncate
        self.cut_at: int | None = None  # set by `overlong`: where the record that ran into the next ones ends

    def overlong(self, data: bytes) -> bytes | None:
        """The content of the record just read, when it ran into the records after it: cut where the next one
        starts (the records it swallowed are read after it); None when it did not."""
        end = data.find(SEPARATOR)
        if end < 0:
            return None
        self.counts["overlong_record"] += 1
        self.cut_at = end
        return data[:end]

    def __iter__(self) -> Iterator[tuple[Any, bytes]]:
        """(FastWARC's record, its content: with parse_http, the HTTP body; at most `limit` bytes)."""
        start, region = 0, None  # region: [first offset passed over, members passed over] while skipping damage
        while True:
            failed, last, read_any = yield from self._from(start)
            if region is not None and read_any:  # the resumed reading went on: the damage is behind
                self.counts["damaged_member"] += max(region[1], 1)
                if start > region[0]:
                    self.counts["damaged_bytes"] += start - region[0]
                region = None
            if not failed:
                if region is not None:  # resumed at something that held no record, and the file ended
                    self.counts["truncated_record"] += 1
                return
            if failed == "damaged":
                if region is None:
                    region = [None, 0]
                elif not read_any:
                    region[1] += 1  # the member resumed at failed too
            found = self._next_member(max(last, start) + 1)
            if found is None:
                if failed == "damaged":
                    self.counts["truncated_record"] += 1  # the file ends inside a record
                return
            if region is not None and region[0] is None:
                region[0] = found
            start = found

    def _from(self, start: int):
        """Yields the records from byte `start` on; returns (why it stopped early or None, the offset of the last
        record read whole, whether any was)."""
        from fastwarc.warc import ArchiveIterator

        previous, counts, limit, truncate = None, self.counts, self.limit, self.truncate  # the loop's, as locals
        stream = open_source(self.path, random_access=start > 0)

        def stopped(why: str | None):
            return why, previous.stream_pos if previous is not None else start - 1, previous is not None

        try:
            if start:
                stream.seek(start)
            for record in ArchiveIterator(stream, record_types=self.types, parse_http=self.parse_http):
                length = record.content_length
                if not length and record.headers.get("Content-Length") is None:
                    return stopped("damaged")  # a header the file ends inside (FastWARC hands it on)
                if truncate:
                    data = record.reader.read(limit)
                    if len(data) == limit and record.reader.read(1):
                        counts["truncated_page"] += 1  # the rest is passed over unread
                elif length > limit:
                    counts["too_large_record"] += 1
                    previous = record
                    continue
                else:
                    data = record.reader.read()
                    if len(data) < length:  # the file or its member ends inside this record
                        return stopped("damaged")
                previous = record
                yield record, data  # a tuple: 40,000 records a WAT file, each an object less
                if self.cut_at is not None:  # the caller found it ran into the next records: read them again
                    self.cut_at = None
                    return stopped("overlong")
        except FAILURES:
            return stopped("damaged")
        finally:
            stream.close()
        return stopped(None)

    def _next_member(self, after: int) -> int | None:
        """The offset of the first gzip member header (or uncompressed record) at or after `after`, or None. Only
        damage asks: a file read without any is opened once, and streamed."""
        with open_source(self.path, random_access=True) as stream:
            magic = GZIP_MEMBER if stream.read(2) == GZIP_MEMBER[:2] else WARC_LINE
            stream.seek(after)
            position, tail = after, b""
            while True:
                block = stream.read(SCAN)
                if not block:
                    return None
                window = tail + block
                found = window.find(magic)
                if found >= 0:
                    at = position - len(tail) + found
                    return at + 1 if magic == WARC_LINE else at  # past the newline
                tail = window[-(len(magic) - 1):]
                position += len(block)
