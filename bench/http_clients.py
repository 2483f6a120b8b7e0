"""Which asynchronous HTTP client `fetch` runs on: aiohttp against httpx, the two the issue names, on the same URLs.

Each client GETs the same images (corpora/hosts.py `sample_web`: 20-100 ms of latency per answer) from a web served
by a process of its own, with the same number of requests in flight (a semaphore) and one connection pool, reading
each body, in this one process; the runs alternate and the fastest of each counts. Wall time and this process's
CPU time (the client's own cost per request) are compared.

    .venv/bin/python bench/http_clients.py [--hosts 50 --images 20 --in-flight 64 --repeats 3]

Writes its table into docs/benchmarks.md (section `http-clients`).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time

from _common import ROOT, write_section

sys.path.insert(0, str(ROOT / "src"))


def serve(hosts: int, images: int, conn, stop) -> None:
    from openalign.corpora.hosts import Hosts, sample_web

    sites, urls = sample_web(hosts=hosts, images=images, seed=0, hang=1.0)
    with Hosts(sites) as web:
        conn.send([web.url(h, p) for h, p, _ in urls if h.startswith("h") and p.startswith("/img/")])
        stop.wait()


async def with_aiohttp(urls: list[str], in_flight: int) -> int:
    import aiohttp

    gate = asyncio.Semaphore(in_flight)
    connector = aiohttp.TCPConnector(limit=in_flight, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(url: str) -> int:
            async with gate, session.get(url) as answer:
                return len(await answer.read())

        return sum(await asyncio.gather(*(one(u) for u in urls)))


async def with_httpx(urls: list[str], in_flight: int) -> int:
    import httpx

    gate = asyncio.Semaphore(in_flight)
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        async def one(url: str) -> int:
            async with gate:
                return len((await client.get(url)).content)

        return sum(await asyncio.gather(*(one(u) for u in urls)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    stop = context.Event()
    server = context.Process(target=serve, args=(args.hosts, args.images, theirs, stop), daemon=True)
    server.start()
    urls = ours.recv()
    clients = {"aiohttp": with_aiohttp, "httpx": with_httpx}
    best = {name: (float("inf"), 0.0) for name in clients}
    sizes = {}
    for repeat in range(args.repeats):
        for name, client in clients.items():
            wall, cpu = time.perf_counter(), time.process_time()
            sizes[name] = asyncio.run(client(urls, args.in_flight))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"{name} run {repeat + 1}: {wall:.2f} s, {cpu:.2f} CPU s", flush=True)
            if wall < best[name][0]:
                best[name] = (wall, cpu)
    stop.set()
    server.join(30)
    import aiohttp
    import httpx

    versions = {"aiohttp": aiohttp.__version__, "httpx": httpx.__version__}
    rows = [f"### HTTP clients for fetch: {len(urls):,} images from {args.hosts} local hosts (20-100 ms latency), "
            f"{args.in_flight} requests in flight, one process; the fastest of {args.repeats} alternated runs", "",
            "| client | requests/s | CPU ms per request | bytes read |", "|---|---|---|---|"]
    for name in clients:
        wall, cpu = best[name]
        rows.append(f"| {name} {versions[name]} | {len(urls) / wall:.0f} | {cpu / len(urls) * 1000:.2f} | "
                    f"{sizes[name]:,} |")
    rows += ["", f"- aiohttp / httpx: {best['httpx'][0] / best['aiohttp'][0]:.2f}x the requests/s, "
                 f"{best['aiohttp'][1] / best['httpx'][1]:.2f}x the CPU per request",
             f"- command: `.venv/bin/python bench/http_clients.py --hosts {args.hosts} --images {args.images} "
             f"--in-flight {args.in_flight} --repeats {args.repeats}`", ""]
    print("\n".join(rows))
    if not args.no_write:
        write_section("http-clients", "\n".join(rows))
    return 0 if sizes["aiohttp"] == sizes["httpx"] else 1


if __name__ == "__main__":
    sys.exit(main())
