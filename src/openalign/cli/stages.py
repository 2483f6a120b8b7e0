"""The corpus stages after the download: `ingest` (files -> a pair table), the keep-list stages (`filter`, and every
stage of pipeline/registry.py: its command built from its declaration by `stage_flags` and `run_stage_command`),
and `shard` (kept pairs -> training shards)."""

from __future__ import annotations

from pathlib import Path

from openalign.cli.common import engine, engine_flags, overridden
from openalign.flags import add_options, options_from


def ingest_flags(p) -> None:
    from openalign.pipeline.ingest import IngestOptions

    p.add_argument("sources", nargs="+", metavar="SRC", help="image folders, tables (csv, tsv, jsonl, parquet), "
                   "webdataset tars, Karpathy JSONs or fetch folders (img2dataset's or `openalign fetch`'s)")
    p.add_argument("--out", required=True, help="pairs.parquet (a .rejects.parquet and .manifest.json go beside it)")
    add_options(p, IngestOptions)
    engine_flags(p)


def run_ingest(args) -> int:
    from openalign.pipeline.ingest import IngestOptions, ingest

    result = ingest(args.sources, Path(args.out), options_from(args, IngestOptions), progress=not args.quiet,
                    engine=engine(args))
    rejected = ", ".join(f"{k} {v:,}" for k, v in result.rejected.items()) or "none"
    converted = ", ".join(f"{k} {v:,}" for k, v in result.conversions.items()) or "none"
    print(f"{result.pairs:,} pairs ({result.images:,} images) -> {args.out} in {result.seconds:.1f} s")
    print(f"rejected: {rejected} (listed in {result.rejects})")
    print(f"kept with conversion: {converted}")
    return 0


PAIRS = "the pair table from `openalign ingest` (pairs.parquet)"


def table_flags(p, out: str, options: type, pairs: str = PAIRS, keep: str = "") -> None:
    """A stage's flags: the table, --keep where it reads keep-lists, --out, its options and the engine's."""
    p.add_argument("pairs", help=pairs)
    if keep:
        p.add_argument("--keep", action="append", default=[], help=keep)
    p.add_argument("--out", required=True, help=out)
    add_options(p, options)
    engine_flags(p)


def keep_list_flags(p, report: str, options: type) -> None:
    """A stage that reads the pair table's images and writes a keep-list: dedup, screen, score, semdedup."""
    table_flags(p, f"a folder: the keep-list (keep.parquet) and {report}", options)


def stage_flags(p, name: str) -> None:
    """A registered keep-list stage's flags, from its declaration (pipeline/runner.py): the pair table, its inputs,
    --out, its options' fields and the engine's."""
    from openalign.pipeline.registry import declaration

    stage = declaration(name)
    p.add_argument("pairs", help=stage.pairs_help)
    for given in stage.inputs:
        flag = "--" + given.name.replace("_", "-")
        if given.repeat:
            p.add_argument(flag, dest=given.name, action="append", required=given.required, default=[], help=given.help)
        else:
            p.add_argument(flag, dest=given.name, required=given.required, help=given.help)
    p.add_argument("--out", required=True, help=stage.out_help or (
        f"a folder: the keep-list (keep.parquet) and {name}_report.json" + ("/.png" if stage.draws() else "")
        + stage.writes))
    add_options(p, stage.options, rename=stage.flags, deprecated=stage.deprecated_flags)
    engine_flags(p, **stage.engine_options)
    if stage.overrides:
        p.add_argument("overrides", nargs="*", metavar="key=value",
                       help="options as key=value too, e.g. min_short_side=200 max_images_per_text=10")


def run_stage_command(name: str, args) -> int:
    """A registered keep-list stage from its flags: its one run, its summary, the files it wrote."""
    from openalign.pipeline.registry import declaration
    from openalign.pipeline.runner import command_line, run_stage

    declared = declaration(name)
    options = options_from(args, declared.options)
    if declared.overrides and args.overrides:
        options = overridden(options, args.overrides)
    inputs = {given.name: getattr(args, given.name) for given in declared.inputs}
    stage = declared(**inputs, **({"command": command_line(args.argv)} if declared.provenance else {}))
    result = run_stage(stage, args.pairs, Path(args.out), options, progress=not args.quiet, engine=engine(args))
    for line in stage.summary(result, options):
        print(line)
    print(stage.files_line(result, Path(args.out)))
    return 0


def call(args, stage, options, *inputs, **extra):
    """A stage's one public call from its flags (`options`: a dataclass read from them, or one already read)."""
    options = options_from(args, options) if isinstance(options, type) else options
    return stage(args.pairs, *inputs, Path(args.out), options, progress=not args.quiet, engine=engine(args), **extra)


def shard_flags(p) -> None:
    from openalign.pipeline.shard import ShardOptions

    table_flags(p, "the shards' folder: resized webdataset .tar files and their manifest", ShardOptions,
                keep="a keep-list directory; repeat to intersect (none: every pair, for a clean collection)")


def run_shard(args) -> int:
    from openalign.pipeline.shard import ShardOptions, shard

    result = call(args, shard, ShardOptions, [Path(k) for k in args.keep])
    skipped = ", ".join(f"{k} {v:,}" for k, v in result.skipped.items()) or "none"
    print(f"{result.samples:,} images in {len(result.shards)} shards -> {args.out} ({result.resumed_shards} already "
          f"done; skipped: {skipped})")
    return 0
