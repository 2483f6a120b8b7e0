"""The entry point: the commands, their parser (only the running command's flags are built), and the error policy:
a `ConfigError` or a full disk is one sentence and exit code 2; the driver holds the output's lock."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from openalign import host
from openalign.config import ConfigError
from openalign.pipeline import registry


@dataclass(frozen=True)
class Command:
    help: str  # the line `openalign --help` shows
    module: str  # the module under openalign.cli with its `NAME_flags(parser)` and `run_NAME(args)`
    quiet: bool = True  # it has --quiet (no progress bars)
    stage: bool = False  # a keep-list stage of pipeline/registry.py: cli/stages.py builds it from its declaration


def _with_stages(table: dict[str, Command]) -> dict[str, Command]:
    """`table` with the command of every registered stage over a pair table (pipeline/registry.py) after ingest's."""
    stages = {name: Command(row.help, "stages", stage=True) for name, row in registry.STAGES.items()
              if name not in table}
    spliced: dict[str, Command] = {}
    for name, command in table.items():
        spliced[name] = command
        if name == "ingest":
            spliced |= stages
    return spliced | stages


COMMANDS = _with_stages({
    "train": Command("train a dual encoder (no arguments: the CPU demo on built-in emoji)", "train"),
    "eval": Command("evaluate a saved model: retrieval, zero-shot, transfer, similarity", "evaluate", quiet=False),
    "corpus": Command("build a built-in corpus as webdataset shards", "corpus"),
    "extract": Command("web archives (Common Crawl WAT, WARC) -> candidate (image URL, alt-text) pairs", "crawl"),
    "fetch": Command("candidate URLs -> images, politely and safely, in img2dataset's webdataset layout", "crawl"),
    "web": Command("the built-in web: build pages of several hosts from a corpus, serve them on 127.0.0.1, or run "
                   "the demo", "web"),
    "ingest": Command("folders, tables (csv/tsv/jsonl/parquet) and webdataset tars -> a pair table", "stages"),
    "shard": Command("kept pairs -> resized webdataset shards (reruns skip finished shards)", "stages"),
    "embed": Command("image embeddings of a collection (resumable parts + metadata)", "index"),
    "index": Command("a FAISS index over embeddings, tuned to a recall target", "index"),
    "search": Command("search an index by text, image, or image +/- texts", "index", quiet=False),
    "serve": Command("the search page, HTTP API and clip-retrieval API over one or more indexes", "serve",
                     quiet=False),
    "tokenizer": Command("train a WordPiece vocabulary on the texts of some shards", "train", quiet=False),
})


def commands() -> dict[str, Command]:
    """Every command, with any keep-list stage registered since this module was imported (a plug-in's)."""
    return _with_stages(COMMANDS)


def _module(name: str):
    return importlib.import_module(f"openalign.cli.{commands()[name].module}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openalign")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s flags are built (from options classes, in modules that do not import torch)."""
    parser = argparse.ArgumentParser(prog="openalign", description="ALIGN: image/text dual encoders from noisy data")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command_ in commands().items():
        p = sub.add_parser(name, help=command_.help, description=command_.help)
        if name == command:
            if command_.stage:
                _module(name).stage_flags(p, name)
            else:
                getattr(_module(name), f"{name}_flags")(p)
            if command_.quiet:
                p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.set_defaults(func=functools.partial(_run, name))
    return parser


def _run(name: str, args) -> int:
    """The command `name` on its parsed flags (its module imported now)."""
    if commands()[name].stage:
        return _module(name).run_stage_command(name, args)
    return getattr(_module(name), f"run_{name}")(args)


def _sentence(err: ConfigError) -> str:
    """The error's own sentence; a ConfigError raised in a DataLoader worker comes back wrapped in the worker's
    traceback ("Caught ConfigError in DataLoader worker process 0. Original Traceback ..."): its last line."""
    text = str(err).strip()
    if "Original Traceback" in text:
        text = text.splitlines()[-1].split("ConfigError: ", 1)[-1]
    return text


def _owner(args):
    """The output's lock for the run (outputs.owned), taken by the driver: rank 0 under torchrun. `train` takes
    its own (its run directory may come from the config). The rank is read as `distributed.from_env` reads it,
    without importing torch (a second of every data command's start)."""
    from openalign.outputs import owned

    out = getattr(args, "out", None)
    if args.command == "index" and (args.add or args.delete):  # the index being grown
        out = out or (args.index if args.add else args.embeddings)
    if not out or args.command == "train" or int(os.environ.get("RANK", 0)) != 0:
        return contextlib.nullcontext()
    return owned(Path(out))


def _quiet_transformers() -> None:
    """The settings of cli/__init__.py as the command starts: transformers reads them once, when it is imported,
    so a process that imported it before (a test run, a notebook) would still show its per-file progress bars
    ("Loading weights", "Writing model shards") and load reports. A process that has not imported it yet reads
    the environment when it does."""
    if "transformers" not in sys.modules:
        return
    from transformers.utils import logging as hf_logging

    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in ("1", "true", "yes"):
        hf_logging.disable_progress_bar()
    if os.environ.get("TRANSFORMERS_VERBOSITY") == "error":
        hf_logging.set_verbosity_error()


def _extras(args) -> None:
    """The optional parts (pyproject.toml's extras) a command asks for are installed, or one sentence with the pip
    command: --engine spark ([spark]); serve's, extract's and fetch's are checked before their flags are built,
    and train.report_to's with the resolved config."""
    # filter's own --engine, or the Engine options' `name` (its --engine; `master` comes with it)
    engine = getattr(args, "engine", None) or (args.name if hasattr(args, "master") else None)
    if engine == "spark":
        host.require_extra("spark", "--engine spark")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    except ConfigError as err:
        print(f"openalign: error: {_sentence(err)}", file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    # `filter PAIRS --out D key=value`: overrides after options land in `extra`; argparse cannot intermix them
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _quiet_transformers()
    args.argv = argv  # the command as typed, for the provenance of what it writes (a data card)
    try:
        _extras(args)  # an optional part that is not installed: one sentence, before any work
        with _owner(args), host.command_scope():  # the command's caches (tar offsets, models) end with it
            code = args.func(args)
    except ConfigError as err:
        print(f"openalign: error: {_sentence(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        from openalign.outputs import disk_full, is_disk_full

        if not is_disk_full(err):
            raise
        print(f"openalign: error: {disk_full(err, getattr(args, 'out', None))}", file=sys.stderr)
        return 2
    if "torch.distributed" in sys.modules:  # under torchrun: every rank leaves the group together
        from openalign import distributed

        distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
