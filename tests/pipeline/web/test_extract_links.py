"""pipeline/web/extract_links.py: image links made absolute and their hosts, against urljoin and urlsplit."""

import random
import re
from urllib.parse import urljoin, urlsplit

import pyarrow as pa
import pytest

from openalign.pipeline.web.extract_links import Base, absolute, hosts, url_host


@pytest.mark.parametrize("src, base, expected", [
    ("https://a.example/x.jpg", "http://p.example/", ("https://a.example/x.jpg", "")),
    ("HTTP://A.example/x.jpg", "http://p.example/", ("HTTP://A.example/x.jpg", "")),
    ("//cdn.example/x.jpg", "https://p.example/a/b.html", ("https://cdn.example/x.jpg", "")),
    ("/img/x.jpg", "https://p.example/a/b.html", ("https://p.example/img/x.jpg", "")),
    ("../x.jpg", "https://p.example/a/b/c.html", ("https://p.example/a/x.jpg", "")),
    ("x.jpg", "https://static.p.example/assets/", ("https://static.p.example/assets/x.jpg", "")),
    ("data:image/png;base64,AAA", "https://p.example/", (None, "scheme_data")),
    ("javascript:void(0)", "https://p.example/", (None, "scheme_javascript")),
    ("  ", "https://p.example/", (None, "empty_src")),
    ("http://", "https://p.example/", (None, "bad_url")),
    ("http://[::1", "https://p.example/", (None, "bad_url")),
])
def test_image_urls_are_made_absolute_against_the_base(src, base, expected):
    assert absolute(src, base) == expected


@pytest.mark.parametrize("url", ["https://a.example/x.jpg", "http://User:pw@Img.Example.COM:8080/p?q=1#f",
                                 "https://[2001:DB8::1]:443/x", "http://host?x=/y", "http://h#frag", "https://a.b/",
                                 "http://xn--bcher-kva.example/b", "https://a.example", "http://@host/x"])
def test_url_host_is_urlsplit_s_hostname(url):
    assert url_host(url) == (urlsplit(url).hostname or "")


def test_links_resolve_as_urljoin_resolves_them():
    """Base.resolve writes out urljoin for the common shapes of link: an oracle test over generated bases and links
    with every piece that sends urljoin down another branch (dot segments, empty segments, queries, fragments,
    params, IPv6 literals, ports, user info, schemes, upper case, non-ASCII, spaces, tabs)."""
    rng = random.Random(0)
    netlocs = ["p.example", "P.Example:8080", "u:pw@p.example", "[::1]", "[::1]:80", "bücher.example", "",
             "p.example?x", "[bad"]
    paths = ["", "/", "/a", "/a/", "/a/b.html", "/a/b/c/d.html", "/a//b/", "/a/./b", "/a/../b/", "/a;p/b", "/a/b;p",
             "/.x/y", "/a b/c", "/é/", "/a/b?q=1", "/a/b#f", "/a/b?", "/a:b/c"]
    schemes = ["http", "https", "HTTPS", "ftp", "file", ""]
    pieces = ["img", "x.jpg", "..", ".", "", "a b", "é", "%20", "?q", "?", "#f", ";p", ":", "@", "//", "/", "a:b",
              "\t", "[", "]", "\\", "~u", "x.jpg?w=1&h=2", "cdn.example", "..x", ".x", "=", "!", "$", "'"]
    bases = [f"{scheme}://{host}{path}" if scheme else f"//{host}{path}" for scheme in schemes for host in netlocs
             for path in paths] + ["", "relative/page.html", "http:/oops", "http://"]
    checked, urls = 0, []
    for base in bases:
        resolver = Base(base)
        for _ in range(40):
            lead = rng.choice(["", "/", "//", "./", "../", "../../", "./../", "?", "#", "http:", "HTTP://h.example/"])
            src = lead + "/".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
            if not src.strip() or src.strip()[:8].lower().startswith(("http://", "https://")):
                continue  # no source, and absolute http(s) URLs, are the named differences (docs/pipeline.md)
            try:
                expected = urljoin(base, src.strip())
            except ValueError:
                expected = None
            if expected is not None and expected.split(":", 1)[0].lower() not in ("http", "https"):
                expected = None
            found, _ = resolver.resolve(src)
            assert found == expected, (base, src)
            urls += [found] if found else []
            checked += 1
    # and their hosts, a column at a time, are urlsplit's (none where it has none or refuses the URL)
    urls += ["http://[::1]:80/x", "http://[v1.x]/", "http://[127.0.0.1]/", "http://u@[::1/", "http://a]b/",
             "HTTP://USER:pw@Host.Example:8080/p", "http://bücher.example/", "http://h\u00e9.example/", "http:x/y",
             "http://a\tb.example/", "http://ab.example/\n", "http://ab.example/ok", "http://\u0130.example/",
             "http://a@b@c.example/", "https://a:b@c:d@e.example:1/"]
    got = hosts(pa.array(urls)).to_pylist()
    for url, host in zip(urls, got):
        try:  # a URL with a control character has none (urlsplit would drop a tab and keep a NUL)
            expected = "" if re.search(r"[\x00-\x1f\x7f]", url) else urlsplit(url).hostname or ""
        except ValueError:
            expected = ""
        assert host == expected, url
    assert checked > 10_000
