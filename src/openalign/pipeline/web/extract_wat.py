"""A WAT record's JSON as extract reads it: the parts of Common Crawl's layout it needs (corpora/webpages.py cites
the layout), as msgspec structs, so one parse checks the whole record's JSON and builds Python objects only for those
parts: the page's URL, its `<base>` and its links. The other fields (the HTTP headers, the page's metas, scripts,
forms: most of a real record) are checked and skipped, never built; building them as dicts (orjson) was half the
stage's time on one core. A navigation link still becomes a small struct, dropped by the loop that reads it.

`page` gives what the reader needs of one record, or says why the record is bad; a record whose JSON is valid but
whose shapes differ from these (a link's `url` a number, `Links` not a list) is read from the JSON's plain objects
instead, with the same rules."""

from __future__ import annotations

import msgspec

__all__ = ["BadRecord", "IMG_SRC", "page"]

IMG_SRC = "IMG@/src"  # a link's path for an <img src>: cc2dataset's image document type


class BadRecord(ValueError):
    """A record whose JSON does not parse, or lacks the page's URL or its links."""


class Link(msgspec.Struct, gc=False):
    path: str = ""
    url: str = ""
    alt: str | None = None  # None: the tag has no alt


class Head(msgspec.Struct, gc=False):
    Base: str | None = None  # the page's <base href>


class HtmlMetadata(msgspec.Struct, gc=False):
    Links: list[Link]
    Head: Head | None = None


class ResponseMetadata(msgspec.Struct, gc=False, rename={"html": "HTML-Metadata"}):
    html: HtmlMetadata


class PayloadMetadata(msgspec.Struct, gc=False, rename={"response": "HTTP-Response-Metadata"}):
    response: ResponseMetadata


class HeaderMetadata(msgspec.Struct, gc=False, rename={"target_uri": "WARC-Target-URI"}):
    target_uri: str


class Envelope(msgspec.Struct, gc=False, rename={"header": "WARC-Header-Metadata", "payload": "Payload-Metadata"}):
    header: HeaderMetadata
    payload: PayloadMetadata


class Record(msgspec.Struct, gc=False):
    Envelope: Envelope


TYPED = msgspec.json.Decoder(Record)
PLAIN = msgspec.json.Decoder()


def page(data: bytes) -> tuple[object, object, list[tuple[object, object]]]:
    """(the page's WARC-Target-URI, its Head.Base, its `<img>` links as (url, alt), each of any JSON type) of one
    WAT record's JSON; raises BadRecord.

    The JSON is checked as orjson and simdjson (cc2dataset's) check it: valid UTF-8 throughout (msgspec checks the
    strings it builds, not those it skips, so the bytes are checked first), no half of a UTF-16 pair escaped alone,
    no control character inside a string. One difference (docs/pipeline.md names it): a number that a double or 64
    bits cannot hold (`1e999`) in a field that is skipped passes here, where simdjson refuses the record."""
    try:
        if not data.isascii():
            data.decode()
        envelope = TYPED.decode(data).Envelope
    except UnicodeDecodeError:
        raise BadRecord from None
    except msgspec.ValidationError:  # valid JSON, other shapes: its plain objects, read with the same rules
        return _plain_page(data)
    except (msgspec.DecodeError, RecursionError):
        raise BadRecord from None
    html = envelope.payload.response.html
    head = html.Head
    return (envelope.header.target_uri, head.Base if head is not None else None,
            [(link.url, link.alt) for link in html.Links if link.path == IMG_SRC])


def _plain_page(data: bytes) -> tuple[object, object, list[tuple[object, object]]]:
    try:
        envelope = PLAIN.decode(data)["Envelope"]
        page_url = envelope["WARC-Header-Metadata"]["WARC-Target-URI"]
        html = envelope["Payload-Metadata"]["HTTP-Response-Metadata"]["HTML-Metadata"]
        links = html["Links"]
    except (msgspec.DecodeError, RecursionError, KeyError, TypeError):
        raise BadRecord from None
    head = html.get("Head")
    return (page_url, head.get("Base") if isinstance(head, dict) else None,
            [(link.get("url"), link.get("alt")) for link in (links if isinstance(links, list) else ())
             if link.__class__ is dict and link.get("path") == IMG_SRC])
