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
  stream reader hands on the cut record, which fails to parse);
- **uniqueness**: one row per (url, alt) across the whole output, the first seen kept, in input order; cc2dataset's
  uid is md5(alt + url), so ("ab", "c") and ("a", "bc") collide there; here `uid` is the pair uid of
  (image_key, text) and `image_key` a hash of the url, as a pair table's.

Beyond cc2dataset: each text's language (`language`, `language_score`: data/language.py; `--languages en` keeps
English alone) and, where the language is written without spaces (zh, ja, th), its words (`words`: data/words.py),
which the filter's rules split; `openalign filter DIR/candidates.parquet` runs the text rules before any download.

Output under DIR: `candidates.parquet` (CANDIDATE_SCHEMA) and `candidates.manifest.json` (stage `extract`, written
last: the table is finished), and `parts/` (a part and a status per input file: a rerun skips the files that are
unchanged and redoes the others; both engines run one task per file).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import ipaddress
import json
import re
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Iterator
from urllib.parse import urljoin, urlparse, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign.config import POSITIVE_INT, ConfigError, check
from openalign.data import tables
from openalign.data.engine import Engine, Job, cores, job_id, run_jobs
from openalign.data.language import identify, known_languages
from openalign.data.words import check_segmenters, segment
from openalign.data.pairs import manifest_path, normalize_text, pair_uids, url_keys
from openalign.outputs import sources_key, staged, unfinish, write_json

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
class ExtractOptions:
    batch_rows: Annotated[int, POSITIVE_INT] = 8_192  # rows a task buffers before it writes a row group
    language: bool = True  # identify each text's language (fastText lid.176, shipped in its package)
    languages: tuple[str, ...] = ()  # keep only texts in these languages (ISO 639-1, e.g. en: the paper's); ()=all
    words: bool = True  # segment Chinese, Japanese and Thai texts into words (the words column; needs [words])

    def __post_init__(self):
        check(self, spell=lambda name: f"extract.{name}")
        if self.languages and not self.language:
            raise ConfigError("--languages keeps texts by their language, which --no-language leaves unknown; "
                              "drop one of them")

    @property
    def segments(self) -> bool:
        """Whether texts are segmented into words: which ones follows from their language, so not without it."""
        return self.words and self.language


# ---------------------------------------------------------------------------------------------------- reading


TABLE_SUFFIXES = (".parquet", ".csv", ".tsv", ".jsonl")
URL_COLUMNS, TEXT_COLUMNS = tables.URL_COLUMNS, tables.ALT_COLUMNS  # a URL table's, matched without regard to case
WIDTH_COLUMNS = ("width", "original_width")  # the image's size where the table knows it (COYO, LAION: width;
HEIGHT_COLUMNS = ("height", "original_height")  # DataComp: original_width)
PAGE_COLUMNS = ("page_url",)


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


def kind_of(path: str) -> str:
    """What an input is, by its content: `table` for a URL table (Parquet by its magic bytes; CSV, TSV or JSONL
    by its name), else `wat` or `warc` (see `archive_kind`)."""
    try:
        with open_source(path) as stream:
            head = stream.read(4)
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    if head == b"PAR1" or (not head.startswith(b"\x1f\x8b") and not head.startswith(b"WARC")
                            and suffix_of(path) in TABLE_SUFFIXES):
        table_columns(path)  # a table with a URL and a text column, or one sentence
        return "table"
    return archive_kind(path)


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


def target_uri(value) -> str:
    """A record's WARC-Target-URI: GNU wget writes it in angle brackets (`<http://...>`, as WARC 1.1's grammar has
    it), Common Crawl without."""
    text = value.strip() if isinstance(value, str) else ""
    return text[1:-1].strip() if text.startswith("<") and text.endswith(">") else text


def absolute(url: str, base: str) -> tuple[str | None, str]:
    """(the absolute http(s) URL of `url` on a page whose base is `base`, or None; the reason when None)."""
    url, why = Base(base).resolve(url)
    return (url, "") if url is not None and url_host(url) else (None, why or "bad_url")


