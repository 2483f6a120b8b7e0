"""`openalign filter`: ALIGN's frequency filters over a pair table, as a keep-list and a report.

    openalign filter pairs.parquet --out DIR [--engine local|spark] [key=value ...]

The rules are SQL (filter_rules.py: one statement text, two dialects); the local engine (DuckDB, embedded: the
default) or Apache Spark runs them
(filter_sql.py). Outputs in DIR: `keep.parquet` (sorted distinct uids of kept pairs: a file from DuckDB, a
directory of sorted part files from Spark), `filter_report.json` (per rule: pairs removed on its own and in
sequence, example texts; `distinct_terms` as counted by hash, which a collision would lower by one;
`exactly_counted_terms`: the candidates counted by their strings), written last, and `filter_report.png`.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from openalign import plots
from openalign.config import ConfigError, expect
from openalign.sizes import format_size, parse_size
from openalign.data.engine import Engine, engine_name
from openalign.data.pairs import FILTER_COLUMNS, manifest_path
from openalign.pipeline.curation.filter_sql import SpillWatch, sql_backend
from openalign.pipeline.runner import Run, Stage, run_stage
from openalign.pipeline.curation.filter_rules import (GROUPS, PARTED, DONE_AFTER, RULE_OPTIONS, RULES, FilterConfig,
                                                      applies, count_statements, examples_query, exact_cut,
                                                      flag_statements, group_query, hash_query, keep_query,
                                                      occurrence_count_query, summary_query)

__all__ = ["FilterResult", "RuleCount", "filter_pairs"]

REPORT = "filter_report.json"  # fetch --keep reads it


SIZE_RULES = ("image_small", "image_aspect")  # the rules that need an image's size
TOP_GROUPS = 50  # languages and hosts in the report
DOMINANT_SHARE = 0.5  # a rule that removes at least this share of the corpus on its own is called out first


ENGINE_NAMES = {"local": "DuckDB (local)", "spark": "Spark"}


def resolve_rules(pairs: str, cfg: FilterConfig) -> tuple[FilterConfig, str | None]:
    """`rules=auto` made concrete: `image` for a pair table whose ingest manifest says every pair came from candidates
    the text rules had filtered before the download (`text_rules`: their filter reports), so those rules do not run
    twice (on fewer texts, their frequencies would remove more); else `all`. Returns (cfg, why) or (cfg, None)."""
    if cfg.rules != "auto":
        return cfg, None
    try:
        manifest = json.loads(manifest_path(Path(pairs)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    filtered = manifest.get("text_rules") if isinstance(manifest, dict) else None
    if filtered:
        return replace(cfg, rules="image"), (f"image: the text rules ran on the candidates before the download "
                                             f"({', '.join(filtered)}); --rules all runs them again")
    return replace(cfg, rules="all"), "all"


@dataclass(frozen=True)
class RuleCount:
    """What one rule removed: alone (every pair it fires on) and in sequence (those no earlier rule took)."""

    rule: str
    description: str  # the rule with its thresholds
    removed_alone: int
    removed_in_sequence: int
    examples: list[str]  # texts of pairs it removed


@dataclass(frozen=True)
class FilterResult:
    """What `filter_pairs` kept and why (its report, OUT/filter_report.json, holds the same and more)."""

    keep: Path  # OUT/keep.parquet: the kept pairs' uids
    pairs: int  # pairs read
    kept_pairs: int
    removed_pairs: int
    rules: list[RuleCount]  # in the order they run
    rules_chosen: str | None  # what `rules="auto"` chose (None: the rules were given)
    not_applied: dict[str, str]  # rules that judged no pair, and why
    warnings: list[str]  # a rule that removed most of the corpus, and what to check
    seconds: float
    report: dict  # the report as written
    figure: Path  # OUT/filter_report.png

    def lines(self) -> list[str]:
        """The terminal's summary: notes, the counts, each rule's removals."""
        return summary_lines(self.report)


@dataclass(frozen=True)
class FilterReport:
    """OUT/filter_report.json: `stage`, `input` (the table), these fields to `keep`, `seconds`, then the rest."""

    engine: str
    config: dict
    rules_chosen: str | None  # why --rules auto chose what it did (None: --rules was given)
    sizes: dict  # image_small and image_aspect judge the size before a downloader's resizing, where the table has it
    not_applied: dict  # the rules that judged no pair, and why: left out by --rules, or no image's size known
    pairs: int
    kept_pairs: int
    kept_uids: int
    removed_pairs: int
    distinct_terms: int
    exactly_counted_terms: int
    rules: list  # in the order they run: RuleCount's fields
    by_language: list  # a candidate table's pairs per language of their text and per image host (the most first)
    by_host: list
    keep: str
    memory_limit: int  # bytes (0: no limit)
    spilled_bytes: int
    warnings: list  # a rule that removed most of the corpus, and what to check

    def layout(self, head: dict, seconds: float) -> dict:
        fields_ = asdict(self)
        first = {k: fields_.pop(k) for k in list(fields_) if k not in ("memory_limit", "spilled_bytes", "warnings")}
        return {"stage": head["stage"], "input": head["pairs"], **first, "seconds": seconds, **fields_}


class Filter(Stage):
    name = "filter"
    options = FilterConfig
    result = FilterResult
    columns = FILTER_COLUMNS
    pairs_help = ("the pair table from `openalign ingest`, or the candidate table from `openalign extract` "
                  "(DIR/candidates.parquet)")
    overrides = True  # thresholds as key=value too: `openalign filter PAIRS --out DIR min_words=3`
    engine_options = {"rename": {"memory": "--memory-limit", "workers": "--threads"}, "skip": ()}

    def engine(self, options: FilterConfig, engine: Engine) -> Engine:
        return engine  # one SQL back end per run: DuckDB's threads are the engine's workers

    def check(self, run: Run) -> None:
        self.cfg, self.chosen = resolve_rules(run.pairs, run.options)

    def plan(self, run: Run) -> list:
        return []  # SQL statements on the back end (filter_sql.py), not jobs: DuckDB spills, Spark shuffles

    def merge(self, run: Run, results: dict) -> FilterReport:
        cfg, chosen, pairs, out = self.cfg, self.chosen, run.pairs, run.out
        backend = sql_backend(run.engine, str(out / "tmp"))
        spill = SpillWatch(out / "tmp")  # DuckDB's spill files (Spark's shuffle files are not spills)
        with spill if run.engine.name == "local" else contextlib.nullcontext():
            try:
                figures = _run_filters(backend, pairs, cfg, run.progress)
                backend.write_keep(run.keep)
            finally:
                backend.close()
        total, originals, unsized = figures["total"], figures["originals"], figures["unsized"]
        report = FilterReport(
            engine=run.engine.name, config=asdict(cfg), rules_chosen=chosen,
            sizes={"original": int(originals), "as_stored": int(total) - int(originals) - int(unsized),
                   "unknown": int(unsized)},
            not_applied={rule: ((chosen if chosen not in (None, "all") else f"--rules {cfg.rules}")
                                if not applies(rule, cfg) else "no image's size is known")
                         for rule in RULES if not applies(rule, cfg) or (rule in SIZE_RULES and unsized == total)},
            pairs=int(total), kept_pairs=int(figures["kept"] or 0), kept_uids=int(figures["kept_uids"]),
            removed_pairs=int(total) - int(figures["kept"] or 0), distinct_terms=int(figures["distinct_terms"]),
            exactly_counted_terms=int(figures["candidates"]), rules=figures["rules"],
            by_language=figures["groups"].get("language", []), by_host=figures["groups"].get("host", []),
            keep=str(run.keep), memory_limit=parse_size(run.engine.memory), spilled_bytes=spill.peak, warnings=[])
        return replace(report, warnings=dominant_rules(asdict(report)))

    def figure(self, run: Run, report: FilterReport):
        return report_figure(asdict(report))

    def result_fields(self, run: Run, report: FilterReport) -> dict:
        return {"rules": [RuleCount(**r) for r in report.rules], "figure": run.out / "filter_report.png"}

    def summary(self, result: FilterResult, options: FilterConfig) -> list[str]:
        return result.lines()


def _run_filters(backend, pairs: str, cfg: FilterConfig, progress: bool) -> dict:
    """The statistics and the flags on the back end; returns the counts the report is made of."""
    backend.register(pairs)
    if not backend.rows("SELECT count(*) FROM pairs")[0][0]:
        raise ConfigError(f"{pairs} holds no pairs: nothing to filter (did its ingest find any images?)")
    counting = count_statements(cfg, backend.dialect)
    bar = _progress(progress, len(counting) + 2)
    for name, query in counting:
        backend.materialize(name, query)
        bar.update()
    parts = backend.parts(occurrence_count_query(cfg, backend.dialect))
    hashes = backend.count_hashes(hash_query(cfg, backend.dialect), parts)
    bar.update()
    cut, distinct_terms, candidates = exact_cut(backend, cfg, hashes)
    backend.drop("term_hashes", "frequent_hashes")
    bar.update()
    flagging = flag_statements(cfg, backend.dialect, cut)
    bar.total += len(flagging)
    for name, query in flagging:
        if name in PARTED:
            backend.materialize_parts(name, query, parts)
        else:
            backend.materialize(name, query)
        backend.drop(*DONE_AFTER.get(name, ()))
        bar.update()
    bar.close()
    total, *counts, kept = backend.rows(summary_query())[0]
    # a grouping, which spills: DuckDB's count(DISTINCT) does not (50M uids ran out of memory under 512 MB)
    kept_uids = backend.rows("SELECT count(*) FROM (SELECT DISTINCT uid FROM (" + keep_query() + ") k) d")[0][0]
    rules = []
    for i, (rule, description) in enumerate(RULES.items()):
        examples = [r[0] for r in backend.rows(examples_query(rule, cfg.examples))] if counts[2 * i] else []
        rules.append({"rule": rule, "description": description.format(**asdict(cfg)),
                      "removed_alone": int(counts[2 * i] or 0), "removed_in_sequence": int(counts[2 * i + 1] or 0),
                      "examples": examples})
    return {
        "total": total, "kept": kept, "kept_uids": kept_uids, "rules": rules, "distinct_terms": distinct_terms,
        "candidates": candidates,
        "originals": backend.rows("SELECT count(*) FROM pairs WHERE has_original")[0][0],
        "unsized": backend.rows("SELECT count(*) FROM pairs WHERE width IS NULL OR height IS NULL")[0][0],
        "groups": {column: [{"value": value, "pairs": int(n), "kept": int(k or 0),
                             "removed_alone": {rule: int(c or 0) for rule, c in zip(RULES, removed)}}
                            for value, n, k, *removed in backend.rows(group_query(column, TOP_GROUPS))]
                   for column in GROUPS if column in backend.columns},
    }


def filter_pairs(pairs: Path, out: Path, cfg: FilterConfig = FilterConfig(), engine: Engine | str = Engine(),
                 master: str = "", memory_limit: str | int = "", threads: int = 0,
                 progress: bool = True) -> FilterResult:
    """Filter the pair table (or extract's candidate table) `pairs` by ALIGN's rules into a keep-list and its
    report in `out`, on `engine` (local: DuckDB, embedded, with the engine's `memory` as its limit and its `workers`
    as threads; spark: Spark SQL). `engine` as a name with `master`, `memory_limit` and `threads` is the older
    spelling, still taken, with a DeprecationWarning."""
    cfg = expect(cfg, FilterConfig, "cfg")
    if isinstance(engine, str) or master or memory_limit or threads:
        if not isinstance(engine, str) and engine != Engine():
            raise ConfigError("give the engine's master, memory and threads in the Engine (Engine(name, master, "
                              "workers=THREADS, memory=LIMIT)), not beside it")
        warnings.warn("filter_pairs(engine=NAME, master=, memory_limit=, threads=) is deprecated: pass "
                      "engine=Engine(NAME, master, workers=THREADS, memory=LIMIT)", DeprecationWarning, stacklevel=2)
        memory = parse_size(memory_limit, "--memory-limit")
        name = engine_name(engine) if isinstance(engine, str) else "local"
        engine = Engine(name, master, workers=threads, memory=str(memory) if memory else "")
    return run_stage(Filter(), pairs, out, cfg, progress, engine)


def _progress(progress: bool, total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="filter", unit="stage", disable=not progress, leave=False)


def report_figure(report: dict, top: int = 12):
    """Each rule's removals alone and in sequence; for a candidate table, beside them the pairs kept and removed per
    language of their text."""
    plt = plots.pyplot()

    rules = report["rules"]
    names = [r["rule"] for r in rules]
    alone = [r["removed_alone"] for r in rules]
    sequence = [r["removed_in_sequence"] for r in rules]
    languages = report.get("by_language", [])[:top]
    fig, axes = plt.subplots(1, 2 if languages else 1, figsize=(15 if languages else 8, 4.5), squeeze=False)
    ax = axes[0][0]
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], alone, height=0.4, label="removed on its own")
    ax.barh([i - 0.2 for i in y], sequence, height=0.4, label="removed in sequence (after the rules above)")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("pairs")
    ax.set_title(f"ALIGN filters: {report['kept_pairs']:,} of {report['pairs']:,} pairs kept "
                 f"({report['kept_pairs'] / max(report['pairs'], 1):.1%})")
    ax.legend(loc="lower right", fontsize=8)
    if languages:
        by = axes[0][1]
        labels = [str(g["value"]) for g in languages]
        kept = [g["kept"] for g in languages]
        by.barh(labels, kept, color="tab:green", label="kept")
        by.barh(labels, [g["pairs"] - g["kept"] for g in languages], left=kept, color="tab:red", label="removed")
        by.invert_yaxis()
        by.set_xlabel("pairs")
        by.set_title(f"per language of the text (top {len(languages)})")
        by.legend(loc="lower right", fontsize=8)
    return fig


def dominant_rules(report: dict) -> list[str]:
    """A sentence for each rule that alone removes most of the corpus: its threshold and the option to change.
    The paper's thresholds suit web images; a collection of small images or short captions is not one."""
    out = []
    for r in report["rules"]:
        share = r["removed_alone"] / max(report["pairs"], 1)
        if share >= DOMINANT_SHARE:
            options = " / ".join(f"{k}={report['config'][k]}" for k in RULE_OPTIONS[r["rule"]])
            out.append(f"{r['rule']} alone removes {share:.0%} of the pairs ({r['description']}): if this collection "
                       f"is meant to be kept, change {options} (e.g. `openalign filter ... {RULE_OPTIONS[r['rule']][0]}"
                       f"=...`)")
    return out


def summary_lines(report: dict) -> list[str]:
    lines = [f"warning: {w}" for w in report.get("warnings", [])]
    if report.get("spilled_bytes"):
        limit = f"its memory limit ({format_size(report['memory_limit'])})" if report.get("memory_limit") else "memory"
        lines.append(f"note: DuckDB spilled up to {report['spilled_bytes'] / 2**30:.2f} GiB to disk "
                     f"({Path(report['keep']).parent / 'tmp'}): the work did not fit {limit}, so it ran out-of-core "
                     "(slower; raise --memory-limit to avoid it)")
    skipped = report.get("not_applied", {})
    if skipped:
        by_why: dict[str, list[str]] = {}
        for rule, why in skipped.items():
            by_why.setdefault(why, []).append(rule)
        for why, rules in by_why.items():
            after = "; they run on the pair table after the download" if why.startswith("no image") else ""
            lines.append(f"note: {', '.join(rules)} not applied ({why}{after})")
    if report.get("sizes", {}).get("unknown") and not set(SIZE_RULES) <= set(skipped):
        lines.append(f"note: {report['sizes']['unknown']:,} pairs of unknown image size were not judged by "
                     f"{' and '.join(SIZE_RULES)}")
    if report.get("sizes", {}).get("original"):
        lines.append(f"note: image sizes judged before resizing for {report['sizes']['original']:,} pairs (their "
                     "original_width/height from img2dataset), as stored for the other "
                     f"{report['sizes']['as_stored']:,}")
    engine = ENGINE_NAMES.get(report["engine"], report["engine"])
    lines += [f"{report['pairs']:,} pairs -> {report['kept_pairs']:,} kept "
              f"({report['kept_pairs'] / max(report['pairs'], 1):.1%}) by {engine} in {report['seconds']:.1f} s"]
    for r in report["rules"]:
        lines.append(f"  {r['rule']:<17} alone {r['removed_alone']:>10,}  in sequence {r['removed_in_sequence']:>10,}"
                     f"   {r['description']}")
    return lines
