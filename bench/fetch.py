"""P15: `openalign fetch` against img2dataset 1.47 at equal processes x threads: images/s and CPU seconds per image.

Both fetch the same URL list from the same local web (corpora/hosts.py `sample_web`: `--hosts` hosts of `--images`
pictures, 20-100 ms of injected latency per answer, a 404 and a page that is not a picture per host), served by a
process of its own on 127.0.0.1. The list leaves out what only one side refuses (robots.txt's disallowed folder, the
opt-out host, the throttling host: tests/pipeline/web/test_fetch.py compares those) and the hanging picture (a timeout
that both sides sit out), so the successes must be the same URLs, and are checked to be.

    .venv/bin/python bench/fetch.py --img2dataset /tmp/i2d-venv/bin/img2dataset [--hosts 40 --images 100]

openalign runs with its defaults (robots.txt asked per host, at most 4 connections per host, probing each picture,
keeping it as fetched) and `--workers P --connections T`; img2dataset with `--processes_count P --thread_count T
--resize_mode no --skip_reencode True` (it keeps a JPEG's bytes, but decodes every picture to check it) and
`--retries 0`. Each side runs as the command a user types, in a fresh process, alternately, `--repeats` times; the
fastest run counts. CPU seconds are those of every process of the command's session (user + system; `run`).

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, verdict, write_section

sys.path.insert(0, str(ROOT / "src"))


def serve(hosts: int, images: int, conn, stop, everything: bool = False) -> None:
    """The web, in its own process: sends the URL list (url, caption, host, path), serves until `stop` is set, then
    sends what the servers saw (the paths asked, the early requests, the peak connections per host)."""
    from openalign.corpora.hosts import Hosts, sample_web

    sites, urls = sample_web(hosts=hosts, images=images, seed=0, hang=3.0)
    with Hosts(sites) as web:
        listed = [(web.url(h, p), c, h, p) for h, p, c in urls if everything or (
            h.startswith("h") and not p.startswith("/private/") and p != "/slow.jpg")]
        conn.send(listed)
        while not stop.wait(0.1):
            if conn.poll():  # a side finished: its log, then a fresh one for the next
                conn.recv()
                conn.send({"private": sum(r["path"].startswith("/private/") for r in web.log),
                           "early": sum(bool(r.get("early")) for r in web.log),
                           "peak": max(web.peaks.values()), "requests": len(web.log)})
                web.log.clear()
                web.peaks = dict.fromkeys(web.peaks, 0)


def run(command: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process of the command's session). The processes are polled every 20 ms
    (/proc/PID/stat, each one's own user + system time at its last sighting): getrusage's children's time misses
    the workers of a fork server, which their parent never waits for."""
    ticks = os.sysconf("SC_CLK_TCK")
    seen: dict[int, float] = {}
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    while child.poll() is None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == child.pid:  # its session
                seen[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, command)
    return wall, sum(seen.values())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def successes(out: Path) -> set[str]:
    import pyarrow.parquet as pq

    return {r["url"] for part in out.glob("*.parquet")
            for r in pq.read_table(part, columns=["url", "status"]).to_pylist() if r["status"] == "success"}


I2D_KINDS = {"HTTP Error 404: Not Found": "http_404", "Image decoding error": "not_an_image", "timed out": "timeout",
             "Use of image disallowed by X-Robots-Tag directive": "opted_out",
             "HTTP Error 429: Too Many Requests": "http_429"}


def statuses(out: Path, img2dataset: bool) -> dict[str, str]:
    """{url: status}: openalign's status, or img2dataset's error message mapped onto openalign's kinds."""
    import pyarrow.parquet as pq

    found = {}
    for part in out.glob("*.parquet"):
        for r in pq.read_table(part, columns=["url", "status", "error_message"]).to_pylist():
            found[r["url"]] = r["status"] if not img2dataset or r["status"] == "success" else I2D_KINDS.get(
                r["error_message"], r["error_message"])
    return found