# urljoin's shortcut below applies to printable ASCII without ' ', '#', ';', '[', ']' or '\\' (fragments, params,
# IPv6 literals: urljoin's rarer branches; such links take urljoin itself)
PLAIN = re.compile(r'[!"$-:<-Z^-~]+')
# an http(s) URL of such characters: (scheme, authority, path), where the path ends the URL or a query or fragment does
PLAIN_BASE = re.compile(r'(https?)://([!"$-.0-:<->@-Z^-~]+)((?:/[!"$-:<->@-Z^-~]*)?)(?:$|[?#])')


class Base:
    """A page's base URL, parsed once, resolving its links to absolute http(s) URLs.

    `resolve` gives urljoin's result (tests/pipeline/test_extract.py checks it on tens of thousands of generated
    links), written out for the shapes nearly every link has, where urljoin's result is a concatenation:
    scheme-relative (`//cdn/x.jpg`), host-relative (`/img/x.jpg`) and a relative path (`img/x.jpg`, `../img/x.jpg`)
    on a base whose path has no dot or empty segments; anything else goes to urljoin. urljoin was the stage's largest
    cost, as it is cc2dataset's."""

    __slots__ = ("url", "scheme", "origin", "folder")

    def __init__(self, url: str):
        self.url, self.scheme, self.origin, self.folder = url, "", None, None
        plain = PLAIN_BASE.match(url)
        if plain is not None:  # what urlparse gives for such a URL, a tenth of its time
            scheme, netloc, path = plain.groups()
        else:
            try:
                scheme, netloc, path, _, _, _ = urlparse(url)
            except ValueError:
                return
        if scheme in HTTP_SCHEMES and netloc and PLAIN.fullmatch(netloc):
            self.scheme, self.origin = scheme, f"{scheme}://{netloc}"
            if "//" not in path and "/." not in path and ";" not in path and (not path or path[0] == "/"):
                self.folder = path[:path.rfind("/") + 1] or "/"

    def resolve(self, src: str) -> tuple[str | None, str]:
        """(the absolute http(s) URL of a link's source, or None; the reason when None). The URL's host is checked
        a column at a time (`hosts`): one without a host is dropped there as `bad_url`."""
        src = src.strip()
        if src.startswith(HTTP):
            return src, ""
        if not src:
            return None, "empty_src"
        if self.origin is not None and src[-1] != "?" and PLAIN.fullmatch(src):  # urljoin's result, written out
            if src[0] == "/":
                if src[1:2] != "/":
                    if "/." not in src:
                        return self.origin + src, ""  # host-relative
                elif src[2:3] not in ("/", "?", ""):
                    return f"{self.scheme}:{src}", ""  # scheme-relative, with a host
            elif self.folder is not None and src[0] != "?" and ":" not in src and "//" not in src:
                rest, up = src, 0
                while rest[:2] == "./" or rest[:3] == "../":  # leading dot segments: urljoin's parent folders
                    up, rest = (up + 1, rest[3:]) if rest[1] == "." else (up, rest[2:])
                if rest and rest[0] not in ".?" and "/." not in rest:
                    folder = self.folder
                    if up:
                        names = folder.split("/")[1:-1]
                        folder = "/" + "".join(name + "/" for name in names[:max(0, len(names) - up)])
                    return self.origin + folder + rest, ""  # a relative path
        if src[:8].lower().startswith(HTTP):
            return src, ""
        try:
            url = urljoin(self.url, src)
        except ValueError:
            return None, "bad_url"
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if not scheme or "/" in scheme:
            return None, "relative_url"  # a table's URL with no page to resolve it against
        if scheme not in HTTP_SCHEMES:
            return None, f"scheme_{scheme if scheme.isalnum() and len(scheme) <= 16 else 'other'}"
        return url, ""


