"""Balance the corpus over concepts as MetaCLIP does: match every alt-text against metadata entries, then cap each
entry at t pairs by sampling.

    openalign balance PAIRS [--metadata FILE] --per-entry 20000 --out DIR

MetaCLIP (Xu et al. 2024, facebookresearch/MetaCLIP) made CLIP's curation public. Each pair's text is matched
against the metadata entries by MetaCLIP's rules (pipeline/curation/concepts.py: whole words, case-sensitively,
overlapping entries all counted; Aho-Corasick). Sampling follows `metaclip1/balancing.py`: an entry matched by n
pairs keeps each with probability p = min(1, t / n), and a pair is kept when any of its entries samples it (so with
probability 1 - prod(1 - p_i)); a pair that matches no entry is dropped, as MetaCLIP drops it, and counted. A draw
is a hash of (seed, uid, entry), not a random stream, so a rerun and either engine keep the same pairs at one seed.

The default metadata: WordNet's synset names (the first lemma of each synset, lower case, `_` as a space: MetaCLIP's
`wordnet_synsets`, read from Debian's wordnet-base) and, in place of MetaCLIP's Wikipedia unigrams, the corpus's own
words found in at least `--term-min-pairs` pairs' texts.

Writes DIR/metadata.txt (the entries, one per line; an entry's id is its line number from 0), DIR/matches.parquet
(uid, entries: each pair's matched entry ids, empty where none: MetaCLIP's per-sample data), DIR/entries.parquet
(entry, id, pairs, kept, probability), DIR/keep.parquet and DIR/balance_report.json/.png (head and tail counts
before and after, with the pairs that matched nothing). A rerun that changes only t or the seed reuses the matches.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign import plots
from openalign.data.engine import Engine, Job, engine_sql, job_id, plan_glob
from openalign.data.pairs import write_keep_duckdb, write_keep_spark
from openalign.outputs import sources_key
from openalign.pipeline.curation.concepts import TAIL_BINS, MetadataOptions, match_table, write_table
from openalign.pipeline.runner import WORK, Run, Stage, run_stage

__all__ = ["BalanceOptions", "BalanceResult", "balance", "draws", "keep_probabilities", "sample_pairs"]

HEAD = 20  # entries shown at the head of the report


@dataclass(frozen=True)
class BalanceOptions(MetadataOptions):
    per_entry: int = 20_000  # t: an entry matched by n > t pairs keeps each with probability t / n (MetaCLIP: 20,000)
    seed: int = 0  # the draws: a hash of (seed, uid, entry)
    examples: int = 8  # texts shown for the pairs that matched no entry
    workers: int = 0  # local engine: processes (0: one per core)

    def cross_field_problems(self) -> list[str]:
        problems = []
        if self.per_entry < 1:
            problems.append(f"--per-entry {self.per_entry} must be at least 1 (MetaCLIP's t: 20,000 for 400M pairs)")
        problems += super().cross_field_problems()
        if min(self.workers, self.examples) < 0:
            problems.append("--workers and --examples must be at least 0")
        if not 0 <= self.seed < 2 ** 63:
            problems.append(f"--seed {self.seed} must be in [0, 2^63)")
        return problems


@dataclass(frozen=True)
class BalanceResult:
    """What `balance` kept (its report, OUT/balance_report.json, holds the same and more)."""

    keep: Path  # OUT/keep.parquet
    matches: Path  # OUT/matches.parquet: (uid, entries) of every pair
    entries: int  # metadata entries
    matched_entries: int  # entries with at least one pair
    pairs: int  # distinct pairs of the table
    unmatched_pairs: int  # matched no entry: dropped
    kept_pairs: int
    reused_matches: bool  # a rerun that changed only t or the seed
    seconds: float
    report: dict


# ---------------------------------------------------------------------------------------------- sampling

MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 whose outputs pass for independent uniform draws."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def uid_hashes(uids: list[str]) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.blake2b(u.encode(), digest_size=8).digest(), "little") for u in uids],
                    dtype=np.uint64)


def draws(seed: int, uid_hash: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """A uniform draw in [0, 1) per (pair, entry): a hash of the seed, the pair's uid and the entry id, the same on
    every engine and machine."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15) + entries.astype(np.uint64))
        return (_mix(uid_hash ^ key) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def keep_probabilities(counts: np.ndarray, per_entry: int) -> np.ndarray:
    """MetaCLIP's p = t / max(n, t) per entry (1 for an entry of at most t pairs)."""
    return per_entry / np.maximum(counts, per_entry).astype(np.float64)


def sample_pairs(uids: list[str], entries: list[list[int]], probability: np.ndarray, seed: int) -> np.ndarray:
    """Whether each pair is kept: any of its entries samples it (a pair with none: never)."""
    lengths = np.array([len(e) for e in entries], dtype=np.int64)
    flat = np.fromiter((e for es in entries for e in es), dtype=np.int64, count=int(lengths.sum()))
    hit = draws(seed, np.repeat(uid_hashes(uids), lengths), flat) < probability[flat]
    kept = np.zeros(len(uids), dtype=bool)
    np.logical_or.at(kept, np.repeat(np.arange(len(uids)), lengths), hit)
    return kept


# ---------------------------------------------------------------------------------------------- jobs

def sample_task(matches: str, out_path: str, probability: str, per_entry: int, seed: int) -> dict:
    """One job: which of a match job's pairs the entries sample."""
    table = pq.read_table(matches)
    uids, entries = table.column("uid").to_pylist(), table.column("entries").to_pylist()
    p = np.load(probability)
    kept = sample_pairs(uids, entries, p, seed)
    write_table(pa.table({"uid": pa.array(uids, pa.string()), "kept": pa.array(kept, pa.bool_())}), out_path)
    expected = sum(1.0 - float(np.prod(1.0 - p[e])) for e in entries if e)  # 1 - prod(1 - p_i) per pair
    return {"pairs": len(uids), "kept": int(kept.sum()), "expected": expected}


def _examples(sql, where: str, n: int) -> list[dict]:
    return [{"uid": uid, "text": text} for uid, text in sql.rows(
        f"SELECT uid, text FROM plan WHERE {where} ORDER BY uid LIMIT {int(n)}")] if n else []


def _summary(out: Path, plan: Path, parts: list[str], options: BalanceOptions, entries: list[str],
             counts: np.ndarray, kept: np.ndarray, probability: np.ndarray, engine: Engine) -> dict:
    with engine_sql(engine, out / WORK, plan_glob(plan), *parts) as sql:
        sql.source("plan", plan_glob(plan))
        sql.source("m", parts)
        unmatched = _examples(sql, f"uid IN (SELECT uid FROM m WHERE {sql.size}(entries) = 0)", options.examples)
    order = np.lexsort((np.arange(len(counts)), -counts))
    head = [{"entry": entries[i], "id": int(i), "pairs": int(counts[i]), "kept": int(kept[i]),
             "probability": float(probability[i])} for i in order[:HEAD] if counts[i] > 0]
    matched = counts[counts > 0]

    def tail(values: np.ndarray) -> dict:
        values = values[values > 0]
        bins = {f"{low}-{high} pairs" if high > low else f"{low} pair": int(((values >= low) & (values <= high)).sum())
                for low, high in TAIL_BINS}
        return {"entries": int(len(values)), **bins, f"over {TAIL_BINS[-1][1]:,} pairs": int(
            (values > TAIL_BINS[-1][1]).sum()), "over t": int((values > options.per_entry).sum()),
                "median": float(np.median(values)) if len(values) else None,
                "max": int(values.max()) if len(values) else None}

    return {"head": head, "tail_before": tail(counts), "tail_after": tail(kept),
            "entries_over_t": int((counts > options.per_entry).sum()), "entries_without_pairs": int(len(counts) -
                                                                                                    len(matched)),
            "unmatched_examples": unmatched}


def _figure(counts: np.ndarray, kept: np.ndarray, per_entry: int, title: str):
    plt = plots.pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for values, label, colour in ((counts, "before", "tab:grey"), (kept, "after", "tab:blue")):
        values = np.sort(values[values > 0])[::-1]
        if len(values):
            ax.loglog(np.arange(1, len(values) + 1), values, color=colour, label=f"{label} ({len(values):,} entries)")
    ax.axhline(per_entry, color="tab:red", lw=1, ls="--", label=f"t = {per_entry:,}")
    ax.set(xlabel="entry rank", ylabel="pairs matching the entry", title=title)
    ax.legend()
    return fig


@dataclass(frozen=True)
class BalanceReport:
    """OUT/balance_report.json, after `stage` and `pairs`."""

    engine: str
    rule: str
    metadata: dict  # where the entries came from, and their fingerprint
    total_pairs: int
    matched_pairs: int
    unmatched_pairs: int  # matched no entry: dropped
    kept_pairs: int
    removed_pairs: int
    expected_kept_pairs: float  # the sum of every pair's probability of being kept
    entries: int
    matched_entries: int
    head: list  # the entries with the most pairs, before and after
    tail_before: dict
    tail_after: dict
    entries_over_t: int
    entries_without_pairs: int
    unmatched_examples: list
    reused_matches: bool  # a rerun that changed only t or the seed
    matches: str
    entries_table: str
    keep: str
    options: dict


class Balance(Stage):
    name = "balance"
    options = BalanceOptions
    result = BalanceResult
    columns = ("uid", "text")
    pairs_help = ("the pair table from `openalign ingest`, or the candidate table from `openalign extract` (balancing "
                  "reads only the texts: it can run before the download)")
    writes = ", metadata.txt, matches.parquet and entries.parquet"
    files = (("matches", "matches"),)
    first_round = "sample"

    def plan(self, run: Run) -> list:
        """Match the texts (their own rounds of jobs, reused when the table and metadata are unchanged), count each
        entry's pairs, then one sampling job per part of the matches."""
        options, work = run.options, run.work
        self.matched = matched = match_table(run.pairs, run.out, options, run.engine, run.progress)
        with engine_sql(run.engine, work, *matched.parts) as sql:
            sql.source("matches", matched.parts)
            counted = sql.rows(f"SELECT e, count(*) FROM (SELECT {sql.unnest}(entries) AS e FROM matches) GROUP BY e")
        self.counts = counts = np.zeros(len(matched.entries), dtype=np.int64)
        for entry, n in counted:
            counts[entry] = n
        self.probability = keep_probabilities(counts, options.per_entry)
        np.save(work / "probability.npy", self.probability)
        self.sampled = [str(work / f"sampled-{job_id(i)}.parquet") for i in range(len(matched.parts))]
        sample_key = sources_key(matched.key, options.per_entry, options.seed,
                                 hashlib.blake2b(counts.tobytes(), digest_size=16).hexdigest())
        return [Job(job_id(i), sample_task, (matched.parts[i], self.sampled[i], str(work / "probability.npy"),
                                             options.per_entry, options.seed),
                    key=sources_key(sample_key, i), outputs=(self.sampled[i],))
                for i in range(len(matched.parts))]

    def merge(self, run: Run, results: dict) -> BalanceReport:
        options, out, matched, counts = run.options, run.out, self.matched, self.counts
        entries, matches, n_pairs = matched.entries, matched.matches, matched.pairs
        keep = run.keep
        with engine_sql(run.engine, run.work, *self.sampled, *matched.parts) as sql:  # on the executors on Spark
            sql.source("sampled", self.sampled)
            sql.source("matches", matched.parts)
            kept_uids = "SELECT uid FROM sampled WHERE kept"
            n_kept = (write_keep_spark(sql.frame(kept_uids), keep) if sql.spark is not None
                      else write_keep_duckdb(sql.con, kept_uids, [], keep))
            unmatched = sql.rows(f"SELECT count(*) FROM matches WHERE {sql.size}(entries) = 0")[0][0]
            after = sql.rows(f"SELECT e, count(*) FROM (SELECT {sql.unnest}(m.entries) AS e FROM matches m JOIN "
                             "sampled s ON m.uid = s.uid WHERE s.kept) GROUP BY e")
        self.kept = kept = np.zeros(len(entries), dtype=np.int64)
        for entry, n in after:
            kept[entry] = n
        pq.write_table(pa.table({"entry": entries, "id": pa.array(np.arange(len(entries)), pa.int32()),
                                 "pairs": counts, "kept": kept, "probability": self.probability}),
                       out / "entries.parquet")
        summary = _summary(out, matched.plan, matched.parts, options, entries, counts, kept, self.probability,
                           run.engine)
        self.title = f"{n_pairs:,} pairs over {int((counts > 0).sum()):,} entries: {n_kept:,} kept"
        return BalanceReport(
            engine=run.engine.name, rule=f"MetaCLIP's balancing, t = {options.per_entry:,}: a pair is kept when any "
            "matched entry samples it with probability min(1, t / n)", metadata=matched.origin,
            total_pairs=int(n_pairs), matched_pairs=int(n_pairs - unmatched), unmatched_pairs=int(unmatched),
            kept_pairs=int(n_kept), removed_pairs=int(n_pairs - n_kept),
            expected_kept_pairs=round(sum(r["expected"] for r in results.values()), 2), entries=len(entries),
            matched_entries=int((counts > 0).sum()), **summary, reused_matches=matched.reused, matches=str(matches),
            entries_table=str(out / "entries.parquet"), keep=str(keep), options=asdict(options))

    def figure(self, run: Run, report: BalanceReport):
        return _figure(self.counts, self.kept, run.options.per_entry, self.title)

    def result_fields(self, run: Run, report: BalanceReport) -> dict:
        return {"matches": self.matched.matches, "pairs": report.total_pairs}

    def summary(self, result: BalanceResult, options: BalanceOptions) -> list[str]:
        return [f"kept {result.kept_pairs:,} of {result.pairs:,} pairs: {result.matched_entries:,} of "
                f"{result.entries:,} entries matched, each capped at t = {options.per_entry:,}; "
                f"{result.unmatched_pairs:,} pairs matched no entry and were dropped"
                + (" (matches reused)" if result.reused_matches else "")]


def balance(pairs: Path, out: Path, options: BalanceOptions = BalanceOptions(), progress: bool = True,
            engine: Engine = Engine()) -> BalanceResult:
    """Match every pair's text against the metadata entries, count each entry's pairs, then keep each pair that
    any of its entries samples with probability min(1, t / count); write the keep-list and the report."""
    return run_stage(Balance(), pairs, out, options, progress, engine)
