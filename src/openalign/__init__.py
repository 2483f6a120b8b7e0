"""openalign: ALIGN's image/text dual encoders, from a web crawl to a served model (docs/api.md).

Every job a command does is a function with typed options and a result dataclass, re-exported here and imported
on first use, so that `import openalign` stays cheap and `import openalign.data` (a pool worker, a Spark executor)
does not import torch through it:

    load(dir) -> Model                              encode images and texts, classify       api.py
    configure(preset, overrides) -> Config          a run's config, as `train` resolves it  presets.py
    train_model(config) -> TrainResult              train (`openalign train`)               prepare.py
    evaluate(model, data, ...) -> EvalResult        `openalign eval`                        eval/evaluate.py
    extract, fetch, ingest, filter_pairs, dedup, screen, score, semdedup, balance,          pipeline/
    card, shard
    embed -> EmbedResult; build_index, add_to_index, delete_from_index -> IndexResult;
    open_index(dir); search(index, query) -> SearchResult                                   index/

The modules they live in list their public names in `__all__`.
"""

from typing import TYPE_CHECKING

LAZY = {  # name here: (module, its name there)
    "load": ("openalign.api", "load"), "Model": ("openalign.api", "Model"),
    "ConfigError": ("openalign.config", "ConfigError"), "Config": ("openalign.config", "Config"),
    "FilterConfig": ("openalign.pipeline.curation.filter_rules", "FilterConfig"),
    "configure": ("openalign.presets", "configure"),
    "train_model": ("openalign.prepare", "train"), "TrainResult": ("openalign.train.trainer", "TrainResult"),
    "evaluate": ("openalign.eval.evaluate", "evaluate"), "EvalResult": ("openalign.eval.evaluate", "EvalResult"),
    "EvalOptions": ("openalign.eval.options", "EvalOptions"),
    **{name: (f"openalign.pipeline.{module}", name) for module, names in (
        ("web.extract", ("extract", "ExtractOptions", "ExtractResult")),
        ("web.fetch", ("fetch", "FetchOptions", "FetchResult")),
        ("ingest", ("ingest", "IngestOptions", "IngestResult")), ("curation.filter", ("filter_pairs", "FilterResult")),
        ("curation.dedup", ("dedup", "DedupOptions", "DedupResult")),
        ("curation.screen", ("screen", "ScreenOptions", "ScreenResult")),
        ("curation.score", ("score", "ScoreOptions", "ScoreResult")),
        ("curation.semdedup", ("semdedup", "SemDedupOptions", "SemDedupResult")),
        ("curation.balance", ("balance", "BalanceOptions", "BalanceResult")),
        ("curation.card", ("card", "CardOptions", "CardResult")),
        ("shard", ("shard", "ShardOptions", "ShardResult"))) for name in names},
    "embed": ("openalign.index.embed", "embed"), "EmbedOptions": ("openalign.index.embed", "EmbedOptions"),
    "EmbedResult": ("openalign.index.embed", "EmbedResult"),
    "build_index": ("openalign.index.build", "build"), "IndexOptions": ("openalign.index.build", "IndexOptions"),
    "IndexResult": ("openalign.index.build", "IndexResult"), "open_index": ("openalign.index.opened", "load"),
    "add_to_index": ("openalign.index.grow", "add"), "delete_from_index": ("openalign.index.grow", "delete"),
    "search": ("openalign.index.search", "search"), "Query": ("openalign.index.search", "Query"),
    "Hit": ("openalign.index.search", "Hit"), "SearchResult": ("openalign.index.search", "SearchResult"),
}
__all__ = list(LAZY)

if TYPE_CHECKING:  # what a type checker sees: the names as imported (at run time, __getattr__ imports them)
    from openalign.api import Model, load
    from openalign.config import Config, ConfigError
    from openalign.eval.evaluate import EvalResult, evaluate
    from openalign.eval.options import EvalOptions
    from openalign.index.build import IndexOptions, IndexResult, build as build_index
    from openalign.index.embed import EmbedOptions, EmbedResult, embed
    from openalign.index.grow import add as add_to_index, delete as delete_from_index
    from openalign.index.opened import load as open_index
    from openalign.index.search import Hit, Query, SearchResult, search
    from openalign.pipeline.curation.balance import BalanceOptions, BalanceResult, balance
    from openalign.pipeline.curation.card import CardOptions, CardResult, card
    from openalign.pipeline.curation.dedup import DedupOptions, DedupResult, dedup
    from openalign.pipeline.web.extract import ExtractOptions, ExtractResult, extract
    from openalign.pipeline.web.fetch import FetchOptions, FetchResult, fetch
    from openalign.pipeline.curation.filter import FilterResult, filter_pairs
    from openalign.pipeline.curation.filter_rules import FilterConfig
    from openalign.pipeline.ingest import IngestOptions, IngestResult, ingest
    from openalign.pipeline.curation.score import ScoreOptions, ScoreResult, score
    from openalign.pipeline.curation.screen import ScreenOptions, ScreenResult, screen
    from openalign.pipeline.curation.semdedup import SemDedupOptions, SemDedupResult, semdedup
    from openalign.pipeline.shard import ShardOptions, ShardResult, shard
    from openalign.presets import configure
    from openalign.prepare import train as train_model
    from openalign.train.trainer import TrainResult


def __getattr__(name: str):
    if name in LAZY:
        import importlib

        module, attribute = LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'openalign' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY))
