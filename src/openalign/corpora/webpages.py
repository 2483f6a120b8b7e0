"""Generated web pages and the archives a crawl makes of them: a WARC (request and response records) and its WAT
(Common Crawl's metadata records), for the extract stage's tests and benches and the built-in web.

The pages hold what real pages hold and what extraction must get right: image sources that are absolute,
scheme-relative (`//cdn...`), host-relative (`/img/...`) and page-relative (`../a.png`); pages with a `<base href>`;
empty, missing, whitespace-only, entity-escaped and non-ASCII alt-texts; `data:` and `javascript:` sources; lazy
images (`data-src`), `srcset` and `<picture>`; the same image and alt on several pages. `site(seed, pages)` makes
them deterministically; `parse_page` reads a page's `<base>` and `<img>` tags independently of extract
(Python's html.parser).

The WAT follows Common Crawl's published layout (https://commoncrawl.org/get-started, "WAT Format"; the Internet
Archive's Web Archive Transformation format it comes from): a gzip member per record; a `warcinfo` record, then
one `metadata` record (Content-Type application/json, WARC-Refers-To the described record) for each record of the
WARC, whose JSON is
    {"Container": {"Filename": <the WARC's name>, "Compressed": true, "Offset": "<byte offset in the WARC>",
                   "Gzip-Metadata": {...}},
     "Envelope": {"Format": "WARC", "WARC-Header-Length": ..., "Actual-Content-Length": ...,
                  "WARC-Header-Metadata": {<the record's WARC headers>, "WARC-Target-URI": <the page>},
                  "Payload-Metadata": {"Actual-Content-Type": "application/http; msgtype=response",
                      "HTTP-Response-Metadata": {"Response-Message": {...}, "Headers": {...},
                          "HTML-Metadata": {"Head": {"Title": ..., "Base": <href of <base>>, ...},
                                            "Links": [{"path": "IMG@/src", "url": <src as written>,
                                                       "alt": <alt, when the tag has one>}, ...]}}}}}
A request record's metadata carries `HTTP-Request-Metadata` instead. Links hold the attribute values as written
(relative URLs unresolved, as Common Crawl's are), entities decoded as an HTML parser decodes them.

`write_crawl` writes both files with warcio (a kept WARC library); `truncate_last_member` makes the copy whose last
gzip member is cut short, as an interrupted download leaves it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import uuid
from dataclasses import dataclass, field
from html import escape
from html.parser import HTMLParser
from pathlib import Path

DATE = "2026-11-02T10:00:00Z"  # every record's WARC-Date (the archives are byte-for-byte repeatable)
HOSTS = ("shop.example.com", "blog.example.org", "news.example.net", "wiki.example.de")
SUBJECTS = ("a red bicycle leaning on a wall", "fresh bread on a wooden table", "a lighthouse at sunset",
            "two cats asleep on a sofa", "a bowl of ramen with egg", "mountain lake in autumn",
            "vintage typewriter close-up", "children playing football in the park", "a sailing boat in a harbour",
            "Café crème et croissant", "東京タワーの夜景", "Straßenbahn in Zürich", "🌻 sunflower field in July",
            "Tom &amp; Jerry cartoon still", "a golden retriever puppy", "city skyline at night")


@dataclass(frozen=True)
class Image:
    src: str  # as written in the tag
    alt: str | None  # None: the tag has no alt attribute
    attrs: tuple[tuple[str, str], ...] = ()  # other attributes (data-src, srcset, width, height)


@dataclass
class Page:
    url: str
    title: str
    base: str = ""  # <base href>, as written
    tags: list[Image] = field(default_factory=list)  # the <img> tags as generated
    extra_html: str = ""  # <picture>, lazy images etc., inside the body
    links: int = 0  # navigation links (<a href>) besides "About": real pages hold dozens to hundreds

    def html(self) -> str:
        head = f"<title>{escape(self.title)}</title>"
        if self.base:
            head += f'<base href="{escape(self.base)}">'
        body = []
        for tag in self.tags:
            attrs = f' src="{tag.src}"'
            if tag.alt is not None:
                attrs += f' alt="{tag.alt}"'  # written as given: entity-escaped alts stay escaped
            attrs += "".join(f' {k}="{v}"' for k, v in tag.attrs)
            body.append(f"<p>Photo</p><img{attrs}>")
        nav = "".join(f'<li><a href="/topic/{k}.html">Topic {k} of the site</a></li>' for k in range(self.links))
        nav = f"<ul>{nav}</ul>" if nav else ""
        return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\">{head}</head><body>"
                f"{nav}<h1>{escape(self.title)}</h1>{''.join(body)}{self.extra_html}"
                f'<a href="/about">About</a></body></html>')


class _Images(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[dict] = []
        self.base = ""

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "img":
            self.found.append(values)
        elif tag == "base" and not self.base:
            self.base = values.get("href") or ""

    handle_startendtag = handle_starttag


def parse_page(html: str) -> tuple[str, list[dict]]:
    """(the first `<base href>` as written, or ""; the attributes of every `<img>`, entities decoded, in document
    order; an attribute without a value is None) of `html`, read by Python's html.parser."""
    parser = _Images()
    parser.feed(html)
    parser.close()
    return parser.base, parser.found


