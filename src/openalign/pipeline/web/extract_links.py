"""Links to candidates: a page's base, its image links resolved to absolute http(s) URLs (other schemes counted by
name), their hosts, and the rules every kind of input shares for an (alt, src) pair."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from urllib.parse import urljoin, urlparse

import pyarrow as pa

from openalign.data.pairs import normalize_text

__all__ = ["Base", "NO_BASE", "absolute", "hosts", "pair", "pairs", "resolve_base", "target_uri", "url_host"]


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

    `resolve` gives urljoin's result (tests/pipeline/web/test_extract.py checks it on tens of thousands of generated
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
    """`url_host` of each URL, a column at a time in Arrow, for the authorities of printable ASCII without brackets,
    nearly all of them: the authority (an anchored RE2 expression), less any user before its last `@` and any port;
    the others one at a time. (One expression with an optional user group costs twice these together: RE2 finds its
    groups the slow way.)"""
    import pyarrow.compute as pc

    authority = pc.struct_field(pc.extract_regex(urls, AUTHORITY), 0).fill_null("")
    user = pc.match_substring(authority, "@")
    if pc.any(user).as_py():
        authority = pc.if_else(user, pc.replace_substring_regex(authority, r"^.*@", ""), authority)
    found = pc.utf8_lower(pc.list_element(pc.split_pattern(authority, ":", max_splits=1), 0))
    odd = pc.match_substring_regex(urls, ODD)
    if pc.any(odd).as_py():
        slow = pa.array([url_host(url) for url in pc.filter(urls, odd).to_pylist()], pa.string())
        found = pc.replace_with_mask(found, odd, slow)
    return found


AUTHORITY = r"^[^:]*://(?P<authority>[^/?#]*)"  # after the scheme's "://", up to the path, query or fragment
# url_host's own cases: an authority with brackets or not printable ASCII, a control character anywhere
ODD = r"^[^:]*://[^/?#]*[^!-~]|^[^:]*://[^/?#]*[\[\]]|[\x00-\x1f\x7f]"
NO_BASE = Base("")  # a URL table's: its URLs must be absolute


def resolve_base(page_url: str, href) -> Base:
    """The base a page's relative links resolve against: its `<base href>` resolved against the page, else the page."""
    if not isinstance(href, str):
        return Base(page_url)
    try:
        return Base(urljoin(page_url, href))
    except ValueError:
        return Base(page_url)


def pairs(links, base: Base, counts: Counter) -> list[tuple[str, str]]:
    """(absolute image URL, text) of each of a page's image links, given as (source, alt): the rules every kind of
    input shares. An alt that is None (the tag has none) or empty once its whitespace is collapsed, and a source
    that does not resolve, drop the link, the reason counted; a source that is not a string (a WAT link's JSON may
    hold any type) is read as str(src or "")."""
    found, resolve = [], base.resolve
    for src, alt in links:
        if alt.__class__ is not str and not isinstance(alt, str):
            counts["no_alt"] += 1
            continue
        text = normalize_text(alt)
        if not text:
            counts["empty_alt"] += 1
            continue
        url, why = resolve(src if src.__class__ is str else str(src or ""))
        if url is None:
            counts[why] += 1
            continue
        found.append((url, text))
    return found


def pair(alt, src: str, base: Base, counts: Counter) -> tuple[str, str] | None:
    """`pairs` of one link: (absolute image URL, text), or None with the reason counted."""
    found = pairs(((src, alt),), base, counts)
    return found[0] if found else None
