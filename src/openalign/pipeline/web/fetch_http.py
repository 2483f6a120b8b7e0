"""The fetcher's HTTP side: one asyncio loop per task over aiohttp, polite to every host and safe against what a
crawl's URLs point at. `pipeline/web/fetch.py` plans the tasks and writes what this module brings back. aiohttp was
chosen by measurement: 1.8x httpx's requests/s at a quarter of its CPU per request (bench/http_clients.py).

Polite:
- **robots.txt** (RFC 9309, parsed by Protego, Scrapy's parser) is fetched once per origin (scheme, host, port) per
  run, before that origin's first image, and shared by every request to it: a host's URLs are planned into one task.
  Redirects are followed (up to five, each hop checked as below; a hop that cannot be followed is "unreachable");
  2xx is parsed (the first 500 KiB, RFC 9309 2.5; a UTF-8 byte-order mark dropped); 4xx means no rules
  ("unavailable", 2.3.1.3: the crawler may access any resource); 5xx, a timeout or a broken connection
  ("unreachable", 2.3.1.4: assume complete disallow) is asked again after `robots_retry_delay`, then twice that (a
  redirect to a hop these rules refuse is not: it would redirect there again), and if it never answers, every URL of
  that origin is `robots_unreachable`, never fetched.
  `Disallow`/`Allow` are matched for the user-agent token `openalign`; `Crawl-delay` becomes the origin's interval
  (an origin asking more than `max_crawl_delay` seconds is skipped: `crawl_delay_too_long`).
- **X-Robots-Tag** opt-outs are read from the response headers before the body is: a value `noai, noimageai`
  applies to every agent, `openalign: noai` and `noarchive, openalign: noai` to this one; img2dataset's default
  directives
  (`noai`, `noimageai`, `noindex`, `noimageindex`; `none`, which means `noindex, nofollow`, counts as `noindex`).
- **Per origin**: at most `per_host` connections at a time and `min_interval` seconds between request starts; a
  429 or 503 with `Retry-After` (seconds or an HTTP date) pauses the whole origin that long and doubles its interval
  (from 0.1 s, up to 10 s; each success then takes a tenth off, down to its own), then the URL is asked again (up
  to 8 such waits, which are not failures; a Retry-After beyond `max_retry_after` gives the URL up); transient
  failures (timeouts, broken connections, 5xx, a 429 without Retry-After) are retried with exponential backoff,
  `retries` times; nothing else is. An origin whose URLs fail `max_host_failures` times in a row (HOST_FAILURES and
  5xx, each after its retries) is given up: its other URLs are `host_unresponsive`, never asked.
- A User-Agent that names openalign, with the user's contact (`--contact`).

Safe:
- Every address a connection would go to is looked up in `pipeline/web/fetch_addresses.py`'s explicit table (loopback,
  private, link-local with 169.254.169.254, shared, multicast, reserved; the IPv6 forms that carry an IPv4 address
  unwrapped) and refused (`private_address`) unless `allow_private_addresses`, or the address is in one of
  `allow_networks`. The check runs in aiohttp's resolver, so the connection goes to the address that was checked
  (no DNS rebinding between check and connect); an IP literal in a URL is checked here.
- Redirects are followed by hand, at most `max_redirects`, each hop's URL checked again (scheme, address, the
  robots.txt of its origin); environment proxies are ignored.
- Connect, read and total timeouts; the body is read in chunks and abandoned past `max_bytes` (after
  decompression: a gzip bomb stops at the limit); a body that is not an image is an error, not a sample
  (`pipeline/web/fetch.py` probes it with `data/images.probe` and its pixel limit).
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import re
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from openalign.pipeline.web.fetch_addresses import Addresses

ROBOTS_TOKEN = "openalign"  # the user-agent token robots.txt groups and X-Robots-Tag values are matched against
ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB
ROBOTS_MAX_REDIRECTS = 5  # RFC 9309 2.3.1.2: follow at least five consecutive redirects
REDIRECTS = (301, 302, 303, 307, 308)
RETRIED = (429, 500, 502, 503, 504)  # transient: asked again with backoff
THROTTLED_TRIES = 8  # 429/503 with a Retry-After: waits (not retries) before the URL is given up
SLOWED, MAX_SLOWED = 0.1, 10.0  # each such answer doubles the origin's interval, from SLOWED up to MAX_SLOWED,
SPEED_UP = 0.9  # and each success takes a tenth off again, down to its own (--min-interval, Crawl-delay)
CHUNK = 64 * 1024
HOST_FAILURES = ("timeout", "connection", "dns", "tls")  # and http_5xx: the host, not the URL, is failing
NOT_IMAGE_TYPES = ("text/", "application/json", "application/xhtml", "application/xml")


@dataclass(frozen=True)
class Policy:
    """What a fetch may do: the knobs of FetchOptions that the HTTP side reads (their defaults are FetchOptions';
    `FetchOptions.policy()` makes one), and the two pauses that are not options."""
    user_agent: str
    per_host: int
    min_interval: float
    max_crawl_delay: float
    connections: int
    retries: int
    max_retry_after: float
    robots: bool
    opt_out: tuple[str, ...]
    allow_private_addresses: bool
    allow_networks: tuple[str, ...]
    max_redirects: int
    max_bytes: int
    connect_timeout: float
    read_timeout: float
    total_timeout: float
    max_host_failures: int = 0  # URLs of an origin failing in a row (timeouts, refused connections, 5xx) before
        # its other URLs are given up (host_unresponsive); 0: never
    backoff: float = 1.0  # seconds before the first retry of a transient failure, doubled each time
    robots_retry_delay: float = 2.0  # seconds before an unreachable robots.txt is asked again, doubled once


@dataclass
class Fetched:
    """What became of one URL: `kind` "success" (with `body`) or an error kind; `detail` a short explanation."""
    kind: str
    detail: str = ""
    body: bytes = b""


class PrivateAddress(OSError):
    """Raised by the resolver when every address a name resolves to is refused (aiohttp wraps it)."""


class Refusal(Exception):
    def __init__(self, kind: str, detail: str = "", final: bool = False):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind, self.detail = kind, detail
        self.final = final  # asking again would give the same answer (our own rules refused it)


# ---------------------------------------------------------------------------------------------- addresses

def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def check_network(text: str) -> str:
    """A `--allow-network` value, or one sentence."""
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"--allow-network {text!r} is not an address or network (write e.g. 10.0.0.0/8)") from None
    return text


def safe_resolver(addresses: Addresses):
    """An aiohttp resolver that hands the connector only the addresses `addresses` allows."""
    from aiohttp.abc import AbstractResolver
    from aiohttp.resolver import ThreadedResolver

    class SafeResolver(AbstractResolver):
        def __init__(self):
            self.inner = ThreadedResolver()

        async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
            found = await self.inner.resolve(host, port, family)
            allowed = [r for r in found if addresses.allows(r["host"])]
            if not allowed:
                why = "; ".join(sorted({f"{r['host']} ({addresses.refusal(r['host'])})" for r in found}))
                raise PrivateAddress(f"{host} resolves only to addresses fetch does not connect to: {why}")
            return allowed

        async def close(self) -> None:
            await self.inner.close()

    return SafeResolver()


# ---------------------------------------------------------------------------------------------- opt-outs

AGENT = re.compile(r"[A-Za-z_-]+")  # RFC 9309 2.2.1's product token: what may name a crawler before a colon
VALUED = ("unavailable_after", "max-snippet", "max-image-preview", "max-video-preview")  # `name: value` directives


def opted_out(values: list[str], directives: tuple[str, ...], token: str = ROBOTS_TOKEN) -> bool:
    """Whether X-Robots-Tag header values forbid the use. A header's directives apply to every agent until one is
    named (`openalign: noai, noimageai`), and a named agent's to the end of that header or the next agent:
    `noarchive, openalign: noai` forbids the use to openalign (Google's reading; img2dataset reads only a header
    that starts with the agent)."""
    wanted = {d.strip().lower() for d in directives}
    if "noindex" in wanted:
        wanted.add("none")  # none = noindex, nofollow
    for value in values:
        agent = ""
        for item in value.split(","):
            name, colon, rest = item.partition(":")
            name = name.strip().lower()
            if colon and AGENT.fullmatch(name) and name not in VALUED:
                agent, item = name, rest
            if agent in ("", token) and item.strip().lower() in wanted:
                return True
    return False


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks to wait (a number of seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower().rpartition('@')[2]}"


# ---------------------------------------------------------------------------------------------- origins

@dataclass
class Origin:
    """One origin's shared state in a task: its robots.txt, its connection slots and its pace."""
    slots: asyncio.Semaphore
    interval: float
    base: float = 0.0  # the interval it returns to: --min-interval, or its robots.txt's Crawl-delay
    next_start: float = 0.0
    paused_until: float = 0.0
    pace: asyncio.Lock = field(default_factory=asyncio.Lock)
    rules: asyncio.Task | None = None
    requests: int = 0
    failures: int = 0  # its URLs that failed in a row, each after its retries (HOST_FAILURES)
    given_up: str = ""  # why its other URLs are not asked (host_unresponsive), once failures reach the limit

    async def turn(self) -> None:
        """Waits until this origin may be asked again (its interval, a Retry-After pause)."""
        loop = asyncio.get_running_loop()
        async with self.pace:
            while True:
                wait = max(self.next_start, self.paused_until) - loop.time()
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            self.next_start = loop.time() + self.interval
            self.requests += 1


