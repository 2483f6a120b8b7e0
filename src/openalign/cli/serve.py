"""`openalign serve`: the search page, the HTTP API and clip-retrieval's API over one or more indexes."""

from __future__ import annotations

import sys

from openalign import host
from openalign.cli.common import searches, size
from openalign.flags import options_from, add_options


def serve_flags(p) -> None:
    host.require_extra("serve", "openalign serve")  # (its flags and app import FastAPI)
    from openalign.serve.options import Limits

    p.add_argument("indexes", nargs="+", metavar="INDEX",
                   help="index directories (named by their folder), NAME=DIR, or a JSON file of names like "
                        "clip-retrieval's indices_paths.json; an image and a text index of one name serve its two "
                        "modalities")
    p.add_argument("--model", help="the model the indexes were embedded with (default: each one's recorded)")
    p.add_argument("--host", default="127.0.0.1", help="127.0.0.1: this machine only; 0.0.0.0 to share it")
    p.add_argument("--port", type=int, default=8000, help="the port to listen on")
    p.add_argument("--allowed-hosts", metavar="NAME,...", help="more Host header names to answer (by default the "
                   "loopback names, and this machine's own names when --host is not loopback): what a proxy sends")
    p.add_argument("--min-score", metavar="SCORE|METRICS_JSON",
                   help="requests without min_score leave out results scoring below this cosine; or `openalign "
                        "eval`'s metrics JSON for this "
                        "model: its calibrated threshold (t2i_threshold_median)")
    add_options(p, Limits, convert={"max_upload_bytes": size, "max_image_bytes": size, "max_answer_bytes": size})


def run_serve(args) -> int:
    import uvicorn

    from openalign.serve.app import LOOPBACK, Limits, allowed_hosts, create_app
    from openalign.serve.catalog import Catalog, parse_specs

    searches()

    hosts = allowed_hosts(args.host, tuple(h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()))
    catalog = Catalog(parse_specs(args.indexes), args.model, args.min_score)
    app = create_app(catalog, limits=options_from(args, Limits), hosts=hosts)
    for name, collection in catalog.collections.items():
        held = ", ".join(f"{s['count']:,} {m} vectors ({s['kind']})" for m, s in collection.summary().items())
        print(f"  {name}: {held}")
    print(f"openalign search on http://{args.host}:{args.port}/ (API docs at /docs; clip-retrieval's ClipClient: "
          f"http://{args.host}:{args.port}/knn-service); Ctrl-C stops it")
    if args.host not in LOOPBACK:
        print(f"warning: --host {args.host} serves every client that can reach this machine on port {args.port}, "
              "with no authentication", file=sys.stderr)
    print(f"answering Host names: {', '.join(hosts)} (add others with --allowed-hosts)", file=sys.stderr)
    # SIGTERM / Ctrl-C: requests in flight get 10 s to finish, then the server stops whatever they do
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10)
    return 0
