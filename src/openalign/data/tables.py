"""Tables of image/text rows, read one way by every command (ingest, eval, embed, dedup, extract, fetch).

    X.csv  X.tsv   by header; the delimiter is sniffed (a tab-separated .csv is common: OpenCLIP reads and writes them)
    X.jsonl        one JSON object per line, streamed
    X.json         a JSON array of objects; an object with "images" is a Karpathy split instead (told by content)
    X.parquet      columns; a pair table from `openalign ingest`, or img2dataset's output, is told by its schema

What a file is comes from its content, not from the command that reads it (`kind`). One column vocabulary: a role's
column is the one named (`--image-column`, `--text-column`), else the first present of its known names, matched
without regard to case (`first_column`):

    image     IMAGE_COLUMNS   openalign's and CLIP_benchmark's `image`, OpenCLIP's `filepath`, ..., then a URL's
    url       URL_COLUMNS     a URL table's image URL (extract, fetch): `url`, `image_url`, `img_url`
    text      TEXT_COLUMNS    `text` (a pair table's), `caption`, `captions`, `alt`, `alt_text`, `title`:
                              CLIP_benchmark, OpenCLIP, COYO, LAION, DataComp, img2dataset
    width, height, page_url   a URL table's image size and page, where it has them (COYO and LAION: width;
                              DataComp: original_width)

A text value that is a list (a JSONL `captions` list, a Parquet list column) is several captions, in every reader.

Local tables are read through DuckDB or line by line (`rows`, `duckdb_reader`); a URL table, local or an fsspec URL
of any size, is streamed a batch at a time (`stream_names`, `batches`: pyarrow for CSV and Parquet, msgspec for
JSONL). A row that cannot be parsed is a `Row` with `bad` set (its line number and what is wrong), or None in a
batch, never fatal; bytes that are not UTF-8 become U+FFFD, counted in `notes["rows_with_invalid_utf8"]`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from collections.abc import Iterator

from openalign.config import ConfigError
from openalign.data.files import Stream, open_lines, open_source, suffix_of

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
URL_TABLE_SUFFIXES = (".parquet", ".csv", ".tsv", ".jsonl")  # streamed, local or remote (`batches`)
# the column vocabulary: for each role, its known names, the first present (without regard to case) is the column
URL_COLUMNS = ("url", "image_url", "img_url")
IMAGE_COLUMNS = ("image", "filepath", "file", "path", "image_path", *URL_COLUMNS)  # a file, or a URL (never fetched)
TEXT_COLUMNS = ("text", "caption", "captions", "alt", "alt_text", "title")
WIDTH_COLUMNS = ("width", "original_width")
HEIGHT_COLUMNS = ("height", "original_height")
PAGE_COLUMNS = ("page_url",)
IMG2DATASET_COLUMNS = {"key", "status", "error_message", "caption", "url"}
PAIR_TABLE_COLUMNS = {"uid", "image_key", "text", "path", "member"}

Kind = Literal["rows", "karpathy", "pairs", "img2dataset"]


def first_column(names: list[str], known: tuple[str, ...]) -> str | None:
    """The column among `names` that is the first of `known`, matched without regard to case (None: none is)."""
    lower = {n.lower(): n for n in reversed(names)}
    return next((lower[k] for k in known if k in lower), None)


# ------------------------------------------------------------------------ a table as a dataset: a file or its parts

@dataclass(frozen=True)
class Dataset:
    """A table given as one file, a directory of parts (Spark's and DuckDB's partitioned writes: `part-*.parquet`,
    `bucket=N/...`) or a glob: its files, all of one format, in their natural order (part-2 before part-10). Read
    as one table by DuckDB (`reader`: every file in one scan, the first file's format)."""

    given: str  # as the user gave it
    files: tuple[str, ...]

    @property
    def suffix(self) -> str:
        return Path(self.files[0]).suffix.lower()

    @property
    def reader(self) -> str:
        """The DuckDB table function over every file, with `param` as its one `?` parameter."""
        return duckdb_reader(Path(self.files[0]))

    @property
    def param(self) -> list[str]:
        return list(self.files)

    def __str__(self) -> str:
        return self.given


def natural(path: str) -> list:
    """A sort key that orders numbered names by their numbers (part-2 before part-10, bucket=9 before bucket=10)."""
    import re

    return [(0, int(piece), "") if piece.isdigit() else (1, 0, piece) for piece in re.split(r"(\d+)", path)]


def is_part(path: Path, root: Path) -> bool:
    """Whether a file under a dataset's folder is one of its parts: not hidden, not under a name starting with `_`
    (Spark's _SUCCESS and _temporary, openalign's _work and _status), not a checksum."""
    relative = path.relative_to(root).parts
    return not any(p.startswith((".", "_")) for p in relative) and not path.name.endswith(".crc")


def dataset(spec: str | Path, suffixes: tuple[str, ...] = URL_TABLE_SUFFIXES, what: str = "a table") -> Dataset:
    """The files of a table given as a file, a directory of parts or a glob (local): every part of one format among
    `suffixes`; one sentence for a spec that is none of them, holds no part, or mixes formats."""
    import glob

    given = str(spec)
    path = Path(given)
    if path.is_file():
        if path.suffix.lower() not in suffixes:
            raise ConfigError(f"{given} is not {what} (a {', '.join(s.lstrip('.') for s in suffixes)} file, a "
                              "directory of them or a glob)")
        found = [given]
    elif path.is_dir():
        found = [str(p) for p in path.rglob("*") if p.is_file() and is_part(p, path)
                 and p.suffix.lower() in suffixes]
    elif any(ch in given for ch in "*?["):
        found = []
        for match in glob.glob(given, recursive=True):
            inside = Path(match)
            found += ([match] if inside.is_file() else
                      [str(p) for p in inside.rglob("*") if p.is_file() and is_part(p, inside)
                       and p.suffix.lower() in suffixes])
    else:
        raise ConfigError(f"{given} does not exist; give {what}: a file, a directory of its parts or a glob")
    found = sorted(dict.fromkeys(found), key=natural)
    if not found:
        raise ConfigError(f"{given} holds no {'/'.join(s.lstrip('.') for s in suffixes)} file; give {what}: a file, a "
                          "directory of its parts or a glob")
    kinds = sorted({Path(f).suffix.lower() for f in found})
    if len(kinds) > 1:
        raise ConfigError(f"{given} mixes {' and '.join(kinds)} files; a table's parts are all of one format, so give "
                          "a glob that picks one (e.g. DIR/*.parquet)")
    return Dataset(given, tuple(found))


@dataclass
class Row:
    number: int  # the line (CSV, JSONL) or row (JSON, Parquet) it came from, from 1
    image: str | None = None
    texts: list[str] = field(default_factory=list)
    label: str | None = None  # the `label` column, where the table has one
    bad: str | None = None  # why the row could not be read ("line 7: not JSON ...")


def sniff_delimiter(path: Path) -> str:
    """A CSV's delimiter from its header line: a tab, comma, semicolon or bar (a tab-separated file named .csv
    is common); `.tsv` files are tab-separated."""
    if Path(path).suffix.lower() == ".tsv":
        return "\t"
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        return header_delimiter(f.readline(), Path(path).suffix.lower())


def header_delimiter(header: str, suffix: str = ".csv") -> str:
    """`sniff_delimiter` of a header line already read (a file read as a stream, an fsspec URL's)."""
    if suffix == ".tsv":
        return "\t"
    try:
        return csv.Sniffer().sniff(header, delimiters="\t,;|").delimiter
    except csv.Error:  # one column, or nothing to tell by
        return ","


def kind(path: Path) -> Kind:
    """What a table file is, by its content: a Karpathy split (a JSON object), a pair table or img2dataset's output
    (a Parquet schema), else rows of images and texts."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix != ".parquet":
        refuse_utf16(path)
    if suffix == ".json":
        with open(path, "rb") as f:
            return "karpathy" if f.read(4096).removeprefix(UTF8_BOM).lstrip().startswith(b"{") else "rows"
    if suffix == ".parquet":
        names = set(parquet_columns(path))
        if PAIR_TABLE_COLUMNS <= names:
            return "pairs"
        if IMG2DATASET_COLUMNS <= names:
            return "img2dataset"
    return "rows"


def parquet_columns(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).names
    except (OSError, pa.ArrowException):
        raise ConfigError(f"{path} is not a readable Parquet file") from None


def names(path: Path) -> list[str]:
    """A table's column names from its header (a CSV's first line, the keys of a JSON table's rows, a schema)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return parquet_columns(path)
    import duckdb

    reader = duckdb_reader(path)
    with duckdb.connect() as con:
        try:
            return [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {reader}", [str(path)]).fetchall()]
        except duckdb.Error as err:
            raise ConfigError(f"cannot read {path} as a {suffix[1:]} table: {str(err).splitlines()[0]}") from None


def duckdb_reader(path: Path, rejects: bool = False) -> str:
    """The DuckDB table function that reads the table `path`, given as its one `?` parameter: Parquet as typed; JSONL
    line by line; a CSV/TSV with a header, its delimiter sniffed, double quotes, every cell as text (`rejects`: the
    rows it cannot parse kept in DuckDB's reject tables instead of failing the read). Every DuckDB read of a table
    (ingest, eval, fetch's URL tables) goes through it."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return "read_parquet(?)"
    if suffix == ".jsonl":
        return "read_json(?, format='newline_delimited')"
    if suffix == ".json":
        return "read_json(?)"
    delimiter = sniff_delimiter(Path(path)).replace("'", "''")
    return (f"read_csv(?, header=true, all_varchar=true, delim='{delimiter}', quote='\"'"
            + (", store_rejects=true)" if rejects else ")"))


def location(value: str, root: Path) -> tuple[str | None, str | None]:
    """(local path, remote URL) of a table's image cell: an http(s) URL is remote (never fetched here: that is
    img2dataset's job), a `file://` URL or a path is local, a relative one under `root`."""
    if value.startswith(("http://", "https://")):
        return None, value
    local = Path(value.removeprefix("file://"))
    return str(local if local.is_absolute() else Path(root) / local), None


def columns(path: Path, names: list[str], image_column: str = "", text_column: str = "",
            need_text: bool = True) -> tuple[str, str | None]:
    """(image column, text column or None) of a table with columns `names`: the ones named, else the first known
    name present; a column named but absent, or none found, is one sentence naming the columns and the flag."""
    found = []
    for role, given, known, flag in (("image", image_column, IMAGE_COLUMNS, "--image-column"),
                                     ("text", text_column, TEXT_COLUMNS, "--text-column")):
        if given and given not in names:
            raise ConfigError(f"{path} has no column {given!r} (columns: {', '.join(names)}); name the {role} column "
                              f"with {flag}")
        name = given or first_column(names, known)
        if name is None and (role == "image" or need_text):
            raise ConfigError(f"{path} has no {role} column: none of {', '.join(known)} (columns: {', '.join(names)}); "
                              f"name it with {flag}")
        found.append(name)
    return found[0], found[1]


def rows(path: Path, image_column: str = "", text_column: str = "", notes: Counter | None = None,
         need_text: bool = True) -> Iterator[Row]:
    """Every row of a CSV/TSV, JSONL, JSON array or Parquet table, streamed, with its image, texts and label."""
    path = Path(path)
    notes = Counter() if notes is None else notes
    suffix = path.suffix.lower()
    if suffix != ".parquet":
        refuse_utf16(path)
    if suffix in (".json", ".jsonl"):
        return _json_rows(path, image_column, text_column, notes, need_text)
    return _duckdb_rows(path, image_column, text_column, notes, need_text)


def dicts(path: Path, delimiter: str = "") -> list[dict[str, str]]:
    """Every row of a small CSV/TSV with a header as {column: text}: a benchmark's ratings or sentence pairs (STS,
    CxC), the paper's tables. The rules for text of every table: UTF-8, bytes that are not UTF-8 as U+FFFD, a BOM
    dropped, UTF-16 refused in one sentence; the delimiter given, else sniffed from the header."""
    path = Path(path)
    refuse_utf16(path)
    text = path.read_bytes().decode("utf-8", errors="replace").removeprefix("\ufeff")
    delimiter = delimiter or header_delimiter(text.partition("\n")[0], path.suffix.lower())
    return list(csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter))


UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def refuse_utf16(path: Path) -> None:
    """A text table written in UTF-16 (as some spreadsheet programs save "Unicode text") is one sentence, not a
    table of mojibake with no usable row."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return  # the reader says what is wrong with it
    if head in UTF16_BOMS:
        raise ConfigError(f"{path} is UTF-16 text; openalign reads tables in UTF-8: convert it, e.g. `iconv -f UTF-16 "
                          f"-t UTF-8 {path} > {path.stem}-utf8{path.suffix}`")


def _texts(value) -> list[str]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [str(v) for v in values if v is not None and str(v).strip()]


def _decoded(raw: bytes, notes: Counter) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        notes["rows_with_invalid_utf8"] += 1
        return raw.decode("utf-8", errors="replace")


def _json_rows(path: Path, image_column: str, text_column: str, notes: Counter, need_text: bool) -> Iterator[Row]:
    """JSONL (an object per line, streamed: it may be larger than memory) or a JSON array of objects, read in
    Python so that one bad line is one bad row."""
    if path.suffix.lower() == ".json":
        try:
            items = json.loads(_decoded(path.read_bytes(), notes).removeprefix("\ufeff"))
        except ValueError as err:
            raise ConfigError(f"cannot read {path} as JSON ({err}); give a JSON array of objects, or JSONL") from None
        except RecursionError:
            raise ConfigError(f"cannot read {path} as JSON (nested too deeply); give a JSON array of objects, or "
                              "JSONL") from None
        if not isinstance(items, list):
            raise ConfigError(f"{path} is not a JSON array of objects (one per row), nor a Karpathy split")
        lines = enumerate(items, 1)
    else:
        def numbered():
            with open(path, "rb") as f:
                for n, raw in enumerate(f, 1):
                    if n == 1:
                        raw = raw.removeprefix(UTF8_BOM)  # a BOM opens the file, not its first row
                    if raw.strip():
                        yield n, _decoded(raw, notes)

        lines = numbered()
    chosen = None
    for number, item in lines:
        try:
            row = json.loads(item) if isinstance(item, str) else item
        except ValueError as err:
            yield Row(number, bad=f"line {number}: not JSON ({err})")
            continue
        except RecursionError:  # one line nested past the parser's depth is one bad row, not the end of the table
            yield Row(number, bad=f"line {number}: not JSON (nested too deeply)")
            continue
        if not isinstance(row, dict):
            yield Row(number, bad=f"line {number}: not a JSON object")
            continue
        if chosen is None:
            chosen = columns(path, list(row), image_column, text_column, need_text)
        image, text = chosen
        value = row.get(image)
        yield Row(number, None if value is None else str(value), _texts(row.get(text)) if text else [],
                  None if row.get("label") is None else str(row["label"]))


def _duckdb_rows(path: Path, image_column: str, text_column: str, notes: Counter, need_text: bool) -> Iterator[Row]:
    """CSV/TSV and Parquet through DuckDB (typed, quoted, multi-line fields, large files). A CSV row DuckDB rejects
    is a bad row, except one whose only fault is bytes that are not UTF-8: it is read again with U+FFFD in their
    place (the one rule for text everywhere)."""
    import duckdb

    is_csv = path.suffix.lower() != ".parquet"
    delim = sniff_delimiter(path) if is_csv else ""
    reader = duckdb_reader(path, rejects=is_csv)
    con = duckdb.connect()
    try:
        try:
            names = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {reader}", [str(path)]).fetchall()]
            image, text = columns(path, names, image_column, text_column, need_text)
            label = '"label"' if "label" in names else "NULL"
            texts = f'"{text}"' if text else "NULL"
            found = con.execute(f'SELECT "{image}", {texts}, {label} FROM {reader}', [str(path)]).fetchall()
        except duckdb.Error as err:
            raise ConfigError(f"cannot read {path} as a {path.suffix[1:]} table: {str(err).splitlines()[0]}") from None
        rejected = con.execute("SELECT line, error_type, error_message FROM reject_errors ORDER BY line").fetchall() \
            if is_csv else []
    finally:
        con.close()
    for number, (value, text_value, label_value) in enumerate(found, 1):
        yield Row(number, None if value is None else str(value), _texts(text_value),
                  None if label_value is None else str(label_value))
    problems: dict[int, tuple[str, str]] = {}  # line -> (kind, message), the first problem of each line
    for line, kind_, message in rejected:
        problems.setdefault(line, (kind_, message))
    encoding_only = {line for line, (kind_, _) in problems.items() if kind_ == "INVALID ENCODING"}
    raw_lines = {}
    if encoding_only:
        with open(path, "rb") as f:
            raw_lines = {n: raw for n, raw in enumerate(f, 1) if n in encoding_only}
    for line, (kind_, message) in sorted(problems.items()):
        if line in raw_lines:
            values = next(csv.reader([raw_lines[line].decode("utf-8", errors="replace")], delimiter=delim), [])
            if len(values) == len(names):
                notes["rows_with_invalid_utf8"] += 1
                row = dict(zip(names, values))
                yield Row(line, row[image], _texts(row.get(text)) if text else [], row.get("label"))
                continue
        yield Row(line, bad=f"line {line}: {kind_.lower()}: {message.splitlines()[0]}")


# ------------------------------------------------------------------ URL tables: local or remote, streamed in batches

def url_columns(path: str, names: list[str], need_text: bool = True) -> dict[str, str | None]:
    """{role: column} of a URL table with columns `names` (url, text, width, height, page_url; None where absent);
    one sentence when it has no URL column, or no text column where `need_text`."""
    found = {role: first_column(names, known) for role, known in
             (("url", URL_COLUMNS), ("text", TEXT_COLUMNS), ("width", WIDTH_COLUMNS), ("height", HEIGHT_COLUMNS),
              ("page_url", PAGE_COLUMNS))}
    for role, known in (("url", URL_COLUMNS), ("text", TEXT_COLUMNS)):
        if found[role] is None and (role == "url" or need_text):
            raise ConfigError(f"{path} has no {role} column: none of {', '.join(known)} (columns: "
                              f"{', '.join(names[:20])}); a URL table needs an image URL"
                              + (" and a text per row" if need_text else " per row"))
    return found


def stream_names(path: str) -> list[str]:
    """A URL table's column names (a local path or an fsspec URL), read from its head: a CSV's header line, the keys
    of a JSONL table's first object, a Parquet footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    suffix = suffix_of(path)
    try:
        if suffix == ".jsonl":
            return _jsonl_names(path)
        if suffix in (".csv", ".tsv"):
            with _csv_reader(path) as reader:
                return reader.schema.names
        with open_source(path, random_access=True) as f:
            return pq.read_schema(f).names
    except (OSError, ValueError, pa.ArrowException) as err:
        raise ConfigError(f"cannot read {path} as a {suffix[1:] or 'parquet'} table: {str(err).splitlines()[0]}") \
            from None


def batches(path: str, wanted: list[str], notes: Counter | None = None) -> Iterator[list[dict | None]]:
    """The columns `wanted` of every row of a URL table, streamed a batch at a time in the table's order: a dict per
    row, None for a row that cannot be read (a JSONL line that is not a JSON object, a CSV row of the wrong number of
    fields). A CSV's bytes that are not UTF-8 become U+FFFD, the lines that held them counted in
    `notes["rows_with_invalid_utf8"]` (`Utf8Lines`)."""
    import pyarrow.parquet as pq

    notes = Counter() if notes is None else notes
    suffix = suffix_of(path)
    if suffix == ".jsonl":
        yield from _jsonl_batches(path, wanted)
    elif suffix in (".csv", ".tsv"):
        invalid: list[str] = []
        delimiter, names = _header(path)
        with _csv_reader(path, wanted, invalid, delimiter, notes) as reader:
            for batch in itertools.chain(reader, [None]):  # None: the rows skipped in the last block
                rows = batch.to_pylist() if batch is not None else []
                if invalid:  # after the rows around them
                    rows += [r if r is None else {k: r[k] for k in wanted}
                             for r in _recovered(invalid, names, wanted, delimiter)]
                    invalid.clear()
                yield rows
    else:
        with open_source(path, random_access=True) as f:
            for batch in pq.ParquetFile(f).iter_batches(columns=wanted, batch_size=65_536):
                yield batch.to_pylist()


def _jsonl_batches(path: str, wanted: list[str]) -> Iterator[list[dict | None]]:
    import msgspec

    with io.TextIOWrapper(open_lines(path), encoding="utf-8", errors="replace") as f:
        batch = []
        for line in f:
            try:
                row = msgspec.json.decode(line)  # like a WAT record's (a lone surrogate is a bad row)
            except (ValueError, RecursionError):
                row = None
            batch.append({k: row.get(k) for k in wanted} if isinstance(row, dict) else None)
            if len(batch) >= 65_536:
                yield batch
                batch = []
        yield batch


def _jsonl_names(path: str, lines: int = 1000) -> list[str]:
    """A JSONL table's columns: the keys of its first line that is a JSON object (a bad line before it, nested past
    msgspec's depth limit or not JSON at all, is a bad row of its own, not a file that cannot be read)."""
    import msgspec

    with open_lines(path) as f:
        for _, line in zip(range(lines), f):
            try:
                row = msgspec.json.decode(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict):
                return list(row)
    return []


@contextlib.contextmanager
def _csv_reader(path: str, columns: list[str] | None = None, invalid: list | None = None,
                delimiter: str | None = None, notes: Counter | None = None):
    """A streaming CSV/TSV reader (pyarrow); with `columns`, only those. A row of the wrong number of fields is
    skipped, its text put in `invalid` (one such row would otherwise fail Arrow's whole file)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    delimiter = delimiter or _header(path)[0]
    convert = pacsv.ConvertOptions(column_types={name: pa.string() for name in columns or ()},
                                   include_columns=columns or [], strings_can_be_null=True)

    def skipped(row) -> str:
        if invalid is not None:
            invalid.append(row.text)
        return "skip"

    parse = pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=skipped)
    with open_source(path) as f, pacsv.open_csv(Utf8Lines(Stream(f), Counter() if notes is None else notes),
                                                parse_options=parse, convert_options=convert,
                                                read_options=pacsv.ReadOptions(block_size=1 << 22)) as reader:
        yield reader


class Utf8Lines(io.RawIOBase):
    """A text file's bytes as UTF-8, read front to back: a line holding bytes that are not UTF-8 has U+FFFD in their
    place (the rule for text everywhere: `rows` reads such a row so too) and is counted
    (`notes["rows_with_invalid_utf8"]`). Arrow's CSV reader needs it: it decodes a value, and a row it cannot
    split, as UTF-8, and one such byte failed the whole file. A block of 4 MiB is checked in one decode; only a
    block that fails is repaired line by line."""

    def __init__(self, stream: io.RawIOBase, notes: Counter, block: int = 1 << 22):
        super().__init__()
        self.lines = io.BufferedReader(stream, buffer_size=1 << 20)
        self.notes, self.block = notes, block
        self.pending, self.at = b"", 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:
        while self.at >= len(self.pending):
            lines = self.lines.readlines(self.block)
            if not lines:
                return 0
            self.pending, self.at = self._repaired(lines), 0
        n = min(len(buffer), len(self.pending) - self.at)
        buffer[:n] = self.pending[self.at:self.at + n]
        self.at += n
        return n

    def _repaired(self, lines: list[bytes]) -> bytes:
        data = b"".join(lines)
        try:
            data.decode("utf-8")
            return data
        except UnicodeDecodeError:
            pass
        repaired = []
        for line in lines:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                self.notes["rows_with_invalid_utf8"] += 1
                line = line.decode("utf-8", "replace").encode("utf-8")
            repaired.append(line)
        return b"".join(repaired)

    def close(self) -> None:
        if not self.closed:
            self.lines.close()
        super().close()


def _header(path: str) -> tuple[str, list[str]]:
    """A CSV/TSV's delimiter and column names, from its first line."""
    with open_lines(path) as f:
        line = f.readline().decode("utf-8", "replace").removeprefix("\ufeff")
    delimiter = header_delimiter(line, suffix_of(path))
    return delimiter, next(csv.reader([line.rstrip("\r\n")], delimiter=delimiter), [])


def _recovered(texts: list[str], names: list[str], wanted: list[str], delimiter: str) -> Iterator[dict | None]:
    """The rows inside rows Arrow skipped: a quote that is never closed takes in every line after it, so the first
    line is the bad row (None) and each line after it is read on its own (ingest's reading: DuckDB rejects the row
    alone); a line of the wrong number of fields is bad too."""
    for text in texts:
        first, *rest = text.split("\n")
        yield None
        for line in rest:
            if not line.strip():
                continue
            values = next(csv.reader([line], delimiter=delimiter, strict=False), [])
            yield dict(zip(names, values)) if len(values) == len(names) and all(n in names for n in wanted) else None


def quoted(column: str) -> str:
    """A column's name as a DuckDB identifier."""
    return '"' + column.replace('"', '""') + '"'


def text_sql(column: str, sql_type: str) -> str:
    """DuckDB's expression of a table's column as the text the user wrote: a JSON value (a JSONL column whose rows
    differ in type) unquoted, anything else cast."""
    name = quoted(column)
    if sql_type == "JSON":
        return f"json_extract_string({name}, '$')"
    return f"CAST({name} AS VARCHAR)"


def texts_sql(column: str, sql_type: str) -> str:
    """DuckDB's expression of a text column as a list of texts: a list (a JSONL `captions` list, a Parquet list
    column; an empty one is one NULL, a row without a text) is its items, anything else one text. `unnest` of it
    is one row per caption."""
    name = quoted(column)
    if sql_type.endswith("[]"):
        return f"CASE WHEN len({name}) > 0 THEN CAST({name} AS VARCHAR[]) ELSE [NULL::VARCHAR] END"
    if sql_type == "JSON":
        return (f"CASE WHEN json_type({name}) <> 'ARRAY' OR {name} IS NULL THEN [json_extract_string({name}, '$')] "
                f"WHEN json_array_length({name}) > 0 THEN json_extract_string({name}, '$[*]') "
                f"ELSE [NULL::VARCHAR] END")
    return f"[{text_sql(column, sql_type)}]"


# ------------------------------------------------------------------------------------ img2dataset's Parquet files

IMG2DATASET_IMAGE_COLUMNS = ("jpg", "png", "webp")  # its --encode_format: the image column of its `parquet` output


def img2dataset_image_column(schema) -> str | None:
    """The binary column holding the images of img2dataset's `parquet` output (its --encode_format), if any."""
    import pyarrow as pa

    return next((c for c in IMG2DATASET_IMAGE_COLUMNS
                 if c in schema.names and pa.types.is_binary(schema.field(c).type)), None)


def img2dataset_kind(path: Path) -> str | None:
    """"img2dataset" for img2dataset's `parquet` output (its images in a binary column), "img2dataset-status" for
    the status sidecar it writes beside each tar or folder of its other outputs; None for any other Parquet (or a
    file that is not one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return None
    if not IMG2DATASET_COLUMNS <= set(schema.names):
        return None
    return "img2dataset" if img2dataset_image_column(schema) else "img2dataset-status"


def img2dataset_rows(path: Path, columns: list[str], images: bool = True) -> Iterator[dict]:
    """The rows of an img2dataset Parquet file, a row group at a time: the `columns` it has, and (`images`) its image
    bytes as `image` (None where it has no image column)."""
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    image = img2dataset_image_column(table.schema_arrow) if images else None
    present = [c for c in columns if c in table.schema_arrow.names]
    for group in range(table.num_row_groups):
        for row in table.read_row_group(group, columns=present + ([image] if image else [])).to_pylist():
            yield {c: row.get(c) for c in columns} | ({"image": row[image] if image else None} if images else {})
