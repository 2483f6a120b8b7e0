"""Web hosts on 127.0.0.1 that behave as the web does, with a log of what every client did to them.

    hosts = Hosts({"a": Site(files={"/cat.jpg": jpeg}, robots="User-agent: *\\nDisallow: /private/\\n"),
                   "slow": Site(latency=(0.02, 0.1), throttle=5, retry_after=1)})
    with hosts:
        hosts.url("a", "/cat.jpg")          # http://127.0.0.1:PORT/cat.jpg
    hosts.log                               # every request: host, path, start, end, status, its connection
    hosts.peak_connections("a")             # the most connections open at once to that host

Each host is its own port (an origin, as robots.txt and politeness count them). A `Site` serves its files and
pages (`Page`: a status, headers, a body, a delay; a redirect), its robots.txt (a text, or a status such as 503
for a robots.txt that fails), an injected latency (a seeded uniform draw per request), an X-Robots-Tag on every
answer, and throttling (more than `throttle` requests within a second answer 429 with `Retry-After`; a request
that comes back before that time is logged as `early`). The servers run on their own event loop in a thread (or a
process: `serve_forever`), bind only 127.0.0.1 and stop with the `with` block. The fetch tests and the P15 bench
(bench/fetch.py) use them; the built-in web will serve its pages with them.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Page:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0  # seconds before the answer (a hanging server: more than the client's timeout)
    redirect: str = ""  # a Location (absolute, or "HOST:/path" for another of these hosts)


@dataclass
class Site:
    files: dict[str, bytes] = field(default_factory=dict)  # path -> body, served 200 with a type from the suffix
    pages: dict[str, Page] = field(default_factory=dict)  # path -> a scripted answer
    robots: str | int | Page | None = None  # robots.txt: its text, a status code, a scripted answer, or None (404)
    latency: tuple[float, float] = (0.0, 0.0)  # seconds added to every answer, drawn uniformly
    opt_out: str = ""  # an X-Robots-Tag sent with every answer, e.g. "noai"
    throttle: int = 0  # requests per second beyond which it answers 429 (0: never)
    retry_after: int = 1  # the Retry-After (seconds) of its 429s


GRACE = 0.05  # seconds a client has to read a 429 before its requests count as early
TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
         ".gif": "image/gif", ".html": "text/html", ".txt": "text/plain"}


class Hosts:
    def __init__(self, sites: dict[str, Site], seed: int = 0, address: str = "127.0.0.1",
                 ports: dict[str, int] | None = None):
        self.sites, self.address, self.fixed = sites, address, dict(ports or {})  # fixed: a port per host, else any
        self.random = random.Random(seed)
        self.ports: dict[str, int] = {}
        self.log: list[dict] = []
        self.open: dict[str, int] = {name: 0 for name in sites}
        self.peaks: dict[str, int] = {name: 0 for name in sites}
        self.recent: dict[str, list[float]] = {name: [] for name in sites}
        self.blocked_until: dict[str, float] = {name: 0.0 for name in sites}
        self.throttled_at: dict[str, float] = {name: 0.0 for name in sites}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.runners: list = []

    # ------------------------------------------------------------------------------------------ addresses

    def url(self, name: str, path: str) -> str:
        return f"http://{self.address}:{self.ports[name]}{path}"

    def peak_connections(self, name: str) -> int:
        return self.peaks[name]

    # ------------------------------------------------------------------------------------------ serving

    async def _answer(self, name: str, request):
        from aiohttp import web

        site, now = self.sites[name], time.monotonic()
        entry = {"host": name, "path": request.path_qs, "start": now, "agent": request.headers.get("User-Agent", ""),
                 "peer": request.transport.get_extra_info("peername") if request.transport else None}
        self.log.append(entry)
        if site.latency[1] > 0:
            await asyncio.sleep(self.random.uniform(*site.latency))
        headers = {"X-Robots-Tag": site.opt_out} if site.opt_out else {}
        status, body = 200, b""
        if site.throttle:
            # a request that arrives during a Retry-After the host sent at least GRACE seconds before (those sent
            # meanwhile were already on their way when the client read the 429)
            entry["early"] = self.throttled_at[name] + GRACE <= now < self.blocked_until[name]
            recent = [t for t in self.recent[name] if now - t < 1.0] + [now]
            self.recent[name] = recent
            if len(recent) > site.throttle:
                if now >= self.blocked_until[name]:
                    self.throttled_at[name] = now
                self.blocked_until[name] = max(self.blocked_until[name], now + site.retry_after)
                entry.update(status=429, end=time.monotonic(), retry_after=site.retry_after)
                return web.Response(status=429, headers=headers | {"Retry-After": str(site.retry_after)})
        path = request.path
        if path == "/robots.txt" and not isinstance(site.robots, Page):
            if isinstance(site.robots, str):
                body, headers["Content-Type"] = site.robots.encode(), "text/plain"
            else:
                status = site.robots or 404
        elif path in site.pages or path == "/robots.txt":
            page = site.pages[path] if path in site.pages else site.robots
            if page.delay:
                await asyncio.sleep(page.delay)
            status, body = page.status, page.body
            headers.update(dict(page.headers))
            if page.redirect:
                target = page.redirect
                if ":/" in target and not target.startswith("http"):
                    other, _, where = target.partition(":")
                    target = self.url(other, where)
                headers["Location"] = target
        elif path in site.files:
            body = site.files[path]
            headers["Content-Type"] = TYPES.get(path[path.rfind("."):].lower(), "application/octet-stream")
        else:
            status = 404
        entry.update(status=status, end=time.monotonic())
        return web.Response(status=status, body=body, headers=headers)

    async def _start(self) -> None:
        from aiohttp import web

        for name in self.sites:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", lambda request, n=name: self._answer(n, request))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            self._count_connections(runner, name)
            site = web.TCPSite(runner, self.address, self.fixed.get(name, 0))
            await site.start()
            self.ports[name] = site._server.sockets[0].getsockname()[1]
            self.runners.append(runner)

    def _count_connections(self, runner, name: str) -> None:
        server = runner.server
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            self.open[name] += 1
            self.peaks[name] = max(self.peaks[name], self.open[name])
            made(handler, transport)

        def connection_lost(handler, exc=None):
            self.open[name] -= 1
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost

    async def _stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def start(self) -> Hosts:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="hosts")
        self.thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        except BaseException:  # a port in use: what started stops, and the caller hears why
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        self.loop = None

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- a sample web

def _picture(rng: random.Random, fmt: str) -> bytes:
    import io

    from PIL import Image, ImageDraw

    width, height = rng.randrange(48, 160), rng.randrange(48, 160)
    picture = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    box = sorted(rng.sample(range(width), 2)) + sorted(rng.sample(range(height), 2))
    ImageDraw.Draw(picture).ellipse((box[0], box[2], box[1], box[3]), fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    picture.save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def sample_web(hosts: int = 6, images: int = 20, latency: tuple[float, float] = (0.02, 0.1), seed: int = 0,
               hang: float = 30.0) -> tuple[dict[str, Site], list[tuple[str, str, str]]]:
    """A small web with what a crawl meets, and its URL list as (host, path, caption), in a fixed order:
    `hosts` ordinary hosts of `images` pictures each (JPEG, and every fifth PNG), answering after `latency`, with
    404s (a missing picture per host), pages that are not images, a picture that hangs for `hang` seconds; host
    `h0`'s robots.txt disallows `/private/` (pictures there), `optout` sends `X-Robots-Tag: noai`, and
    `busy` answers 429 with `Retry-After: 1` beyond 5 requests a second. The same seed gives the same bytes."""
    rng = random.Random(seed)
    sites: dict[str, Site] = {}
    urls: list[tuple[str, str, str]] = []
    for h in range(hosts):
        name = f"h{h}"
        site = Site(latency=latency)
        for i in range(images):
            fmt = "PNG" if i % 5 == 4 else "JPEG"
            path = f"/img/{i}.{'png' if fmt == 'PNG' else 'jpg'}"
            site.files[path] = _picture(rng, fmt)
            urls.append((name, path, f"picture {i} of host {h}"))
        urls.append((name, "/img/missing.jpg", f"a missing picture on host {h}"))
        site.pages["/page.jpg"] = Page(body=b"<!doctype html><html><body>not a picture</body></html>",
                                       headers=(("Content-Type", "application/octet-stream"),))
        urls.append((name, "/page.jpg", f"a page named like a picture on host {h}"))
        if h == 1:
            site.pages["/slow.jpg"] = Page(delay=hang, body=_picture(rng, "JPEG"))
            urls.append((name, "/slow.jpg", "a picture that never comes"))
        if h == 0:
            site.robots = "User-agent: *\nDisallow: /private/\n"
            for i in range(3):
                site.files[f"/private/{i}.jpg"] = _picture(rng, "JPEG")
                urls.append((name, f"/private/{i}.jpg", f"a private picture {i}"))
        sites[name] = site
    sites["optout"] = Site(files={f"/o{i}.jpg": _picture(rng, "JPEG") for i in range(3)}, opt_out="noai",
                           latency=latency)
    urls += [("optout", f"/o{i}.jpg", f"an opted-out picture {i}") for i in range(3)]
    sites["busy"] = Site(files={f"/b{i}.jpg": _picture(rng, "JPEG") for i in range(images)}, throttle=5,
                         retry_after=1, latency=latency)
    urls += [("busy", f"/b{i}.jpg", f"a picture on a busy host {i}") for i in range(images)]
    order = random.Random(seed + 1)
    order.shuffle(urls)
    return sites, urls