HTTP = ("http://", "https://")
HTTP_SCHEMES = ("http", "https")
NETLOC = re.compile(r"[^:]*://([^/?#]*)")  # the authority after the scheme's "://"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def url_host(url: str) -> str:
    """The lower-case host of an absolute URL, "" where it has none: urlsplit's `hostname` ("" too where urlsplit
    raises: unbalanced brackets, a bracketed host that is not an IPv6 address; and where the URL holds a control
    character, which urlsplit would drop or keep), without building the whole split."""
    if CONTROL.search(url):
        return ""
    match = NETLOC.match(url)
    if match is None:  # no authority after the scheme ("http:x/y"): no host
        return ""
    netloc = match.group(1)
    if "[" not in netloc and "]" not in netloc:
        return netloc.rpartition("@")[2].partition(":")[0].lower()
    if "[" not in netloc or "]" not in netloc:
        return ""
    host = netloc.rpartition("@")[2]
    inside = netloc.partition("[")[2].partition("]")[0]
    if not (inside.startswith("v") and re.fullmatch(r"v[a-fA-F0-9]+\..+", inside)):
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            return ""
    return (host.partition("[")[2].partition("]")[0] if "[" in host else host.partition(":")[0]).lower()


def hosts(urls: pa.Array) -> pa.Array:
    """`url_host` of each URL, a column at a time: one regular expression (RE2, in Arrow) for the authorities of
    printable ASCII without brackets, nearly all of them; the others one at a time."""
    import pyarrow.compute as pc

    found = pc.utf8_lower(pc.struct_field(pc.extract_regex(urls, PLAIN_HOST), 0).fill_null(""))
    odd = pc.or_(pc.match_substring_regex(urls, ODD_NETLOC), pc.match_substring_regex(urls, CONTROL.pattern))
    if pc.any(odd).as_py():
        slow = pa.array([url_host(url) for url in pc.filter(urls, odd).to_pylist()], pa.string())
        found = pc.replace_with_mask(found, odd, slow)
    return found


PLAIN_HOST = r"^[^:]*://(?:[^/?#]*@)?(?P<host>[^/?#:]*)"  # url_host where the authority is ODD_NETLOC's opposite
ODD_NETLOC = r"^[^:]*://[^/?#]*[^!-~]|^[^:]*://[^/?#]*[\[\]]"  # an authority with brackets, or not printable ASCII
NO_BASE = Base("")  # a URL table's: its URLs must be absolute


def resolve_base(page_url: str, href) -> Base:
    """The base a page's relative links resolve against: its `<base href>` resolved against the page, else the page."""
    if not isinstance(href, str):
        return Base(page_url)
    try:
        return Base(urljoin(page_url, href))
    except ValueError:
        return Base(page_url)


def pair(alt, src: str, base: Base, counts: Counter) -> tuple[str, str] | None:
    """(absolute image URL, text) of one image's alt (None: the tag has none) and source, or None with the
    reason counted: the rules every kind of input shares."""
    if not isinstance(alt, str):
        counts["no_alt"] += 1
        return None
    text = normalize_text(alt)
    if not text:
        counts["empty_alt"] += 1
        return None
    url, why = base.resolve(src)
    if url is None:
        counts[why] += 1
        return None
    return url, text


# A candidate as a reader yields it: (url, text, page_url, offset, width, height)
Found = tuple[str, str, "str | None", int, "int | None", "int | None"]


