"""`openalign embed` (a collection's embeddings), `openalign index` (build, add, delete) and `openalign search`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from openalign import host
from openalign.cli.common import engine, engine_flags, searches, size
from openalign.config import ConfigError
from openalign.flags import add_options, options_from


def embed_flags(p) -> None:
    from openalign.index.options import EmbedOptions

    p.add_argument("model", help="a model directory (RUN/model)")
    p.add_argument("--images", dest="sources", required=True, action="append",
                   help="an image directory, shards, or a Karpathy JSON / caption table (repeatable)")
    p.add_argument("--out", required=True, help="the embeddings' folder (resumable parts, their metadata and "
                                                "manifest)")
    add_options(p, EmbedOptions, rename={"images": "--image-root"})


def run_embed(args) -> int:
    import numpy as np

    from openalign import distributed
    from openalign.index.embed import EmbedOptions, embed

    host.reuse_freed_memory()
    result = embed(Path(args.model), args.sources, Path(args.out), options_from(args, EmbedOptions),
                   progress=not args.quiet)
    if distributed.from_env().main:
        texts = " and caption" if result.texts else ""
        print(f"{result.count:,} image{texts} embeddings ({result.dim}-d {result.dtype}) -> {args.out}; "
              f"{result.skipped:,} unreadable images skipped; {result.resumed_parts} of {result.parts} parts were "
              "already done")
        redone = {r: n for r, n in result.redone.items() if r != "new"}
        if redone:
            print("embedded again: " + ", ".join(f"{n} part{'s' * (n > 1)} ({reason})" for reason, n in redone.items()))
        if result.patch_bytes_per_image:
            per = result.patch_bytes_per_image
            print(f"patch vectors for re-ranking: {result.patches_per_image} per image, float16, {per:,} bytes per "
                  f"image ({per * result.count / 2**20:,.1f} MiB in all; the pooled embedding is "
                  f"{result.dim * np.dtype(result.dtype).itemsize:,} bytes)")
    return 0


def index_flags(p) -> None:
    from openalign.data.engine import Engine
    from openalign.index.options import IndexOptions

    p.add_argument("embeddings", nargs="?", help="the output of `openalign embed` (with --delete: the index)")
    p.add_argument("index", nargs="?", help="with --add: the index to grow")
    p.add_argument("--out", help="the index directory to build")
    p.add_argument("--add", action="store_true", help="append the new parts of EMB (a collection that grew and was "
                   "embedded again) to the index INDEX: `openalign index --add EMB INDEX`")
    p.add_argument("--delete", metavar="IDS", help="take ids out of every search of the index, and their images out "
                   "of every rebuild and add: `openalign index --delete 3,17,42 INDEX` (or @FILE, ids one per line)")
    add_options(p, IndexOptions, convert={"memory": size})
    add_options(p, Engine, only=("workers",), where="ivf shards, local engine: add tasks at once; ")
    engine_flags(p)


def run_index(args) -> int:
    from openalign.index.build import IndexOptions, build

    searches()
    if args.add or args.delete:
        return _grow_index(args)
    if args.index or not args.out or not args.embeddings:
        raise ConfigError("build an index with `openalign index EMB --out INDEX`; grow one with `openalign index "
                          "--add EMB INDEX` or `openalign index --delete IDS INDEX`")
    options = options_from(args, IndexOptions)
    before = _takedowns_in(Path(args.out))
    result = build(Path(args.embeddings), Path(args.out), options, engine=engine(args), progress=not args.quiet)
    params = ", ".join(f"{k} {v}" for k, v in result.params.items()) or "exact"
    where = (f"; {len(result.info['shards'])} IVF shards on disk, searched together, tuned on the first"
             if result.info["storage"] == "shards" else "")
    print(f"{result.kind} index of {result.count:,} {result.vectors} vectors ({params}; recall@10 "
          f"{result.recall_at_10:.3f} against exact search{where}) -> {args.out}")
    kept = result.info.get("deleted")
    if kept:
        print(f"kept the {kept['images']:,} images taken down from the index it replaced (index --delete): "
              f"{kept['count']:,} of them are in it and stay out of every search; --forget-deletions drops them")
    elif options.forget_deletions and before:
        print(f"dropped the {before:,} take-downs of the index it replaced, as --forget-deletions asked")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _takedowns_in(out: Path) -> int:
    """How many images the index in `out` holds taken down (0 where there is none, or it cannot be read)."""
    try:
        return int(((json.loads((out / "index.json").read_text()) or {}).get("deleted") or {}).get("count", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


def _grow_index(args) -> int:
    """`index --add EMB INDEX` and `index --delete IDS INDEX` (index/grow.py)."""
    from openalign.index import grow
    from openalign.index.build import IndexOptions

    if args.add and args.delete:
        raise ConfigError("--add and --delete are two commands: run one, then the other")
    if args.delete:
        if args.index or not (args.out or args.embeddings) or (args.out and args.embeddings):
            raise ConfigError("delete ids with `openalign index --delete IDS INDEX`")
        index = Path(args.out or args.embeddings)
        result = grow.delete(index, grow.parse_ids(args.delete))
        if not result.newly_deleted:
            print(f"every one of those ids was deleted from {index} already: nothing changed")
            return 0
        print(f"deleted {result.newly_deleted:,} ids from {index} ({result.deleted:,} deleted in all, of "
              f"{result.count:,}); searches no longer return them, and a rebuild or an add keeps their images out")
        return 0
    if args.index and args.out and Path(args.index).resolve() != Path(args.out).resolve():
        raise ConfigError(f"--add grows the index INDEX in place, so --out {args.out} would be ignored: give the "
                          "index once, `openalign index --add EMB INDEX`")
    index = args.index or args.out
    if not args.embeddings or not index:
        raise ConfigError("add new embeddings with `openalign index --add EMB INDEX`")
    if (Path(args.embeddings) / "index.json").is_file() and not (Path(index) / "index.json").is_file():
        raise ConfigError(f"{args.embeddings} is an index and {index} is not: the order is `openalign index --add EMB "
                          "INDEX`, the embed output first")
    result = grow.add(Path(args.embeddings), Path(index), options_from(args, IndexOptions), engine=engine(args),
                      progress=not args.quiet)
    if result.kept_down:
        print(f"{result.kept_down:,} of the added rows are images taken down before (index --delete): they stay "
              "deleted")
    if not result.added:
        print(f"{index} already holds every part of {args.embeddings} ({result.count:,} vectors): nothing to add")
        return 0
    recall = result.info["adds"][-1]["recall_at_10"]
    measured = f"; recall@10 on the added rows {recall:.3f} (built: {result.recall_at_10:.3f})" \
        if recall is not None else ""
    print(f"added {result.added:,} vectors to {index}: {result.count:,} in all, ids {result.count - result.added:,} "
          f"to {result.count - 1:,}{measured}")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def search_flags(p) -> None:
    from openalign.index.options import Query

    p.add_argument("index", help="the index directory (`openalign index`)")
    p.add_argument("--model", help="the model the index was embedded with (default: the one recorded)")
    p.add_argument("--image", help="an image file as the query")
    p.add_argument("-k", type=int, default=10, help="results")
    p.add_argument("--rerank", type=int, default=0, metavar="K",
                   help="re-order the top K by late interaction (a text query; needs `embed --patches`)")
    p.add_argument("--min-score", metavar="SCORE|METRICS_JSON",
                   help="leave out results scoring below this cosine; or `openalign eval`'s metrics JSON for this "
                        "model: its calibrated threshold (t2i_threshold_median)")
    add_options(p, Query, skip=("image",), rename={"plus": "--plus", "minus": "--minus"})


SHOWN_CAPTION = 200  # characters of a caption `search` prints


def run_search(args) -> int:
    from openalign.index import opened, search

    searches()
    index = opened.load(Path(args.index))
    if args.image and not Path(args.image).is_file():
        raise ConfigError(f"no image file {args.image}")
    query = options_from(args, search.Query, image=Path(args.image).read_bytes() if args.image else None)
    result = search.search(index, query, args.k, model=args.model, min_score=args.min_score, rerank=args.rerank)
    hits, floor = result.hits, result.min_score
    print(f"{'rank':>4}  {'score':>6}  {'id':>7}  path / caption")
    for hit in hits:
        text = hit.meta.get("caption") or ""
        text = text if len(text) <= SHOWN_CAPTION else text[:SHOWN_CAPTION - 1] + "…"  # a 4 MB caption: one line
        caption = f"  \"{text}\"" if text else ""
        print(f"{hit.rank:>4}  {hit.score:6.3f}  {hit.id:>7}  {hit.meta.get('path') or hit.meta.get('key')}{caption}")
    if floor is not None and len(hits) < args.k:
        print(f"{len(hits)} result{'s' * (len(hits) != 1)} score at least --min-score {floor:.4f}")
    if args.rerank:
        print(f"re-ranked the top {args.rerank} by late interaction in {result.rerank_ms:.1f} ms (scores: late "
              "interaction's)")
    return 0
