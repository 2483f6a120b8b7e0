"""Tables of image/text rows, read one way by every command (ingest, eval, embed, dedup).

    X.csv  X.tsv   by header; the delimiter is sniffed (a tab-separated .csv is common: OpenCLIP reads and writes them)
    X.jsonl        one JSON object per line, streamed
    X.json         a JSON array of objects; an object with "images" is a Karpathy split instead (told by content)
    X.parquet      columns; a pair table from `openalign ingest`, or img2dataset's output, is told by its schema

What a file is comes from its content, not from the command that reads it (`kind`). The image and the text column
are found the same way everywhere (`columns`): the names given (`--image-column`, `--text-column`), else the first
present of `IMAGE_COLUMNS` and `TEXT_COLUMNS`: openalign's and CLIP_benchmark's `image`/`caption`, a pair table's
`text`, OpenCLIP's `filepath`/`title`, img2dataset's `url`/`caption`. A text value that is a list (a JSONL
`captions` list) is several captions.

Rows are streamed (`rows`). A row that cannot be parsed is a `Row` with `bad` set (its line number and what is
wrong), never fatal; bytes that are not UTF-8 become U+FFFD, counted in `notes["rows_with_invalid_utf8"]`.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from collections.abc import Iterator

from openalign.config import ConfigError

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
IMAGE_COLUMNS = ("image", "filepath", "file", "path", "image_path", "url")  # the first present is the image column
TEXT_COLUMNS = ("text", "caption", "captions", "title")  # the first present is the text column
URL_COLUMNS = ("url", "image_url", "img_url")  # a URL table's (extract, fetch): matched without regard to case
ALT_COLUMNS = ("text", "caption", "alt", "alt_text", "title")  # and its alt-text's: COYO, LAION, DataComp, img2dataset
IMG2DATASET_COLUMNS = {"key", "status", "error_message", "caption", "url"}
PAIR_TABLE_COLUMNS = {"uid", "image_key", "text", "path", "member"}

Kind = Literal["rows", "karpathy", "pairs", "img2dataset"]


def first_column(names: list[str], known: tuple[str, ...]) -> str | None:
    """The column among `names` that is the first of `known`, matched without regard to case (None: none is)."""
    lower = {n.lower(): n for n in reversed(names)}
    return next((lower[k] for k in known if k in lower), None)


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
        name = given or next((n for n in known if n in names), None)
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