def wat_candidates(path: str, counts: Counter) -> Iterator[list[Found]]:
    """The candidates of one WAT file, a page's at a time, in record order (not yet unique), counting what is
    dropped and why. Each record's JSON is parsed by orjson (3x the standard library's json here; like cc2dataset's
    simdjson it refuses what is not UTF-8, such as an escaped lone surrogate, and such a record is a
    `bad_record`)."""
    import orjson
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with open_source(path) as stream:
        try:
            for record in ArchiveIterator(stream, record_types=WarcRecordType.metadata, parse_http=False):
                data = record.reader.read()
                if len(data) < record.content_length:  # the file ends inside this record
                    counts["truncated_record"] += 1
                    break
                counts["records"] += 1
                if IMG_SRC not in data:  # request records, pages without images: no JSON to parse
                    continue
                try:
                    envelope = orjson.loads(data)["Envelope"]
                    page_url = target_uri(envelope["WARC-Header-Metadata"]["WARC-Target-URI"])
                    html = envelope["Payload-Metadata"]["HTTP-Response-Metadata"]["HTML-Metadata"]
                    links = html["Links"]
                except (ValueError, KeyError, TypeError):
                    counts["bad_record"] += 1
                    continue
                counts["pages"] += 1
                head = html.get("Head")
                base = resolve_base(page_url, head.get("Base") if isinstance(head, dict) else None)
                offset, images, page = record.stream_pos, 0, []
                for link in links if isinstance(links, list) else ():
                    if link.__class__ is not dict or link.get("path") != "IMG@/src":
                        continue
                    images += 1
                    src = link.get("url")
                    found = pair(link.get("alt"), src if src.__class__ is str else str(src or ""), base, counts)
                    if found:
                        page.append((found[0], found[1], page_url, offset, None, None))
                counts["images"] += images
                yield page
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile):  # a gzip member that cannot be inflated
            counts["truncated_record"] += 1


HTML_TYPES = ("text/html", "application/xhtml+xml")


def warc_candidates(path: str, counts: Counter) -> Iterator[list[Found]]:
    """The candidates of one WARC file's HTML responses, a page's at a time, in record order: each `<img>`'s source
    and alt, parsed by selectolax (lexbor); the source is `data-src` where the tag has one (lazy loading: `src` holds
    a placeholder until a script swaps them), else `src`, else the first `srcset` candidate; width and height where
    the tag declares them as whole numbers. `<picture>`'s `<source>`s are not pairs: its `<img>` (the fallback) carries
    the alt."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from selectolax.lexbor import LexborHTMLParser

    with open_source(path) as stream:
        try:
            for record in ArchiveIterator(stream, record_types=WarcRecordType.response, parse_http=True):
                counts["records"] += 1
                if (record.http_content_type or "").lower() not in HTML_TYPES:
                    continue
                status = record.http_headers.status_code if record.http_headers is not None else None
                if status is not None and status != 200:
                    continue
                body = record.reader.read()
                page_url = target_uri(record.headers.get("WARC-Target-URI"))
                try:
                    tree = LexborHTMLParser(body.decode(record.http_charset or "utf-8", "replace"))
                except (LookupError, ValueError):  # an unknown charset name
                    tree = LexborHTMLParser(body.decode("utf-8", "replace"))
                counts["pages"] += 1
                tag = tree.css_first("base[href]")
                base = resolve_base(page_url, (tag.attributes.get("href") or "").strip() if tag is not None else None)
                page = []
                for img in tree.css("img"):
                    counts["images"] += 1
                    attrs = img.attributes
                    found = pair(attrs.get("alt") or "" if "alt" in attrs else None, _img_source(attrs), base, counts)
                    if found:
                        page.append((*found, page_url, record.stream_pos, _dimension(attrs.get("width")),
                                     _dimension(attrs.get("height"))))
                yield page
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
            counts["truncated_record"] += 1


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
    """{role: column} of a URL table (url, text, width, height, page_url; the last three where present), matched
    without regard to case; one sentence when it has no URL or no text column."""
    names = _table_names(path)
    found = {role: tables.first_column(names, known) for role, known in
             (("url", URL_COLUMNS), ("text", TEXT_COLUMNS), ("width", WIDTH_COLUMNS), ("height", HEIGHT_COLUMNS),
              ("page_url", PAGE_COLUMNS))}
    for role, known in (("url", URL_COLUMNS), ("text", TEXT_COLUMNS)):
        if found[role] is None:
            raise ConfigError(f"{path} has no {role} column: none of {', '.join(known)} (columns: "
                              f"{', '.join(names[:20])}); a URL table needs an image URL and a text per row")
    return found


def _table_names(path: str) -> list[str]:
    import pyarrow as pa

    suffix = suffix_of(path)
    try:
        if suffix == ".jsonl":
            with open_lines(path) as f:
                first = json.loads(f.readline().decode("utf-8", "replace") or "{}")
            return list(first) if isinstance(first, dict) else []
        if suffix in (".csv", ".tsv"):
            with _csv_reader(path) as reader:
                return reader.schema.names
        with open_source(path, random_access=True) as f:
            return pq.read_schema(f).names
    except (OSError, ValueError, pa.ArrowException) as err:
        raise ConfigError(f"cannot read {path} as a {suffix[1:] or 'parquet'} table: {str(err).splitlines()[0]}") \
            from None


@contextlib.contextmanager
def _csv_reader(path: str, columns: list[str] | None = None):
    """A streaming CSV/TSV reader (pyarrow); with `columns`, only those, read as text."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from openalign.data.tables import header_delimiter

    with open_lines(path) as f:
        delimiter = header_delimiter(f.readline().decode("utf-8", "replace"), suffix_of(path))
    convert = pacsv.ConvertOptions(column_types={name: pa.string() for name in columns or ()},
                                   include_columns=columns or [], strings_can_be_null=True)
    with open_source(path) as f, pacsv.open_csv(
            Stream(f), parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
            convert_options=convert, read_options=pacsv.ReadOptions(block_size=1 << 22)) as reader:
        yield reader


