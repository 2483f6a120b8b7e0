"""`openalign web`: the built-in web (corpora/web.py) built, served on 127.0.0.1, or crawled end to end by the demo
(`make web-demo`: every stage from the crawl to a trained model's held-out recall)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from openalign import config as config_lib
from openalign.config import ConfigError
from openalign.flags import add_options, options_from


def web_flags(p) -> None:
    from openalign.corpora.web import WebOptions

    p.add_argument("action", choices=["build", "serve", "demo"],
                   help="build: pages, their crawl (WARC, WAT) and the images of several hosts; serve: those hosts "
                        "on 127.0.0.1; demo: the whole chain from the crawl to a trained model (make web-demo)")
    p.add_argument("dir", nargs="?", help="serve: the web's folder")
    p.add_argument("--out", help="build: the web's folder; demo: every stage's output (default runs/web-demo)")
    p.add_argument("--from", dest="sources", action="append", default=[],
                   help="build: a corpus's training shards (repeatable; default data/emoji/train: never its held-out "
                        "split)")
    add_options(p, WebOptions)
    p.add_argument("--preset", default="demo", help="demo: the model `openalign train --preset` makes (default demo)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="demo: the training config's, as for train "
                                                                      "(data.data_dir: where the emoji corpus is)")


def run_web(args) -> int:
    import signal
    import threading

    from openalign.corpora import web

    if args.action == "demo":
        return web_demo(Path(args.out or "runs/web-demo"), options_from(args, web.WebOptions), quiet=args.quiet,
                        preset=args.preset, overrides=tuple(args.overrides))
    if args.action == "build":
        if not args.out:
            raise ConfigError("give the web's folder: openalign web build --out DIR [--from SHARDS ...]")
        planted = web.build(args.sources or ["data/emoji/train"], Path(args.out), options_from(args, web.WebOptions))
        counts = ", ".join(f"{k} {v:,}" for k, v in planted["counts"].items())
        print(f"{planted['images']:,} training images on {planted['pages']:,} pages of {planted['hosts']} hosts -> "
              f"{args.out} (crawl: {Path(args.out) / 'crawl'}; planted: {counts})")
        return 0
    if not args.dir:
        raise ConfigError("give the web's folder: openalign web serve DIR")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with web.serve(Path(args.dir)) as hosts:
        ports = sorted(hosts.ports.values())
        print(f"serving {len(ports)} hosts of {args.dir} on 127.0.0.1:{ports[0]}-{ports[-1]} (Ctrl-C stops)",
              flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    print(f"stopped after {len(hosts.log):,} requests")
    return 0


# The web demo's two deviations from the paper's thresholds, for the built-in corpus's images and alt-texts: emoji
# are drawn at 136 x 136 (min_short_side=200 would remove all of them) and their names are of one or two words
# (half of them would fall below min_words=3); every other rule runs as the paper has it.
WEB_DEMO_TEXT = ("min_words=1",)
WEB_DEMO_IMAGE = ("min_short_side=100",)


def web_demo(out: Path, options, quiet: bool = False, preset: str = "demo", overrides: tuple[str, ...] = ()) -> int:
    """`make web-demo`: the whole chain offline, from a crawl of the built-in web to a trained model's held-out
    recall: build and serve the web, extract, the text rules, fetch, ingest, the image rules, dedup against the
    held-out split, shard, train (the demo preset), each stage's counts and the time. `preset` and `overrides`
    (key=value) make the model and say where the corpus is (data.data_dir), as for `openalign train`."""
    from openalign import presets
    from openalign.cli.main import main
    from openalign.corpora import web
    from openalign.prepare import shards
    from openalign.train.trainer import METRICS

    start = time.perf_counter()
    quiet_flag = ["--quiet"] if quiet else []

    def stage(*argv) -> None:
        print(f"\n$ openalign {' '.join(map(str, argv))}", flush=True)
        if main([str(a) for a in argv] + quiet_flag) != 0:
            raise ConfigError(f"the web demo stopped at `openalign {argv[0]}` (above); fix that and run it again")

    cfg = config_lib.override(presets.get(preset), list(overrides))
    train, held_out = shards(cfg, progress=not quiet)
    train_dir, eval_dir = Path(train[0]).parent, Path(held_out[0]).parent
    planted = web.build([str(train_dir)], out / "web", options)
    print(f"the web: {planted['images']:,} training images of {train_dir} on {planted['pages']:,} pages of "
          f"{planted['hosts']} hosts; planted: " + ", ".join(f"{k} {v:,}" for k, v in planted["counts"].items()))
    with web.serve(out / "web"):
        stage("extract", out / "web" / "crawl", "--out", out / "candidates")
        stage("filter", out / "candidates" / "candidates.parquet", "--out", out / "text-rules", "--rules", "text",
              *WEB_DEMO_TEXT)
        stage("fetch", out / "candidates", "--keep", out / "text-rules", "--out", out / "fetched",
              "--allow-private-addresses", "--contact", "web-demo@localhost")
    stage("ingest", out / "fetched", "--out", out / "pairs.parquet")
    stage("filter", out / "pairs.parquet", "--out", out / "image-rules", *WEB_DEMO_IMAGE)
    stage("dedup", out / "pairs.parquet", "--against", eval_dir, "--out", out / "dedup")
    stage("shard", out / "pairs.parquet", "--keep", out / "image-rules", "--keep", out / "dedup", "--out",
          out / "shards", "--image-size", "72")
    stage("train", "--preset", preset, "--data", out / "shards", "--eval-data", eval_dir, "--out", out / "run",
          "--overwrite", *overrides)
    rows = [json.loads(line) for line in (out / "run" / METRICS).read_text().splitlines() if line.strip()]
    final = next((r["eval"] for r in reversed(rows) if r.get("final")), {})
    minutes = (time.perf_counter() - start) / 60
    recall = ", ".join(f"{k} {final[k]:.3f} ({final[k] / final['chance_' + k]:.1f}x chance)"
                       for k in ("i2t_r10", "t2i_r10") if k in final and final.get("chance_" + k))
    print(f"\nthe web demo: {minutes:.1f} min from the crawl to the model; held-out {recall or 'recall: none'}")
    return 0