def side_by_side(args, ours_cmd, theirs_cmd, env, listed, conn, tmp) -> None:
    """Each side once on the whole web (robots.txt, opt-out, throttling, a hang included): per status, how many
    URLs, and what the servers saw; written into docs/pipeline.md."""
    from collections import Counter

    outcome, seen = {}, {}
    for side, command in (("openalign", ours_cmd), ("img2dataset", theirs_cmd)):
        out = tmp / side
        flag = ["--out", str(out)] if side == "openalign" else ["--output_folder", str(out)]
        wall, _ = run(command + ["--timeout", "2"] + flag, env)
        outcome[side] = statuses(out, side == "img2dataset")
        conn.send("log")
        seen[side] = conn.recv() | {"seconds": wall}
    where = {u: (h, p) for u, _, h, p in listed}
    pairs = Counter((outcome["openalign"][u], outcome["img2dataset"][u]) for u in where)
    rows = [f"### openalign fetch beside img2dataset 1.47.0 on the sample web ({len(listed):,} URLs on "
            f"{len({h for _, _, h, _ in listed})} hosts, 20-100 ms latency; both `--timeout 2`)", "",
            "| openalign | img2dataset | URLs |", "|---|---|---|"]
    rows += [f"| {ours} | {theirs} | {n:,} |" for (ours, theirs), n in sorted(pairs.items(), key=lambda kv: -kv[1])]
    rows += ["", "| what the hosts saw | openalign | img2dataset |", "|---|---|---|"]
    for key, label in (("requests", "requests"), ("private", "requests for robots.txt's disallowed /private/"),
                       ("early", "requests during a Retry-After already sent"),
                       ("peak", "most connections open at once to one host"), ("seconds", "seconds")):
        rows.append(f"| {label} | {seen['openalign'][key]:,.4g} | {seen['img2dataset'][key]:,.4g} |")
    rows += ["", f"- command: `.venv/bin/python bench/fetch.py --img2dataset /tmp/i2d-venv/bin/img2dataset "
                 f"--side-by-side --hosts {args.hosts} --images {args.images}`", ""]
    print("\n".join(rows))
    if not args.no_write:
        write_section("fetch-side-by-side", "\n".join(rows), ROOT / "docs" / "pipeline.md")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img2dataset", required=True, help="img2dataset 1.47's command, in its own venv")
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--side-by-side", action="store_true", help="the whole web once a side, per status, into "
                                                                       "docs/pipeline.md (not P15's timing)")
    parser.add_argument("--no-write", action="store_true", help="print, do not update docs/benchmarks.md")
    args = parser.parse_args()

    context = multiprocessing.get_context("spawn")
    ours_end, theirs_end = context.Pipe()
    stop = context.Event()
    server = context.Process(target=serve, args=(args.hosts, args.images, theirs_end, stop, args.side_by_side),
                             daemon=True)
    server.start()
    listed = ours_end.recv()
    tmp = Path(tempfile.mkdtemp(prefix="p15-"))
    table = tmp / "urls.jsonl"
    table.write_text("".join(json.dumps({"url": u, "caption": c}) + "\n" for u, c, _, _ in listed))
    shard = -(-len(listed) // (args.processes * 3))  # three shards a process on both sides (img2dataset's by count,
    # openalign's by host: md5(origin) % 3P, so its shards differ in size by a few hosts)
    ours_cmd = [sys.executable, "-m", "openalign", "fetch", str(table), "--workers", str(args.processes),
                "--connections", str(args.threads), "--shard-size", str(shard), "--allow-private-addresses",
                "--quiet"]
    theirs_cmd = [args.img2dataset, "--url_list", str(table), "--input_format", "jsonl", "--url_col", "url",
                  "--caption_col", "caption", "--output_format", "webdataset", "--resize_mode", "no",
                  "--skip_reencode", "True", "--processes_count", str(args.processes), "--thread_count",
                  str(args.threads), "--number_sample_per_shard", str(shard), "--retries", "0",
                  "--enable_wandb", "False", "--distributor", "multiprocessing"]
    env = dict(os.environ, NO_ALBUMENTATIONS_UPDATE="1", PYTHONPATH=str(ROOT / "src"))
    if args.side_by_side:
        side_by_side(args, ours_cmd, theirs_cmd, env, listed, ours_end, tmp)
        stop.set()
        server.join(30)
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    best = {"openalign": (float("inf"), 0.0), "img2dataset": (float("inf"), 0.0)}
    found, busy = {}, {}
    for repeat in range(args.repeats):
        for side, command in (("openalign", ours_cmd), ("img2dataset", theirs_cmd)):
            out = tmp / f"{side}-{repeat}"
            shutil.rmtree(out, ignore_errors=True)
            flag = ["--out", str(out)] if side == "openalign" else ["--output_folder", str(out)]
            served = cpu_seconds(server.pid)
            wall, cpu = run(command + ["--timeout", "10"] + flag, env)
            served = cpu_seconds(server.pid) - served
            found[side] = successes(out)
            print(f"{side} run {repeat + 1}: {wall:.2f} s, {cpu:.2f} CPU s, {len(found[side])} images; the web's "
                  f"server {served / wall:.0%} of a core", flush=True)
            if wall < best[side][0]:
                best[side] = (wall, cpu)
                busy[side] = served / wall
    stop.set()
    server.join(30)
    shutil.rmtree(tmp, ignore_errors=True)

    same = found["openalign"] == found["img2dataset"]
    images = len(found["openalign"])
    rate = {side: images / wall for side, (wall, _) in best.items()}
    cpu = {side: c / images for side, (_, c) in best.items()}
    ratio = rate["openalign"] / rate["img2dataset"]
    rows = [f"### P15 fetch: {len(listed):,} URLs on {args.hosts} local hosts (20-100 ms latency, a 404 and a "
            f"non-image each), {args.processes} processes x {args.threads} threads a side; the fastest of "
            f"{args.repeats} alternated runs", "",
            "| | images | seconds | images/s | CPU ms per image |", "|---|---|---|---|---|"]
    labels = {"openalign": "openalign `fetch` (aiohttp; robots.txt per host, <= 4 connections a host, probe, "
                           "as fetched)",
              "img2dataset": "img2dataset 1.47.0 (`--resize_mode no --skip_reencode True`, urllib threads, cv2 "
                             "decode)"}
    for side in ("openalign", "img2dataset"):
        rows.append(f"| {labels[side]} | {len(found[side]):,} | {best[side][0]:.2f} | {rate[side]:.0f} | "
                    f"{cpu[side] * 1000:.2f} |")
    rows += ["", f"- same successful URLs on both sides: **{same}**",
             f"- images/s openalign / img2dataset: **{ratio:.2f}x** (target >= 1.0); CPU per image "
             f"{cpu['openalign'] / cpu['img2dataset']:.2f}x img2dataset's",
             f"- the web's server (one process) was busy {busy['openalign']:.0%} of a core during openalign's best "
             f"run, {busy['img2dataset']:.0%} during img2dataset's",
             f"- command: `.venv/bin/python bench/fetch.py --img2dataset /tmp/i2d-venv/bin/img2dataset --hosts "
             f"{args.hosts} --images {args.images} --processes {args.processes} --threads {args.threads} "
             f"--repeats {args.repeats}`", ""]
    print("\n".join(rows))
    if not args.no_write:
        write_section("P15", "\n".join(rows))
    print(verdict("P15", "fetch_images_per_s_vs_img2dataset", ratio, 1.0, at_least=True))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
