"""extract on the worst records a crawl holds: its peak memory and time per file, against a good file's.

Each file is one record a crawl (or an attacker) can write, made here in a few MB of gzip:
- a WARC page of 400 MiB of HTML (1 MB of gzip; Common Crawl cuts its records at 1 MiB, other crawlers do not);
- a WARC page of 10^6 `<img>` tags (5 MB of gzip);
- a WAT record of 1 GiB of JSON whitespace (1 MB of gzip);
- a WARC page of 10^6 nested `<div>`s (16 KB of gzip; lexbor's time grows with the square of the depth);
- a good WAT file of 2,000 generated pages, the baseline.
Each runs `extract_file` in a fresh single-threaded process that has imported what a worker imports, and reports
its peak RSS (VmHWM) and seconds; before the caps (issue 81's probe), the first three took 8.8, 1.9 and 2.2 GB and
the fourth ran past 300 s.

    .venv/bin/python bench/extract_hostile.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from _common import ROOT, write_section

CHILD = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from _common import peak_rss_mib
import json, time
import pyarrow, pyarrow.compute, pyarrow.parquet, fastwarc.warc, msgspec, selectolax.lexbor
from openalign.pipeline.web.extract import ExtractOptions, extract_file
pyarrow.array([""])
start = time.perf_counter()
counts = extract_file(sys.argv[1], sys.argv[2], ExtractOptions(language=False), sys.argv[3])
print(json.dumps({{"seconds": time.perf_counter() - start, "rss": peak_rss_mib(), "counts": counts}}))
"""


def record(kind: str, uri: str, head: bytes, length: int) -> bytes:
    content = "application/json" if kind == "metadata" else "application/http; msgtype=response"
    return (f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {uri}\r\n"
            f"WARC-Record-ID: <urn:uuid:{abs(hash(uri))}>\r\n"
            f"Content-Type: {content}\r\nContent-Length: {length}\r\n\r\n").encode() + head


def streamed(path: Path, kind: str, head: bytes, body: bytes, repeat: int, tail: bytes = b"") -> Path:
    """One record of `head`, `body` x `repeat` and `tail`, compressed as it is written (never whole in memory)."""
    http = b""
    if kind == "response":
        http = f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: " \
               f"{len(head) + len(body) * repeat + len(tail)}\r\n\r\n".encode()
    length = len(http) + len(head) + len(body) * repeat + len(tail)
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
    with open(path, "wb") as out:
        out.write(deflate.compress(record(kind, "http://ex.com/page", http + head, length)))
        block = body * max(1, (1 << 22) // len(body))
        left = repeat
        while left:
            n = min(left, len(block) // len(body))
            out.write(deflate.compress(block[:n * len(body)]))
            left -= n
        out.write(deflate.compress(tail + b"\r\n\r\n"))
        out.write(deflate.flush())
    return path


def inputs(work: Path) -> dict[str, tuple[Path, str]]:
    from openalign.corpora import webpages

    _, good = webpages.write_crawl(webpages.site(seed=0, pages=2000, images=(5, 25), links=80), work / "good",
                                   name="crawl-00000")
    json_head = json.dumps({"Envelope": {"WARC-Header-Metadata": {"WARC-Target-URI": "http://ex.com/page"},
                                         "Payload-Metadata": {"HTTP-Response-Metadata": {"HTML-Metadata": {
                                             "Head": {}, "Links": [{"path": "IMG@/src", "url": "/b.jpg",
                                                                    "alt": "a bomb image"}]}}}}}).encode()
    return {
        "a good WAT file (2,000 pages)": (good, "wat"),
        "a 400 MiB HTML page": (streamed(work / "bigpage.warc.gz", "response",
                                         b'<html><body><img src="/big.png" alt="a big page image">',
                                         b"<p>hello world</p>", (400 << 20) // 18), "warc"),
        "a page of 10^6 <img> tags": (streamed(work / "manyimg.warc.gz", "response", b"",
                                               b'<img src="/i.png" alt="an image on a page of many">', 10**6),
                                      "warc"),
        "a WAT record of 1 GiB of JSON whitespace": (streamed(work / "bomb.warc.wat.gz", "metadata", json_head[:-1],
                                                              b" " * 1024, 1 << 20, b"}"), "wat"),
        "a page of 10^6 nested <div>s": (streamed(work / "nested.warc.gz", "response", b"", b"<div>", 10**6,
                                                  b'<img src="/deep.png" alt="deep">' + b"</div>" * 10**6), "warc"),
    }


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, (path, kind) in inputs(work).items():
            found = subprocess.run([sys.executable, "-c", CHILD, str(path), str(work / "part.parquet"), kind],
                                   capture_output=True, text=True, timeout=600,
                                   env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, check=True)
            result = json.loads(found.stdout.strip().splitlines()[-1])
            counts = result["counts"]
            shown = ", ".join(f"{k} {counts[k]:,}" for k in ("too_large_record", "truncated_page", "too_deep",
                                                              "page_images_over_cap", "pairs") if counts.get(k))
            rows.append((name, path.stat().st_size / 2**20, result["seconds"], result["rss"], shown))
            print(f"{name}: {result['seconds']:.2f} s, {result['rss']:.0f} MiB ({shown})", flush=True)
    body = ["### extract on hostile records (one record each, a fresh single-threaded process; `extract_file`, the "
            "default caps)", "",
            "| file | gzip (MiB) | seconds | peak RSS (MiB) | counted |", "|---|---|---|---|---|"]
    body += [f"| {n} | {mib:.1f} | {s:.2f} | {rss:.0f} | {shown} |" for n, mib, s, rss, shown in rows]
    baseline = rows[0][3]
    body += ["", f"- the worst peak RSS over the good file's: **{max(r[3] for r in rows[1:]) / baseline:.2f}x** "
                 "(before the caps: 8.8 GB, 1.9 GB and 2.2 GB for the next three; the nested page ran past 300 s)",
             "- command: `.venv/bin/python bench/extract_hostile.py`"]
    write_section("extract-hostile", "\n".join(body))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
