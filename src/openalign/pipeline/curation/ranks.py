"""The pairs at given ranks of a table of scores, in the order of keeping (score descending, ties to the smaller uid),
found on either engine without sorting the table: score's cut at a fraction, its report's cuts and percentiles.

A top fraction of 1.8B pairs is k = 540M: `ORDER BY score DESC LIMIT k` is a single-partition top-k on Spark (one
task's heap holds k rows) and on DuckDB a heap of k rows that does not spill. Instead the k-th pair is *selected*:

1. one aggregate: how many finite scores, their least and greatest;
2. a histogram of BINS equal-width bins over the range that holds rank k (count, least and greatest of each bin:
   one grouping, BINS numbers back); the bin that holds it becomes the range (its least to its greatest score), and
   the ranks above it are counted;
3. once a range holds at most COLLECT scores, its rows are collected and sorted here, and rank k read off.

Binning is monotone in the score, so each range holds exactly the ranks between the counts around it; each pass
narrows the range ~65,536-fold, so a range of doubles is down to one value in at most ~4 passes (from 1.8B pairs:
27k scores a bin on average, collected after the third). Many pairs that share one score (the same image
twice under other keys with one text) are told apart by their uids the same way: grouped by their next two
characters, the group that holds the rank kept, until at most COLLECT are left. Every step is a scan and a grouping
on the engine; the driver holds BINS counts or COLLECT rows, whatever the table's size. The pair at rank k is then
a filter, `score > t OR (score = t AND uid <= u)`: no stage of the keep-list runs in one partition.

Several ranks are selected in the same passes (score's report: each cut's threshold and the pairs at its border,
and the percentiles, 60-odd ranks in ~3 scans).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

BINS = 65_536  # a histogram's bins (its counts come back to the driver)
COLLECT = 10_000  # a range of at most this many scores is collected and sorted on the driver (~1.5 MB)
WIDTH = 2  # characters of the uid told apart in one pass among equal scores


@dataclass(frozen=True)
class Window:
    """Where a rank lies: the scores in [lo, hi] (`count` of them), below `above` scores that rank higher."""

    lo: float
    hi: float
    above: int
    count: int


class ScoresView:
    """A table of (uid, score) on one engine, its finite scores as the view `ranked_scores`: what `select` asks of
    it, in SQL that DuckDB and Spark SQL both read (positional parameters)."""

    def __init__(self, query):
        self.query = query  # (sql, params) -> list of tuples

    def stats(self) -> tuple[int, float | None, float | None]:
        return tuple(self.query("SELECT count(*), min(score), max(score) FROM ranked_scores", [])[0])

    def histogram(self, lo: float, hi: float) -> list[tuple[int, int, float, float]]:
        """(bin, count, least, greatest) of the scores in [lo, hi], in BINS equal bins (bin 0 the lowest)."""
        width = (hi - lo) / BINS
        if not 0 < width < float("inf"):  # the range overflows a double, or is below the smallest width
            width = hi / BINS - lo / BINS if hi - lo == float("inf") else hi - lo
        return [tuple(r) for r in self.query(
            "SELECT CAST(least(greatest(floor((score - ?) / ?), 0), ?) AS BIGINT) AS b, count(*), min(score), "
            "max(score) FROM ranked_scores WHERE score BETWEEN ? AND ? GROUP BY 1",
            [lo, width, BINS - 1, lo, hi])]

    def rows(self, ranges: list[tuple[float, float]]) -> list[tuple[float, str]]:
        where = " OR ".join("score BETWEEN ? AND ?" for _ in ranges)
        return [tuple(r) for r in self.query(f"SELECT score, uid FROM ranked_scores WHERE {where}",
                                             [v for pair in ranges for v in pair])]

    def tie_groups(self, score: float, prefix: str) -> list[tuple[str, int]]:
        """(the next WIDTH characters after `prefix`, count) of the uids with this score that start with `prefix`."""
        return [tuple(r) for r in self.query(
            "SELECT substring(uid, ?, ?) AS g, count(*) FROM ranked_scores WHERE score = ? AND "
            "substring(uid, 1, ?) = ? GROUP BY 1", [len(prefix) + 1, WIDTH, score, len(prefix), prefix])]

    def tie_uids(self, score: float, prefix: str) -> list[str]:
        return [r[0] for r in self.query("SELECT uid FROM ranked_scores WHERE score = ? AND substring(uid, 1, ?) = ?",
                                         [score, len(prefix), prefix])]


def order(row: tuple[float, str]) -> tuple[float, str]:
    """The order of keeping: the higher score first, then the smaller uid (code points: UTF-8 bytes, as both engines
    compare strings)."""
    return -row[0], row[1]


def select(view: ScoresView, ranks) -> dict[int, tuple[float, str]]:
    """{rank: (score, uid)} of each 1-based rank of the finite scores in the order of keeping (see the module);
    ranks outside 1..n are left out."""
    n, lo, hi = view.stats()
    pending = {int(k): Window(lo, hi, 0, n) for k in set(ranks) if 1 <= int(k) <= n}
    found: dict[int, tuple[float, str]] = {}
    while pending:
        small = sorted({(w.lo, w.hi) for w in pending.values() if w.count <= COLLECT})
        if small:  # one scan collects every small range
            rows = sorted(view.rows(small), key=order)
            negated = [-r[0] for r in rows]  # ascending
            for k, w in list(pending.items()):
                if w.count <= COLLECT:  # the range's rows, in the order of keeping
                    found[k] = rows[bisect_left(negated, -w.hi) + k - w.above - 1]
                    del pending[k]
        for (lo, hi), group in _by_range(pending).items():
            if lo == hi:  # one score shared by more than COLLECT pairs: told apart by uid
                for k, w in group:
                    found[k] = (lo, _tied_uid(view, lo, k - w.above, w.count))
                    del pending[k]
                continue
            bins = sorted(view.histogram(lo, hi), reverse=True)  # the highest scores first
            for k, w in group:
                above = w.above
                for _, count, low, high in bins:
                    if k <= above + count:
                        pending[k] = Window(low, high, above, count)
                        break
                    above += count
    return found


def _by_range(pending: dict[int, Window]) -> dict[tuple[float, float], list[tuple[int, Window]]]:
    groups: dict[tuple[float, float], list[tuple[int, Window]]] = {}
    for k, w in pending.items():
        groups.setdefault((w.lo, w.hi), []).append((k, w))
    return groups


def _tied_uid(view: ScoresView, score: float, rank: int, count: int) -> str:
    """The `rank`-th smallest uid among the `count` pairs with this score."""
    prefix = ""
    while count > COLLECT:
        groups = sorted(view.tie_groups(score, prefix))
        at = 0
        while rank > groups[at][1]:
            rank -= groups[at][1]
            at += 1
        group, count = groups[at]
        if group == "":  # the uid that is the prefix itself
            return prefix
        prefix += group
    return sorted(view.tie_uids(score, prefix))[rank - 1]


def percentile_ranks(scored: int, percentiles) -> set[int]:
    """The ranks (1: the highest score) whose scores the percentiles interpolate between."""
    return {scored - f((scored - 1) * q / 100) for q in percentiles for f in (math.floor, math.ceil)} if scored \
        else set()


def percentile(found: dict, scored: int, q: float) -> float:
    """numpy's linear percentile (DuckDB's quantile_cont) from the selected ranks (rank 1 the highest score)."""
    h = (scored - 1) * q / 100
    low, high = found[scored - math.floor(h)][0], found[scored - math.ceil(h)][0]
    return float(low + (high - low) * (h - math.floor(h)))


def percentiles(view: ScoresView, qs) -> dict[str, float]:
    """{pQ: value} of the finite scores, exact, selected on the engine (no value list held anywhere)."""
    scored = view.stats()[0]
    found = select(view, percentile_ranks(scored, qs))
    return {f"p{q:g}": percentile(found, scored, q) for q in qs} if scored else {}


def duckdb_view(con, source: str, finite: str) -> ScoresView:
    """The finite scores of `source` (a read_parquet argument) on a DuckDB connection."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW ranked_scores AS SELECT score, uid FROM read_parquet("
                f"'{source.replace(chr(39), chr(39) * 2)}') WHERE {finite}")
    return ScoresView(lambda sql, params: con.execute(sql, params).fetchall())


def spark_view(spark, frame, finite: str) -> ScoresView:
    """The same on Spark: each question a Spark job, the answers' few rows collected."""
    frame.where(finite).select("score", "uid").createOrReplaceTempView("ranked_scores")
    return ScoresView(lambda sql, params: [tuple(r) for r in spark.sql(sql, args=list(params)).collect()])


def engine_view(sql, query: str) -> ScoresView:
    """The view of `query`'s (score, uid) rows, finite ones only, through an `engine.EngineSql`."""
    sql.view("ranked_scores", query)
    return ScoresView(sql.rows)