def site(seed: int = 0, pages: int = 12, images: tuple[int, int] = (2, 5), links: int = 0) -> list[Page]:
    """`pages` generated pages over a few hosts, each kind of image source and alt-text among them (see the module's
    docstring), `images` = (fewest, most) `<img>` a page and `links` navigation links each; the same arguments give
    the same pages."""
    rng = random.Random(seed)
    out = []
    for i in range(pages):
        host = HOSTS[i % len(HOSTS)]
        scheme = "https" if i % 3 else "http"
        path = f"/section{i % 3}/page{i}.html"
        page = Page(f"{scheme}://{host}{path}", f"Page {i} of {host}", links=links)
        if i % 4 == 1:
            page.base = f"https://static.{host}/assets/" if i % 8 == 1 else "/mirror/"
        n = rng.randrange(images[0], images[1] + 1)
        for j in range(n):
            subject = rng.choice(SUBJECTS)
            name = f"{hashlib.md5(f'{seed}-{i}-{j}'.encode()).hexdigest()[:8]}.jpg"
            src = _source(rng, host, name, j)
            page.tags.append(Image(src, _alt(rng, subject), _attrs(rng)))
        out.append(page)
    # what every crawl holds: the same image with the same alt on two pages, and some the same image elsewhere
    shared = Image("https://cdn.example.com/shared/logo.png", "Example Co. logo")
    for page in out[::5]:
        page.tags.append(shared)
    out[0].tags += [Image("data:image/png;base64,iVBORw0KGgo=", "inline pixel"),
                    Image("javascript:void(0)", "a script link"),
                    Image("ftp://files.example.com/pic.jpg", "an ftp image"),
                    Image("", "an empty source")]
    out[1].extra_html = ('<img data-src="/lazy/real.jpg" src="/lazy/placeholder.gif" alt="lazy loaded photo">'
                         '<picture><source srcset="/pic/large.webp 2x, /pic/small.webp 1x">'
                         '<img src="/pic/fallback.jpg" alt="picture fallback"></picture>'
                         '<img srcset="/set/a-1x.jpg 1x, /set/a-2x.jpg 2x" alt="only a srcset">')
    return out


def _source(rng: random.Random, host: str, name: str, j: int) -> str:
    kind = rng.choice(("absolute", "absolute", "scheme", "host", "page", "parent"))
    return {"absolute": f"https://img.{host}/photos/{name}", "scheme": f"//cdn.example.com/{host}/{name}",
            "host": f"/images/{name}", "page": f"thumbs/{name}", "parent": f"../media/{name}"}[kind]


def _alt(rng: random.Random, subject: str) -> str | None:
    draw = rng.random()
    if draw < 0.08:
        return None  # no alt attribute
    if draw < 0.14:
        return ""
    if draw < 0.18:
        return "   "  # whitespace only
    if draw < 0.24:
        return f"  {subject}\n  photo  "  # runs of whitespace around and inside
    return subject


def _attrs(rng: random.Random) -> tuple[tuple[str, str], ...]:
    if rng.random() < 0.3:
        return (("width", str(rng.choice((320, 640, 1024)))), ("height", str(rng.choice((240, 480, 768)))))
    return ()


# ------------------------------------------------------------------------------------------------ archives


def _record_id(*parts) -> str:
    return f"<urn:uuid:{uuid.UUID(hashlib.md5('/'.join(map(str, parts)).encode()).hexdigest())}>"