def _batches(path: str, wanted: list[str]) -> Iterator[list[dict]]:
    import orjson

    suffix = suffix_of(path)
    if suffix == ".jsonl":
        with io.TextIOWrapper(open_lines(path), encoding="utf-8", errors="replace") as f:
            batch = []
            for line in f:
                try:
                    row = orjson.loads(line)  # like a WAT record's (a lone surrogate is a bad row)
                except ValueError:
                    row = None
                batch.append({k: row.get(k) for k in wanted} if isinstance(row, dict) else None)
                if len(batch) >= 65_536:
                    yield batch
                    batch = []
            yield batch
    elif suffix in (".csv", ".tsv"):
        with _csv_reader(path, wanted) as reader:
            for batch in reader:
                yield batch.to_pylist()
    else:
        with open_source(path, random_access=True) as f:
            for batch in pq.ParquetFile(f).iter_batches(columns=wanted, batch_size=65_536):
                yield batch.to_pylist()


def table_candidates(path: str, counts: Counter) -> Iterator[list[Found]]:
    """The candidates of a URL table made elsewhere (COYO-700M's, LAION's or DataComp's Parquet, a CSV of url
    and caption), streamed a batch at a time: the same URL and text rules as pages (an absolute http(s) URL, a text
    after whitespace collapsing), with the table's width and height where it has them; `offset` is the row number."""
    columns = table_columns(path)
    wanted = list(dict.fromkeys(c for c in columns.values() if c))
    number = 0
    for batch in _batches(path, wanted):
        found_rows = []
        for row in batch:
            number += 1
            counts["rows"] += 1
            if row is None:
                counts["bad_record"] += 1
                continue
            found = pair(str(row[columns["text"]] or ""), str(row[columns["url"]] or ""), NO_BASE, counts)
            if not found:
                continue
            page = row.get(columns["page_url"]) if columns["page_url"] else None
            found_rows.append((*found, str(page) if page else None, number,
                               _dimension(row.get(columns["width"])) if columns["width"] else None,
                               _dimension(row.get(columns["height"])) if columns["height"] else None))
        yield found_rows