class AllowAll:
    def can_fetch(self, url: str, agent: str) -> bool:
        return True

    def crawl_delay(self, agent: str) -> None:
        return None


class Client:
    """Fetches URLs politely and safely within one asyncio loop (one per task)."""

    def __init__(self, policy: Policy):
        import aiohttp

        self.policy = policy
        self.addresses = Addresses(policy.allow_private_addresses, policy.allow_networks)
        self.origins: dict[str, Origin] = {}
        self.global_slots = asyncio.Semaphore(policy.connections)
        self.robots_status: dict[str, str] = {}  # origin: how its robots.txt answered (the report's)
        connector = aiohttp.TCPConnector(limit=policy.connections, limit_per_host=policy.per_host,
                                         resolver=safe_resolver(self.addresses), ttl_dns_cache=300)
        self.timeout = aiohttp.ClientTimeout(total=policy.total_timeout, connect=policy.connect_timeout,
                                             sock_read=policy.read_timeout)
        self.session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, trust_env=False,
                                             headers={"User-Agent": policy.user_agent},
                                             cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        await self.session.close()

    def origin(self, url: str) -> Origin:
        key = origin_of(url)
        if key not in self.origins:
            self.origins[key] = Origin(asyncio.Semaphore(self.policy.per_host), self.policy.min_interval,
                                       self.policy.min_interval)
        return self.origins[key]

    # ------------------------------------------------------------------------------------------ one request

    def check_url(self, url: str) -> None:
        try:
            parts = urlsplit(url)
            host = parts.hostname
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as err:
            raise Refusal("bad_url", str(err)) from None
        if parts.scheme.lower() not in ("http", "https") or not host:
            raise Refusal("bad_url", f"not an http(s) URL with a host: {url[:200]}")
        why = self.addresses.refusal(host) if is_ip_literal(host) else None
        if why is not None:
            raise Refusal("private_address", f"{host} is not an address fetch connects to: {why}")

    async def _get(self, url: str, origin: Origin, accept: str):
        """One request under the origin's and the task's limits: (status, headers, body or None, error)."""
        import aiohttp

        async with origin.slots:
            await origin.turn()
            async with self.global_slots:
                try:
                    async with self.session.get(url, allow_redirects=False, headers={"Accept": accept}) as resp:
                        headers = resp.headers
                        if resp.status >= 300:  # a redirect (followed by the caller) or an error
                            return resp.status, headers, None, None
                        if self.policy.opt_out and accept.startswith("image") and opted_out(
                                headers.getall("X-Robots-Tag", []), self.policy.opt_out):
                            return resp.status, headers, None, Refusal("opted_out", "X-Robots-Tag: " + ", ".join(
                                headers.getall("X-Robots-Tag", [])))
                        kind = (headers.get("Content-Type") or "").lower()
                        if accept.startswith("image") and kind.startswith(NOT_IMAGE_TYPES):
                            return resp.status, headers, None, Refusal("not_an_image", f"Content-Type {kind[:80]}")
                        limit = self.policy.max_bytes if accept.startswith("image") else ROBOTS_MAX_BYTES
                        if accept.startswith("image") and (resp.content_length or 0) > limit:
                            return resp.status, headers, None, Refusal(
                                "too_large", f"Content-Length {resp.content_length:,} > {limit:,} bytes")
                        chunks, size = [], 0
                        async for chunk in resp.content.iter_chunked(CHUNK):
                            chunks.append(chunk)
                            size += len(chunk)
                            if size > limit:
                                if not accept.startswith("image"):  # robots.txt: its first 500 KiB
                                    break
                                return resp.status, headers, None, Refusal("too_large", f"more than {limit:,} bytes")
                        return resp.status, headers, b"".join(chunks)[:limit], None
                except aiohttp.ClientConnectorDNSError as err:
                    if isinstance(err.os_error, PrivateAddress):
                        return 0, None, None, Refusal("private_address", str(err.os_error))
                    return 0, None, None, Refusal("dns", str(err.os_error)[:200])
                except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as err:
                    return 0, None, None, Refusal("tls", str(err)[:200])
                except TimeoutError:
                    return 0, None, None, Refusal("timeout", "no answer in time")
                except aiohttp.InvalidURL as err:
                    return 0, None, None, Refusal("bad_url", str(err)[:200])
                except (aiohttp.ClientError, OSError) as err:
                    return 0, None, None, Refusal("connection", f"{type(err).__name__}: {str(err)[:200]}")

    # ------------------------------------------------------------------------------------------ robots.txt

    async def rules(self, url: str):
        """The robots.txt rules of `url`'s origin (fetched once per origin), or a Refusal for all its URLs."""
        origin = self.origin(url)
        if origin.rules is None:
            origin.rules = asyncio.ensure_future(self._robots(origin_of(url), origin))
        result = await asyncio.shield(origin.rules)
        if isinstance(result, Refusal):
            raise result
        return result

    async def _robots(self, key: str, origin: Origin):
        from protego import Protego

        if not self.policy.robots:
            return AllowAll()
        delay = self.policy.robots_retry_delay
        for attempt in range(3):
            outcome = await self._robots_once(key + "/robots.txt")
            if not (isinstance(outcome, Refusal) and outcome.kind == "robots_unreachable") or outcome.final \
                    or attempt == 2:
                break
            await asyncio.sleep(delay * 2 ** attempt)  # RFC 9309: unreachable is asked again later
        if isinstance(outcome, Refusal):
            self.robots_status[key] = outcome.kind
            return outcome
        if isinstance(outcome, AllowAll):
            self.robots_status[key] = "unavailable"
            return outcome
        self.robots_status[key] = "rules"
        rules = Protego.parse(outcome.decode("utf-8-sig", errors="replace"))  # a BOM opens no group (Google's rule)
        crawl_delay = rules.crawl_delay(ROBOTS_TOKEN)
        if crawl_delay:
            if crawl_delay > self.policy.max_crawl_delay:
                return Refusal("crawl_delay_too_long", f"robots.txt asks {crawl_delay:g} s between requests "
                                                       f"(--max-crawl-delay {self.policy.max_crawl_delay:g})")
            origin.base = max(origin.base, float(crawl_delay))
            origin.interval = max(origin.interval, origin.base)
        return rules

    async def _robots_once(self, url: str):
        for hop in range(ROBOTS_MAX_REDIRECTS + 1):
            try:
                self.check_url(url)
                error = None
            except Refusal as refusal:
                error = refusal
            if error is None:
                status, headers, body, error = await self._get(url, self.origin(url), "text/plain")
            if error is not None:
                if hop == 0 and error.kind in ("private_address", "dns", "bad_url"):
                    return error  # the origin's own: its images would fail the same way
                # a redirect elsewhere that cannot be followed says nothing of the origin's images: its robots.txt
                # could not be read, which is "unreachable" (RFC 9309 2.3.1.4: disallow all)
                # a hop our own rules refuse (a private address, not an http(s) URL) refuses again: not asked twice
                where = f"robots.txt redirected to {url[:200]}: " if hop else "robots.txt: "
                return Refusal("robots_unreachable", f"{where}{error.kind}: {error.detail}",
                               final=error.kind in ("private_address", "bad_url"))
            if status in REDIRECTS and headers.get("Location"):
                url = urljoin(url, headers["Location"])
                continue
            if 200 <= status < 300:
                return body or b""
            if 400 <= status < 500:
                return AllowAll()
            return Refusal("robots_unreachable", f"robots.txt answered {status}")
        return AllowAll()  # RFC 9309 2.3.1.2: past five redirects, MAY assume unavailable

    # ------------------------------------------------------------------------------------------ images

    async def fetch(self, url: str, accept: str = "image/*,*/*;q=0.5") -> Fetched:
        """One image URL, redirects followed by hand, each hop checked; retried where that may help; the origin
        that answered told whether it is failing."""
        fetched, origin = await self._fetch(url, accept)
        if origin is not None and self.policy.max_host_failures:
            failing = fetched.kind in HOST_FAILURES or fetched.kind.startswith("http_5")
            origin.failures = origin.failures + 1 if failing else 0
            if origin.failures >= self.policy.max_host_failures and not origin.given_up:
                origin.given_up = (f"its host failed {origin.failures} URLs in a row (the last: {fetched.kind}); "
                                   f"--max-host-failures {self.policy.max_host_failures}")
        return fetched

    async def _fetch(self, url: str, accept: str) -> tuple[Fetched, Origin | None]:
        """What became of `url`, and the origin whose answer (or silence) says whether it is failing (None: none
        was asked, or its answer says neither)."""
        attempts, throttled, hops, current = 0, 0, 0, url
        while True:
            try:
                self.check_url(current)
            except Refusal as refusal:
                return Fetched(refusal.kind, refusal.detail), None
            origin = self.origin(current)
            if origin.given_up:
                return Fetched("host_unresponsive", origin.given_up), None
            try:
                rules = await self.rules(current)
            except Refusal as refusal:
                return Fetched(refusal.kind, refusal.detail), None
            if not rules.can_fetch(current, ROBOTS_TOKEN):
                return Fetched("robots_disallowed", "robots.txt disallows it"), None
            attempts += 1
            status, headers, body, error = await self._get(current, origin, accept)
            if error is None and status in REDIRECTS:
                location = headers.get("Location")
                if not location:
                    return Fetched(f"http_{status}", "a redirect without a Location"), origin
                hops += 1
                if hops > self.policy.max_redirects:
                    return Fetched("too_many_redirects", f"more than {self.policy.max_redirects} redirects"), origin
                current = urljoin(current, location)
                continue
            if error is None and 200 <= status < 300:
                origin.interval = max(origin.base, origin.interval * SPEED_UP)  # a slowed origin speeds up again
                return Fetched("success", body=body), origin
            kind = error.kind if error is not None else f"http_{status}"
            detail = error.detail if error is not None else f"the server answered {status}"
            asked = retry_after(headers.get("Retry-After")) if error is None and status in (429, 503) else None
            if asked is not None:  # the server said when: that is no failure, and the origin slows down
                throttled += 1
                if asked > self.policy.max_retry_after or throttled > THROTTLED_TRIES:
                    why = (f"Retry-After {asked:g} s > --max-retry-after {self.policy.max_retry_after:g}"
                           if asked > self.policy.max_retry_after else f"still throttled after {THROTTLED_TRIES} waits")
                    return Fetched(kind, why), None  # it answered, and said when: not failing
                loop = asyncio.get_running_loop()
                origin.paused_until = max(origin.paused_until, loop.time() + asked)  # the whole origin waits
                origin.interval = min(max(origin.interval * 2, SLOWED), MAX_SLOWED)
                continue
            transient = (error is not None and error.kind in ("timeout", "connection")) or (error is None
                                                                                           and status in RETRIED)
            if not transient or attempts - throttled > self.policy.retries:
                return Fetched(kind, detail), origin
            await asyncio.sleep(self.policy.backoff * 2 ** (attempts - throttled - 1))
