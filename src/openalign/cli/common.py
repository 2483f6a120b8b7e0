"""What several commands share: the run flags of train, the data stages' engine, sizes, lists."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from openalign import config as config_lib
from openalign import host, presets, sizes
from openalign.config import ConfigError
from openalign.flags import add_options, options_from


def run_flags(p, what: str) -> None:
    """train: the base config, its data, and dotted overrides."""
    p.add_argument("--preset", default="demo", help=f"the base config: one of {', '.join(presets.PRESETS)}")
    p.add_argument("--data", help="the training shards: a directory of .tar, a brace pattern, a list file, or a "
                                  "Karpathy JSON")
    p.add_argument("--eval-data", help="the held-out shards for evaluation, or a Karpathy-split JSON")
    p.add_argument("--images", help="the image root when --data or --eval-data is a Karpathy-split JSON")
    p.add_argument("overrides", nargs="*", metavar="key=value", help=f"dotted overrides of {what}, e.g. "
                                                                      "optim.lr=5e-4")


def with_data(cfg: config_lib.Config, args) -> config_lib.Config:
    """--data / --eval-data (and --images, their image root), where given, as the config's training and
    held-out data."""
    if args.data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=args.data))
    if args.eval_data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=args.eval_data))
    if args.images:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, images=args.images))
    return cfg


def fitted(cfg: config_lib.Config, overrides: list[str]) -> config_lib.Config:
    """The loss options the chosen kind does not read, at its own values unless the user set them (one line each)."""
    import openalign.loss  # noqa: F401 - fills the registry of loss kinds
    from openalign import distributed

    cfg, notes = config_lib.fit_loss_options(cfg, list(overrides))
    if distributed.from_env().main:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return cfg


def engine_flags(p, rename: dict | None = None, skip: tuple[str, ...] = ("workers",)) -> None:
    """--engine local|spark and its settings, for the data stages (data/engine.py); `rename` where a stage spells
    one otherwise (filter: --memory-limit, DuckDB's, and --threads), `skip` what its own options set (workers)."""
    from openalign.data.engine import Engine

    names = {"name": "--engine", "memory": "--spark-memory"} | (rename or {})
    convert = {"memory": _size_text} if names["memory"] != "--spark-memory" else None  # checked as its flag
    add_options(p, Engine, rename=names, skip=skip, convert=convert)


def _size_text(text: str) -> str:
    size(text)  # a size, or argparse's one line naming the flag
    return text


def engine(args):
    """The per-image stages' engine from the flags; its image buffers reuse freed memory, as the workers' do."""
    from openalign.data.engine import Engine

    host.reuse_freed_memory()
    return options_from(args, Engine)


def size(text: str) -> int:
    """An argparse type for a size flag (argparse names the flag in its one-line error)."""
    try:
        return sizes.parse_size(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("a size ")) from None


def filter_config(overrides: list[str]):
    """The filter thresholds with `key=value` overrides, checked (the corpora that filter take them so)."""
    from openalign.pipeline.curation.filter_rules import FilterConfig

    return overridden(FilterConfig(), overrides)


def overridden(options, overrides: list[str]):
    """`options` with `key=value` overrides (filter's thresholds: `openalign filter PAIRS min_words=3`), checked."""
    keys = ", ".join(config_lib.leaf_keys(type(options)))
    return config_lib.override(options, overrides, help_hint=f"the keys are {keys}")


def searches() -> None:
    """FAISS's process-wide settings, once, as a command that searches starts (before any request thread)."""
    from openalign.index import exact

    exact.configure_faiss()