def part_table(found: list[Found], source: str, start: int, counts: Counter,
               options: ExtractOptions = ExtractOptions()) -> pa.Table:
    """Candidates as a part's rows (PART_SCHEMA), numbered from `start` in their file's order, with their hosts (a
    URL without one is dropped and counted, `bad_url`), their texts' languages (one not in `options.languages` is
    dropped and counted, `other_language`) and keys, as a pair table's: image_key = a hash of the url, uid = the
    pair uid of (image_key, text)."""
    import pyarrow.compute as pc

    urls, texts, pages, offsets, widths, heights = zip(*found) if found else ((),) * 6
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
               "source": pa.array([source] * len(found), pa.string()),
               "offset": pa.array(offsets, pa.int64()), "width": pa.array(widths, pa.int32()),
               "height": pa.array(heights, pa.int32()), "seq": pa.array(np.arange(start, start + len(found)))}
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
        for found in read(path, counts):
            batch += found
            if len(batch) >= options.batch_rows:
                writer.write_table(part_table(batch, path, written, counts, options))
                written += len(batch)
                batch = []
        writer.write_table(part_table(batch, path, written, counts, options))
    counts["pairs"] += 0  # present when a file has none
    return dict(counts)


def inputs(sources: list[str]) -> list[str]:
    """The input files: each source a file, a directory (its files, sorted) or a glob, local or an fsspec URL (an
    HTTP(S) URL ending in `/` is a directory: its index page's links); one sentence for a missing one."""
    import glob

    files: list[str] = []
    for source in sources:
        if is_url(source):
            files += _remote_files(source)
            continue
        path = Path(source)
        if path.is_dir():
            files += sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(source)
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


def _remote_files(source: str) -> list[str]:
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


def extract(sources: list[str], out: Path, options: ExtractOptions = ExtractOptions(), engine: Engine = Engine(),
            progress: bool = True) -> ExtractResult:
    """Write OUT/candidates.parquet, OUT/extract_report.png and, last, OUT/candidates.manifest.json from web
    archives and URL tables (see the module); returns what was written and counted."""
    out = Path(out)
    unknown = sorted(set(options.languages) - known_languages()) if options.languages else []
    if unknown:
        raise ConfigError(f"--languages {','.join(unknown)}: not a language the identifier knows (ISO 639-1 codes "
                          f"such as en, de, zh, ja; 'und' for texts with none)")
    if options.segments:
        check_segmenters()
    files = inputs(sources)
    kinds, versions = probe(files)  # every input is readable and of a known kind, before any work
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"cannot write {out}: it, or a folder above it, is a file; choose another --out") from None
    table = out / "candidates.parquet"
    manifest = manifest_path(table)
    unfinish(manifest)
    start = time.perf_counter()
    parts = out / "parts"
    parts.mkdir(exist_ok=True)
    jobs = [Job(job_id(i), extract_file, (f, str(parts / f"{job_id(i)}.parquet"), options, kinds[f]),
                key=sources_key(versions[f], asdict(options)), outputs=(str(parts / f"{job_id(i)}.parquet"),))
            for i, f in enumerate(files)]
    for stale in parts.glob("*.parquet"):  # parts of files no longer given
        if stale.stem not in {t.id for t in jobs}:
            stale.unlink()
    results, resumed = run_jobs(jobs, parts / "_status", engine, "extract", progress)
    counts: Counter = Counter()
    per_file = {}
    rows, unique = _merge(jobs, table, cores(engine))  # --workers 1: one core, the merge's too
    for job, f, distinct in zip(jobs, files, unique):
        summary = {k: v for k, v in results[job.id].items() if isinstance(v, int)}
        summary["duplicate"] = summary.pop("pairs") - distinct  # a pair its own file already had
        summary["candidates"] = distinct
        per_file[str(f)] = summary
        counts.update(summary)
    distinct, top, languages = _tallies(table, cores(engine), options.language)
    written = {
        "stage": "extract", "sources": [str(s) for s in sources], "files": len(files), "kinds": dict(Counter(
            kinds.values())), "options": asdict(options), "engine": engine.name, "resumed_tasks": resumed,
        "out": str(table), "candidates": rows, "duplicates_across_files": counts["candidates"] - rows,
        "counts": dict(sorted(counts.items())), "per_file": per_file, "hosts": distinct, "top_hosts": top,
        "languages": languages,
        "text_normalization": "runs of whitespace collapsed to one space, ends stripped; case and characters kept",
        "seconds": round(time.perf_counter() - start, 2),
    }
    report = out / "extract_report.png"
    with staged(report) as tmp:
        plot_report(written, Path(tmp))
    write_json(manifest, written)  # last: the table is finished
    return ExtractResult(table, rows, len(files), written["counts"], per_file, written["duplicates_across_files"],
                         distinct, [tuple(t) for t in top], languages, resumed, written["seconds"], report, written)


