"""pipeline/web/extract_wat.py: a WAT record's JSON read through typed structs, against the same record read as the
JSON's plain objects (the reading extract had before, and keeps for records of other shapes)."""

import json
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType

from openalign.corpora import webpages
from openalign.pipeline.web.extract_wat import IMG_SRC, BadRecord, _plain_page, page

WAT = Path(__file__).resolve().parents[2] / "fixtures" / "web" / "crawl-00000.warc.wat.gz"


def plain_reading(data: bytes):
    """What the reader made of a record before the structs, with the standard library's parser and cc2dataset's
    rules: the record's dicts, its `IMG@/src` links' (url, alt) as they are. Like simdjson (cc2dataset's) and unlike
    the standard library, it refuses a string that escapes half a UTF-16 pair."""
    try:
        record = json.loads(data.decode())
        json.dumps(record, ensure_ascii=False).encode()  # a lone surrogate cannot be UTF-8
        envelope = record["Envelope"]
        html = envelope["Payload-Metadata"]["HTTP-Response-Metadata"]["HTML-Metadata"]
        links, page_url = html["Links"], envelope["WARC-Header-Metadata"]["WARC-Target-URI"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return "bad"
    head = html.get("Head")
    return (page_url, head.get("Base") if isinstance(head, dict) else None,
            [(link.get("url"), link.get("alt")) for link in (links if isinstance(links, list) else ())
             if isinstance(link, dict) and link.get("path") == IMG_SRC])


def reading(data: bytes):
    try:
        return page(data)
    except BadRecord:
        return "bad"


def image_records(wat: Path) -> list[bytes]:
    with open(wat, "rb") as stream:
        records = [r.reader.read() for r in ArchiveIterator(stream, record_types=WarcRecordType.metadata)]
    return [data for data in records if b'"IMG@/src"' in data]  # the reader parses no others


def test_every_record_of_the_fixture_and_a_generated_crawl_reads_as_its_plain_objects(tmp_path):
    _, generated = webpages.write_crawl(webpages.site(seed=3, pages=150, images=(5, 25), links=80), tmp_path)
    for wat, bad in ((WAT, 1), (generated, 1)):
        records = image_records(wat)
        read = [reading(data) for data in records]
        assert read == [plain_reading(data) for data in records]
        assert read.count("bad") == bad and sum(len(r[2]) for r in read if r != "bad") > 40


def record(links, head=None, uri='"http://p.example/a/"', extra='"Title": "x"') -> bytes:
    head = "" if head is None else f', "Head": {head}'
    return ('{"Envelope": {"Format": "WARC", "WARC-Header-Metadata": {"WARC-Type": "response", "WARC-Target-URI": '
            f'{uri}}}, "Payload-Metadata": {{"HTTP-Response-Metadata": {{"Headers": {{"Server": "nginx"}}, '
            f'"HTML-Metadata": {{{extra}, "Links": {links}{head}}}}}}}}}}}').encode()


@pytest.mark.parametrize("data", [
    # the shapes every record has: links of any key order, extra keys, no alt, a null alt, a base
    record('[{"url": "/x.jpg", "path": "IMG@/src", "alt": "a dog", "title": "t"}, {"path": "A@/href", "url": "/"},'
           ' {"path": "IMG@/src", "url": "y.jpg"}, {"path": "IMG@/src", "url": "z.jpg", "alt": null}]',
           head='{"Base": "http://cdn.example/", "Metas": [{"name": "k", "content": "v"}]}'),
    record('[]', head='{}'),
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "caf\\u00e9 \\ud83d\\ude00 \u00e9t\u00e9"}]'),
    # valid JSON of other shapes, read from its plain objects: a url that is a number or null, an alt that is a
    # number, a link that is not an object, links that are not a list, a head or a base of another type
    record('[{"path": "IMG@/src", "url": 7, "alt": "seven"}, {"path": "IMG@/src", "url": null, "alt": 3}, "x", 4]'),
    record('{"path": "IMG@/src"}', head='[]'),
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', head='{"Base": 12}'),
    record('[{"path": 5, "url": "/x.jpg", "alt": "a"}]'),
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', uri="null"),
    # bad records: invalid UTF-8 in a field extract skips (msgspec checks only the strings it builds), an escaped
    # lone surrogate, a control character, a record cut short, no links, no page URL, not an object
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', extra='"Title": "caf%"').replace(b"%", b"\xe9"),
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', extra='"Title": "\\ud800"'),
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', extra='"Title": "a\x01b"'),
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]')[:-3],
    record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]').replace(b'"Links"', b'"Linkz"'),
    record('[]').replace(b'"WARC-Target-URI"', b'"URI"'),
    b'[1, 2]',
    b'{"Envelope": [' * 3000 + b']' * 3000,
], ids=lambda data: data[-60:].decode("utf-8", "replace"))
def test_each_shape_of_record_reads_as_its_plain_objects(data):
    assert reading(data) == plain_reading(data)


def test_records_of_other_shapes_take_the_plain_reading_and_bad_ones_say_so():
    odd = record('[{"path": "IMG@/src", "url": 7, "alt": "seven"}, "x"]')
    assert page(odd) == _plain_page(odd) == ("http://p.example/a/", None, [(7, "seven")])
    huge = record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', extra='"N": [1e999, 123456789012345678901234]')
    assert page(huge) == ("http://p.example/a/", None, [("/x.jpg", "a")])  # the one difference docs/pipeline.md names
    with pytest.raises(BadRecord):
        page(record('[{"path": "IMG@/src", "url": "/x.jpg", "alt": "a"}]', extra='"T": "caf%"').replace(b"%", b"\xe9"))