def write_crawl(pages: list[Page], out: Path, name: str = "crawl-00000",
                damaged: bool = True) -> tuple[Path, Path]:
    """(WARC, WAT) of a crawl of `pages`, written under `out` as NAME.warc.gz and NAME.warc.wat.gz: per page a
    request and a response record (and the WAT's metadata record for each), plus (`damaged`) one image response
    among them and one malformed WAT record (its JSON cut short), as a real crawl's files hold. The last record
    describes a page with images, so a copy cut short in its last gzip member loses pairs."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    out.mkdir(parents=True, exist_ok=True)
    warc_path, wat_path = out / f"{name}.warc.gz", out / f"{name}.warc.wat.gz"
    described = []  # (offset, warc headers, kind, page or None, http headers)
    with open(warc_path, "wb") as stream:
        writer = WARCWriter(stream, gzip=True)
        writer.write_record(_warcinfo(writer, warc_path.name))
        for i, page in enumerate(pages):
            body = page.html().encode("utf-8")
            request = StatusAndHeaders(f"GET {_path(page.url)} HTTP/1.1",
                                       [("Host", page.url.split("/")[2]), ("User-Agent", "openalign-test")],
                                       is_http_request=True)
            response = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                                   ("Content-Length", str(len(body)))], protocol="HTTP/1.1")
            for kind, http, payload in (("request", request, b""), ("response", response, body)):
                headers = {"WARC-Record-ID": _record_id(name, i, kind), "WARC-Date": DATE}
                record = writer.create_warc_record(page.url, kind, payload=io.BytesIO(payload),
                                                   warc_headers_dict=headers, http_headers=http)
                offset = stream.tell()
                writer.write_record(record)
                described.append((offset, record, kind, page, http))
            if damaged and i == len(pages) // 2:  # an image among the pages: a response that is not HTML
                image = b"\xff\xd8\xff\xe0" + bytes(60)
                http = StatusAndHeaders("200 OK", [("Content-Type", "image/jpeg"),
                                                   ("Content-Length", str(len(image)))],
                                        protocol="HTTP/1.1")
                record = writer.create_warc_record("https://img.shop.example.com/photos/x.jpg", "response",
                                                   payload=io.BytesIO(image), http_headers=http,
                                                   warc_headers_dict={"WARC-Record-ID": _record_id(name, "image"),
                                                                      "WARC-Date": DATE})
                offset = stream.tell()
                writer.write_record(record)
                described.append((offset, record, "response", None, http))
    with open(wat_path, "wb") as stream:
        writer = WARCWriter(stream, gzip=True)
        writer.write_record(_warcinfo(writer, wat_path.name))
        for n, (offset, record, kind, page, http) in enumerate(described):
            payload = json.dumps(_wat_json(warc_path.name, offset, record, kind, page, http), ensure_ascii=False)
            if damaged and n == 3:  # one page's record a broken writer cut short (its links are there, its JSON is not)
                payload = payload[:-40]
            uri = record.rec_headers.get_header("WARC-Target-URI")
            meta = writer.create_warc_record(uri, "metadata", payload=io.BytesIO(payload.encode("utf-8")),
                                             warc_content_type="application/json",
                                             warc_headers_dict={"WARC-Record-ID": _record_id(name, "wat", n),
                                                                "WARC-Date": DATE,
                                                                "WARC-Refers-To": record.rec_headers.get_header(
                                                                    "WARC-Record-ID")})
            writer.write_record(meta)
    return warc_path, wat_path


def _warcinfo(writer, filename: str):
    return writer.create_warc_record("", "warcinfo", payload=io.BytesIO(b"software: openalign webpages\r\n"),
                                     warc_content_type="application/warc-fields",
                                     warc_headers_dict={"WARC-Record-ID": _record_id(filename), "WARC-Date": DATE,
                                                        "WARC-Filename": filename})


def _path(url: str) -> str:
    rest = url.split("://", 1)[1]
    return "/" + rest.split("/", 1)[1] if "/" in rest else "/"


def _wat_json(filename: str, offset: int, record, kind: str, page: Page | None, http) -> dict:
    warc_headers = dict(record.rec_headers.headers)
    envelope: dict = {"Format": "WARC", "WARC-Header-Length": "0", "Actual-Content-Length":
                      warc_headers.get("Content-Length", "0"), "WARC-Header-Metadata": warc_headers}
    headers = dict(http.headers)
    if kind == "request":
        envelope["Payload-Metadata"] = {"Actual-Content-Type": "application/http; msgtype=request",
                                        "HTTP-Request-Metadata": {"Request-Message": {"Method": "GET", "Path":
                                                                                      _path(page.url),
                                                                                      "Version": "HTTP/1.1"},
                                                                  "Headers": headers}}
    else:
        response: dict = {"Response-Message": {"Version": "HTTP/1.1", "Status": "200", "Reason": "OK"},
                          "Headers": headers}
        if page is not None:  # an HTML page: its head and links
            html = page.html()
            head: dict = {"Title": page.title}
            base, images = parse_page(html)
            if base:
                head["Base"] = base
            links = []
            for attrs in images:
                if "src" in attrs:
                    link = {"path": "IMG@/src", "url": attrs["src"]}
                    if attrs.get("alt") is not None:
                        link["alt"] = attrs["alt"]
                    links.append(link)
            links += [{"path": "A@/href", "url": f"/topic/{k}.html", "text": f"Topic {k} of the site"}
                      for k in range(page.links)]
            links.append({"path": "A@/href", "url": "/about", "text": "About"})
            response["HTML-Metadata"] = {"Head": head, "Links": links}
        envelope["Payload-Metadata"] = {"Actual-Content-Type": "application/http; msgtype=response",
                                        "HTTP-Response-Metadata": response}
    return {"Container": {"Filename": filename, "Compressed": True, "Offset": str(offset),
                          "Gzip-Metadata": {"Deflate-Length": "0", "Header-Length": "10", "Footer-Length": "8"}},
            "Envelope": envelope}


def truncate_last_member(path: Path, out: Path, keep: float = 0.5) -> Path:
    """A copy of the gzip-member file `path` whose last member is cut to `keep` of its bytes (an interrupted
    download); every earlier member stays whole."""
    data = path.read_bytes()
    last = data.rfind(b"\x1f\x8b\x08")
    while last > 0:  # the last member's start: a gzip header that decompresses to the end
        try:
            gzip.decompress(data[last:])
            break
        except (OSError, EOFError):
            last = data.rfind(b"\x1f\x8b\x08", 0, last)
    out.write_bytes(data[: last + int((len(data) - last) * keep)])
    return out