READ_COUNTS = ("records", "pages", "images", "rows", "candidates", "duplicate")  # the rest are reasons for dropping


def plot_report(manifest: dict, path: Path, top: int = 15) -> None:
    """Three panels: why links were dropped (and how many became candidates), the hosts with the most candidates,
    and the candidates' languages (where they were identified)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = manifest["counts"]
    reasons = sorted(((k, v) for k, v in counts.items() if k not in READ_COUNTS), key=lambda kv: -kv[1])
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
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def _tallies(table: Path, threads: int, languages: bool, top: int = 50) -> tuple[int, list[list], dict[str, int]]:
    """(distinct image hosts, the `top` hosts with the most candidates, {language: candidates} the most first, or {}
    where languages were not identified): one DuckDB connection over the finished table."""
    import duckdb

    def most(column: str, limit: str = "") -> list[tuple]:
        return con.execute(f"SELECT {column}, count(*) AS n FROM read_parquet(?) GROUP BY {column} "
                           f"ORDER BY n DESC, {column} {limit}", [str(table)]).fetchall()

    with duckdb.connect(config={"threads": threads}) as con:
        distinct = con.execute("SELECT count(DISTINCT host) FROM read_parquet(?)", [str(table)]).fetchone()[0]
        hosts = [[host, int(n)] for host, n in most("host", f"LIMIT {int(top)}")]
        found = {language: int(n) for language, n in most("language")} if languages else {}
    return int(distinct), hosts, found


def _merge(jobs: list[Job], table: Path, threads: int) -> tuple[int, list[int]]:
    """The parts concatenated in job order, the first row of each uid kept (DuckDB, out of core); returns the rows
    written and each part's distinct uids."""
    import duckdb

    paths = [job.outputs[0] for job in jobs]
    columns = ", ".join(f'"{name}"' for name in CANDIDATE_SCHEMA.names)
    with staged(table) as tmp, duckdb.connect(config={"threads": threads}) as con:
        con.execute("SET preserve_insertion_order = true")
        listed = "[" + ", ".join("'" + path.replace("'", "''") + "'" for path in paths) + "]"
        con.execute(f"CREATE TEMP VIEW parts AS SELECT *, list_position({listed}, filename) AS job "
                    f"FROM read_parquet({listed}, filename = true)")
        # each uid's first row: its least (job, seq), one integer (a file's rows < 2**40), found by a grouping and
        # kept by a semi join (2.7x a row_number() window over 1M rows here)
        con.execute(f"""
            COPY (
                SELECT {columns} FROM parts SEMI JOIN (
                    SELECT uid AS first_uid, min(job * {2**40} + seq) AS first_key FROM parts GROUP BY uid
                ) ON uid = first_uid AND job * {2**40} + seq = first_key
                ORDER BY job, seq
            ) TO '{str(tmp).replace("'", "''")}' (FORMAT parquet)""")
        written = con.execute("SELECT count(*) FROM read_parquet(?)", [str(tmp)]).fetchone()[0]
        distinct = dict(con.execute("SELECT job, count(DISTINCT uid) FROM parts GROUP BY job").fetchall())
    return int(written), [int(distinct.get(n + 1, 0)) for n in range(len(jobs))]
