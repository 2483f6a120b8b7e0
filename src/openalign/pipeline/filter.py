"""ALIGN's frequency filters as SQL over the Parquet pair table, run by DuckDB (default) or Apache Spark.

    openalign filter pairs.parquet --out DIR [--engine duckdb|spark] [key=value ...]

One set of queries, two dialects: the statement text below is shared, and each engine only supplies
the spelling of a few list functions, so both engines compute the same thing by construction (a test
runs both on one corpus and compares the keep-lists).

Rules (thresholds are `FilterConfig` fields; every statistic is counted on the raw table):

    image_small       shorter side <= min_short_side (paper: keep > 200 px)
    image_aspect      long / short >= max_aspect (paper: keep < 3)
    image_many_texts  the image carries > max_texts_per_image distinct alt-texts (paper: 1000)
    text_shared       the alt-text is shared by > max_images_per_text distinct images (paper: 10)
    text_length       fewer than min_words or more than max_words unigrams (paper: 3..20)
    text_rare         a unigram or bigram outside the vocab_size most frequent ones (paper: 100M)

Words are the alt-text split on whitespace (optionally lowercased): nothing language-specific, so the
multilingual corpus uses the same rules. Term frequencies count every pair; terms are ranked by count,
then by their UTF-8 bytes, so the top-K cut is deterministic. Terms are counted by a 64-bit hash first
(fixed-size keys that spill to disk), then exactly, by their strings, only those that can reach the top K:
the result is exact whatever the hash collides (`exact_cut`). Lowercasing follows each engine's
Unicode tables; they agree except for a few special cases (e.g. Turkish dotted I).

Outputs in DIR: `keep.parquet` (sorted distinct uids of kept pairs: a file from DuckDB, a directory of
sorted part files from Spark), `filter_report.json` (per rule: pairs removed on its own and in sequence,
example texts; `distinct_terms` as counted by hash, which a collision would lower by one;
`exactly_counted_terms`: the candidates counted by their strings) and `filter_report.png`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from openalign.config import ConfigError, FilterConfig, check
from openalign.data.engine import spark_session
from openalign.data.pairs import FILTER_COLUMNS, check_pair_table, sql_path
from openalign.outputs import unfinish, write_json

REPORT = "filter_report.json"

RULE_OPTIONS = {  # the FilterConfig keys that set each rule's threshold (`openalign filter ... key=value`)
    "image_small": ("min_short_side",), "image_aspect": ("max_aspect",), "image_many_texts": ("max_texts_per_image",),
    "text_shared": ("max_images_per_text",), "text_length": ("min_words", "max_words"), "text_rare": ("vocab_size",),
}
DOMINANT_SHARE = 0.5  # a rule that removes at least this share of the corpus on its own is called out first
RULES = {
    "image_small": "shorter side <= {min_short_side} px",
    "image_aspect": "aspect ratio (long/short) >= {max_aspect}",
    "image_many_texts": "image has > {max_texts_per_image} distinct alt-texts",
    "text_shared": "alt-text shared by > {max_images_per_text} images",
    "text_length": "fewer than {min_words} or more than {max_words} words",
    "text_rare": "a term outside the {vocab_size} most frequent unigrams+bigrams",
}


@dataclass(frozen=True)
class Dialect:
    split: str  # {x}: string -> list of strings on single spaces
    nonempty: str  # {x}: list without empty strings
    bigrams: str  # {x}: list of words -> list of "a b" strings
    concat_lists: str  # {a}, {b}
    size: str  # {x}
    explode: str  # {x}
    materialize: str  # {name}, {query}
    row_id: str  # a unique id per row of a query (internal only, never compared across engines)
    semi_join: str  # rows of the left side with a match
    anti_join: str  # rows of the left side without a match
    hash64: str  # {x}: a 64-bit hash of a string (terms are counted by it first; see count_statements)


DUCKDB = Dialect(
    split="string_split({x}, ' ')",
    nonempty="list_filter({x}, lambda s: s <> '')",
    bigrams="list_transform(range(1, len({x})), lambda i: {x}[i] || ' ' || {x}[i + 1])",
    concat_lists="list_concat({a}, {b})",
    size="len({x})",
    explode="unnest({x})",
    materialize="CREATE OR REPLACE TEMP TABLE {name} AS {query}",
    row_id="row_number() OVER ()",
    semi_join="SEMI JOIN",
    anti_join="ANTI JOIN",
    hash64="hash({x})",
)
SPARK = Dialect(
    split="split({x}, ' ')",
    nonempty="filter({x}, s -> s != '')",
    bigrams="zip_with(slice({x}, 1, greatest(size({x}) - 1, 0)), slice({x}, 2, greatest(size({x}) - 1, 0)), "
            "(a, b) -> concat(a, ' ', b))",
    concat_lists="concat({a}, {b})",
    size="size({x})",
    explode="explode({x})",
    materialize="CREATE OR REPLACE TEMP VIEW {name} AS {query}",
    row_id="monotonically_increasing_id()",
    semi_join="LEFT SEMI JOIN",
    anti_join="LEFT ANTI JOIN",
    hash64="xxhash64({x})",
)


WHITESPACE = (9, 10, 11, 12, 13)  # tab, line feed, vertical tab, form feed, carriage return (and the space)


def _terms(cfg: FilterConfig, d: Dialect) -> tuple[str, str]:
    """SQL expressions for a text's words and its terms (words, plus bigrams when vocab_ngrams is 2).

    Words: the text's other whitespace turned into spaces by plain replaces, split on single spaces, empty
    pieces dropped (= split on runs of whitespace; 3x faster here than one regular-expression replace)."""
    norm = "text"
    for code in WHITESPACE:
        norm = f"replace({norm}, chr({code}), ' ')"
    if cfg.lowercase:
        norm = f"lower({norm})"
    words = d.nonempty.format(x=d.split.format(x=norm))
    terms = "words" if cfg.vocab_ngrams == 1 else d.concat_lists.format(a="words", b=d.bigrams.format(x="words"))
    return words, terms


def _occurrences(cfg: FilterConfig, d: Dialect, columns: str, where: str = "") -> str:
    """Every term occurrence of every distinct text (or of the texts matching `where`), with the text's
    `columns`: a query, not a table (stored, the occurrences were the largest thing the filter wrote: 11 GiB
    spilled at 10M pairs)."""
    _, terms = _terms(cfg, d)
    return f"SELECT {columns}, {d.explode.format(x=terms)} AS term FROM texts" + (f" WHERE {where}" if where else "")


def occurrence_count_query(cfg: FilterConfig, d: Dialect) -> str:
    """How many term occurrences the texts have (how many rows `_occurrences` gives)."""
    size = d.size.format(x="words")
    return f"SELECT sum({size if cfg.vocab_ngrams == 1 else f'greatest(2 * {size} - 1, 0)'}) FROM texts"


def hash_counts(source: str) -> str:
    """Each hash of `source`'s (n_pairs, h) rows with its count: `term_hashes`' rows."""
    return f"SELECT h, sum(n_pairs) AS c FROM {source} GROUP BY h"


def hash_query(cfg: FilterConfig, d: Dialect) -> str:
    """(n_pairs, h): every term occurrence's text count and 64-bit hash, for `Engine.count_hashes`."""
    return f"SELECT n_pairs, {d.hash64.format(x='term')} AS h FROM ({_occurrences(cfg, d, 'n_pairs')}) e"


def count_statements(cfg: FilterConfig, d: Dialect) -> list[tuple[str, str]]:
    """Phase 1: distinct texts (with an id and their words), the texts shared by too many images, and how often
    each term occurs, counted by its 64-bit hash.

    Images per text are counted only for texts in more than max_images_per_text pairs (a text in fewer pairs
    cannot be on more images): `count(DISTINCT image_key)` grouped over every text was the step DuckDB could
    not spill (100M generated pairs under a 3GB limit ran out of memory there; counting pairs alone fits).

    Then (`hash_query`, `Engine.count_hashes`) terms are counted by hash, because grouping the strings
    themselves was the next step that ran out of memory at 100M pairs (hundreds of millions of distinct
    bigrams): integer keys are a fixed 16 bytes per group. A hash's count is its terms' total (a collision
    adds two terms' counts, never loses one), so it bounds each term's count from above;
    `candidate_statements` then counts the few terms that can reach the vocabulary exactly, by their
    strings (`exact_cut`)."""
    words, _ = _terms(cfg, d)
    limit = cfg.max_images_per_text
    return [
        ("texts", f"SELECT {d.row_id} AS tid, text, n_pairs, {words} AS words FROM "
                  "(SELECT text, count(*) AS n_pairs FROM pairs GROUP BY text) g"),
        ("shared_texts", f"SELECT p.text FROM pairs p {d.semi_join} (SELECT text FROM texts WHERE n_pairs > {limit}) c "
                         f"ON p.text = c.text GROUP BY p.text HAVING count(DISTINCT p.image_key) > {limit}"),
    ]


HASH_HISTOGRAM = "SELECT c, count(*) AS n FROM term_hashes GROUP BY c ORDER BY c DESC"
DONE_AFTER = {  # tables no later step reads, dropped (with their spill) once this step is stored
    "text_flags": ("texts", "shared_texts", "term_counts", "cut", "vocab", "rare_texts"),
    "image_flags": ("images", "crowded_images"),
    "pair_text_flags": ("text_flags",),
    "flags": ("pair_text_flags", "image_flags"),
}
PARTED = {"rare_texts"}  # steps with a {part} condition on the texts, that an engine may run in parts
GROUP_ROW_BYTES = 48  # DuckDB's memory per group of an integer key and a sum (measured: ~30 spilled per input row)
HISTOGRAM = "SELECT c, count(*) AS n FROM term_counts GROUP BY c ORDER BY c DESC"


def candidate_statements(cfg: FilterConfig, d: Dialect, floor: int) -> list[tuple[str, str]]:
    """`term_counts`: the exact count of every term whose hash was counted at least `floor` times (0: every
    term). A term outside it occurs fewer than `floor` times. (The frequent hashes are stored first: joined
    as a filtered subquery, DuckDB misjudged their number and the step took 4x longer.)"""
    occurrences = _occurrences(cfg, d, "n_pairs")
    if floor <= 1:
        return [("term_counts", f"SELECT term, sum(n_pairs) AS c FROM ({occurrences}) e GROUP BY term")]
    return [("frequent_hashes", f"SELECT h FROM term_hashes WHERE c >= {floor}"),
            ("term_counts", f"SELECT e.term, sum(e.n_pairs) AS c FROM (SELECT n_pairs, term, "
                            f"{d.hash64.format(x='term')} AS h FROM ({occurrences}) o) e "
                            f"{d.semi_join} frequent_hashes f ON e.h = f.h GROUP BY e.term")]


def vocab_cut(histogram: list[tuple[int, int]], k: int) -> tuple[int, int] | None:
    """Where the top-k terms end, from (count, number of terms with that count) rows in descending count.

    Returns (c_k, m): every term counted more than c_k is in, and the first m terms (in byte order)
    counted exactly c_k; None when all terms fit. This replaces a global sort of all terms by a
    small histogram and one ordered scan of the tie group."""
    seen = 0
    for count, n in histogram:
        if seen + n > k:
            return count, k - seen  # 0 <= m < n
        seen += n
    return None


def exact_cut(runner, cfg: FilterConfig, hashes: list[tuple[int, int]]) -> tuple[tuple[int, int] | None, int, int]:
    """The vocabulary's cut over exact term counts, materializing `term_counts` for the terms that can reach it.

    The floor starts at the count of the vocab_size-th most frequent hash: every term above the true cut has
    a hash counted at least that often, unless collisions put two of the top terms on one hash; the cut
    found among the candidates is exact when its count is >= the floor (any other term occurs fewer times,
    strictly below the cut). Otherwise the floor is lowered (twice as many hashes) until it holds or every
    term is a candidate. `hashes`: the histogram of the hashes' counts (`Engine.count_hashes`). Returns (cut,
    distinct hashes, candidate terms)."""
    distinct = sum(n for _, n in hashes)
    k = cfg.vocab_size
    while True:
        hash_cut = vocab_cut(hashes, k)
        floor = hash_cut[0] if hash_cut is not None else 0
        for name, query in candidate_statements(cfg, runner.dialect, floor):
            runner.materialize(name, query)
        histogram = runner.rows(HISTOGRAM)
        cut = vocab_cut(histogram, cfg.vocab_size)
        if floor <= 1 or (cut is not None and cut[0] >= floor):
            return cut, distinct, sum(n for _, n in histogram)
        k *= 2


def flag_statements(cfg: FilterConfig, d: Dialect, cut: tuple[int, int] | None) -> list[tuple[str, str]]:
    """Phase 2: texts with a term outside the vocabulary, then per-text and per-image rule flags, then per-pair
    flags."""
    steps = []
    if cut is None:
        steps.append(("rare_texts", "SELECT tid FROM texts WHERE 1 = 0"))
    else:
        c_k, m = cut
        if m == 0:  # the cut falls between two counts: no tie to break
            steps.append(("cut", "SELECT 1 AS b"))
            vocab = f"t.c > {c_k}"
        else:
            steps.append(("cut", f"SELECT term AS b FROM term_counts WHERE c = {c_k} ORDER BY term "
                                 f"LIMIT 1 OFFSET {m - 1}"))
            vocab = f"t.c > {c_k} OR (t.c = {c_k} AND t.term <= cut.b)"
        steps.append(("vocab", f"SELECT t.term FROM term_counts t CROSS JOIN cut WHERE {vocab}"))
        # the vocabulary (vocab_size strings) is the small side: texts with an occurrence outside it, {part}: a
        # condition on the texts (the engine may run this in parts, each texts' share of DISTINCT in memory)
        steps.append(("rare_texts", f"SELECT DISTINCT e.tid FROM ({_occurrences(cfg, d, 'tid', '{part}')}) e "
                                    f"{d.anti_join} vocab v ON e.term = v.term"))
    size = d.size.format(x="t.words")
    steps += [
        ("text_flags", "SELECT t.text, s.text IS NOT NULL AS text_shared, "
                       f"({size} < {cfg.min_words} OR {size} > {cfg.max_words}) AS text_length, "
                       "r.tid IS NOT NULL AS text_rare FROM texts t LEFT JOIN rare_texts r ON t.tid = r.tid "
                       "LEFT JOIN shared_texts s ON t.text = s.text"),
        # distinct texts are counted only on images in more pairs than the limit, as for shared texts (grouping
        # every (image, text) first ran out of memory at 100M pairs under 3GB)
        ("images", "SELECT image_key, least(min(width), min(height)) AS short, greatest(max(width), max(height)) "
                   "AS long, count(*) AS n_pairs FROM pairs GROUP BY image_key"),
        ("crowded_images", f"SELECT p.image_key FROM pairs p {d.semi_join} (SELECT image_key FROM images "
                           f"WHERE n_pairs > {cfg.max_texts_per_image}) c ON p.image_key = c.image_key "
                           "GROUP BY p.image_key "
                           f"HAVING count(DISTINCT p.text) > {cfg.max_texts_per_image}"),
        ("image_flags", f"SELECT i.image_key, i.short <= {cfg.min_short_side} AS image_small, "
                        f"i.long >= {float(cfg.max_aspect)} * i.short AS image_aspect, "
                        "c.image_key IS NOT NULL AS image_many_texts FROM images i "
                        "LEFT JOIN crowded_images c ON i.image_key = c.image_key"),
        # one join per step: DuckDB can take a join out of core alone, not two chained in one pipeline (10M
        # pairs under 300MB ran out of memory joining both flag tables at once)
        ("pair_text_flags", "SELECT p.uid, p.image_key, p.text, "
                            + ", ".join(f"t.{r}" for r, g in _rule_tables() if g == "t")
                            + " FROM pairs p JOIN text_flags t ON p.text = t.text"),
        ("flags", "SELECT p.uid, p.text, " + ", ".join(f"{'p' if g == 't' else g}.{r}" for r, g in _rule_tables()) +
                  " FROM pair_text_flags p JOIN image_flags i ON p.image_key = i.image_key"),
    ]
    return steps


def _rule_tables() -> list[tuple[str, str]]:
    return [(r, "i" if r.startswith("image") else "t") for r in RULES]


def summary_query() -> str:
    """One row: total pairs, then per rule (alone, in sequence), then kept pairs."""
    parts, earlier = ["count(*)"], []
    for rule in RULES:
        parts.append(f"sum(CASE WHEN {rule} THEN 1 ELSE 0 END)")
        sequence = " AND ".join([rule] + [f"NOT {e}" for e in earlier])
        parts.append(f"sum(CASE WHEN {sequence} THEN 1 ELSE 0 END)")
        earlier.append(rule)
    parts.append("sum(CASE WHEN " + " AND ".join(f"NOT {r}" for r in RULES) + " THEN 1 ELSE 0 END)")
    return "SELECT " + ", ".join(parts) + " FROM flags"


def keep_query() -> str:
    return "SELECT DISTINCT uid FROM flags WHERE " + " AND ".join(f"NOT {r}" for r in RULES) + " ORDER BY uid"


def examples_query(rule: str, n: int) -> str:
    return f"SELECT text FROM flags WHERE {rule} ORDER BY uid LIMIT {n}"


# ---------------------------------------------------------------------------------------------- engines

class DuckDBEngine:
    dialect = DUCKDB

    def __init__(self, memory_limit: str = "", threads: int = 0, temp_dir: str = ""):
        import duckdb

        self.con = duckdb.connect()
        self.memory_limit = memory_limit
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="openalign-filter-"))
        self.con.execute("SET preserve_insertion_order = false")
        self.con.execute("SET enable_progress_bar = false")
        if memory_limit:
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        self.con.execute(f"SET temp_directory = '{sql_path(self.temp_dir)}'")

    def _execute(self, stage: str, sql: str):
        import duckdb

        try:
            return self.con.execute(sql)
        except duckdb.OutOfMemoryException as e:  # a step that could not spill what it holds
            limit = f"--memory-limit {self.memory_limit}" if self.memory_limit else "the default memory limit"
            raise ConfigError(f"DuckDB ran out of memory in the filter's {stage} step under {limit} (it spills "
                              f"what it can to disk, but not this step): raise --memory-limit, lower --threads, "
                              f"or run it with --engine spark") from e

    def register(self, pairs: str) -> None:
        names = [r[0] for r in self.con.execute(f"DESCRIBE SELECT * FROM read_parquet('{sql_path(pairs)}')").fetchall()]
        self.con.execute(f"CREATE OR REPLACE VIEW pairs AS SELECT uid, image_key, text, {size_columns(names)} "
                         f"FROM read_parquet('{sql_path(pairs)}')")

    def materialize(self, name: str, query: str) -> None:
        self._execute(name, self.dialect.materialize.format(name=name, query=query))

    def parts(self, count_query: str) -> int:
        """In how many passes to group the term occurrences (`count_query` counts them) so that each pass's
        groups fit in half of DuckDB's memory limit: grouped beyond it, DuckDB spills ~30 bytes per input row
        (100M pairs, ~2B occurrences, filled a 64 GB disk); in parts, nothing is spilled."""
        rows = self.rows(count_query)[0][0] or 0
        limit = _size_bytes(self.rows("SELECT current_setting('memory_limit')")[0][0])
        return max(1, -(-int(rows) * GROUP_ROW_BYTES // (limit // 2)))

    def materialize_parts(self, name: str, query: str, parts: int) -> None:
        """`query` with its `{part}` condition on the texts' ids, in `parts` passes appended to one table.

        Each pass takes a range of ids (the texts are stored in id order, so a pass reads only its share of
        the table; a condition like `tid % parts = p` read the whole spilled table in every pass). The join's
        sides stay as written (the right one hashed): on a share of the texts DuckDB's optimizer otherwise
        hashes the occurrences instead of the vocabulary (10M pairs in 2 parts: 35 s against 9 s in one)."""
        last = int(self.rows("SELECT coalesce(max(tid), 0) FROM texts")[0][0]) if parts > 1 else 0
        self.con.execute("SET disabled_optimizers = 'build_side_probe_side'")
        try:
            for p in range(parts):
                lo, hi = last * p // parts, last * (p + 1) // parts
                part = query.format(part=f"tid > {lo} AND tid <= {hi}" if parts > 1 else "true")
                self._append(name, part, first=p == 0)
        finally:
            self.con.execute("RESET disabled_optimizers")

    def count_hashes(self, query: str, parts: int) -> list[tuple[int, int]]:
        """`term_hashes` (h, c): every hash of `query`'s (n_pairs, h) rows counted at least twice, with its
        count (sum of n_pairs); returns the histogram of all the counts, singles included, as (c, n) rows in
        descending c. In `parts` > 1 passes: the rows are written once to Parquet files split by h (kept
        under the spill directory and removed after), then each split is grouped on its own."""
        if parts == 1:
            self.materialize("term_hashes", hash_counts(f"({query}) q"))
            return self.rows(HASH_HISTOGRAM)
        import shutil

        directory = self.temp_dir / "term_hashes"
        shutil.rmtree(directory, ignore_errors=True)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self._execute("term_hashes", f"COPY (SELECT h, n_pairs, h % {parts} AS part FROM ({query}) q) TO "
                                     f"'{sql_path(directory)}' (FORMAT parquet, PARTITION_BY (part))")
        histogram: dict[int, int] = {}
        for p in range(parts):
            split = directory / f"part={p}"
            source = f"read_parquet('{sql_path(split)}/*.parquet')" if split.is_dir() else \
                "(SELECT 0::UBIGINT AS h, 0::BIGINT AS n_pairs WHERE false)"
            self.materialize("hash_part", hash_counts(source))
            for c, n in self.rows("SELECT c, count(*) FROM hash_part GROUP BY c"):
                histogram[c] = histogram.get(c, 0) + n
            self._append("term_hashes", "SELECT h, c FROM hash_part WHERE c >= 2", first=p == 0)
            shutil.rmtree(split, ignore_errors=True)
        self.drop("hash_part")
        shutil.rmtree(directory, ignore_errors=True)
        return sorted(histogram.items(), reverse=True)

    def _append(self, name: str, query: str, first: bool) -> None:
        """`query`'s rows as table `name` (first) or appended to it (a later part)."""
        if first:
            self.materialize(name, query)
        else:
            self._execute(name, f"INSERT INTO {name} {query}")

    def drop(self, *names: str) -> None:
        """Tables no later step reads: their memory and spill space are freed."""
        for name in names:
            self.con.execute(f"DROP TABLE IF EXISTS {name}")

    def rows(self, query: str) -> list[tuple]:
        return self._execute("summary", query).fetchall()

    def write_keep(self, path: Path) -> None:
        self._execute("keep-list", f"COPY ({keep_query()}) TO '{sql_path(path)}' (FORMAT parquet)")

    def close(self) -> None:
        self.con.close()


class SparkEngine:
    dialect = SPARK

    def __init__(self, master: str = "", memory_limit: str = "", threads: int = 0, temp_dir: str = ""):
        self.spark = spark_session(master, "openalign-filter", memory=memory_limit, temp_dir=temp_dir, threads=threads)

    def register(self, pairs: str) -> None:
        table = self.spark.read.parquet(pairs)
        table.createOrReplaceTempView("raw_pairs")
        self.spark.sql(f"SELECT uid, image_key, text, {size_columns(table.columns)} FROM raw_pairs") \
            .createOrReplaceTempView("pairs")

    def materialize(self, name: str, query: str) -> None:
        self.spark.sql(self.dialect.materialize.format(name=name, query=query))
        self.spark.catalog.cacheTable(name)

    def parts(self, count_query: str) -> int:
        return 1  # Spark's shuffles partition the groupings themselves

    def materialize_parts(self, name: str, query: str, parts: int) -> None:
        self.materialize(name, query.format(part="true"))

    def count_hashes(self, query: str, parts: int) -> list[tuple[int, int]]:
        self.materialize("term_hashes", hash_counts(f"({query}) q"))
        return self.rows(HASH_HISTOGRAM)

    def drop(self, *names: str) -> None:
        pass  # temp views are resolved again when read: a later view may still read these

    def rows(self, query: str) -> list[tuple]:
        return [tuple(r) for r in self.spark.sql(query).collect()]

    def write_keep(self, path: Path) -> None:
        self.spark.sql(keep_query()).write.mode("overwrite").parquet(str(path))

    def close(self) -> None:
        self.spark.catalog.clearCache()


class SpillWatch:
    """The most bytes of DuckDB's temporary files seen in `directory` (where it spills what does not fit its
    memory limit: hash tables, sorts, temporary tables; and the filter's own split files), sampled every `every`
    seconds on a thread."""

    def __init__(self, directory: Path, every: float = 0.25):
        self.directory, self.every, self.peak = Path(directory), every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        size = 0
        for root, _, files in os.walk(self.directory):  # (no directory until DuckDB first spills)
            for name in files:
                with contextlib.suppress(FileNotFoundError):  # removed while being summed
                    size += os.stat(os.path.join(root, name)).st_size
        self.peak = max(self.peak, size)
        return size

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> "SpillWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()



def _size_bytes(text: str) -> int:
    """DuckDB's spelling of a size ("2.7 GiB", "300.0 MB", "512 bytes") in bytes."""
    number, _, unit = text.strip().partition(" ")
    units = {"bytes": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    return int(float(number) * units.get(unit.strip(), 1))


def size_columns(names: list[str]) -> str:
    """The image size the rules judge: the original one where the pair table records it (an img2dataset download
    resized to 256 x 256 would otherwise pass image_small and image_aspect whatever it was), else as stored."""
    if "original_width" in names and "original_height" in names:
        return ("coalesce(original_width, width) AS width, coalesce(original_height, height) AS height, "
                "original_width IS NOT NULL AS has_original")
    return "width, height, false AS has_original"


def make_engine(name: str, master: str = "", memory_limit: str = "", threads: int = 0, temp_dir: str = ""):
    if name == "duckdb":
        return DuckDBEngine(memory_limit, threads, temp_dir)
    if name == "spark":
        return SparkEngine(master, memory_limit, threads, temp_dir)
    raise ConfigError(f"unknown engine {name!r}; choose duckdb or spark")










# ---------------------------------------------------------------------------------------------- stage

def run_filters(pairs: Path, out: Path, cfg: FilterConfig = FilterConfig(), engine: str = "duckdb",
                master: str = "", memory_limit: str = "", threads: int = 0, progress: bool = True) -> dict:
    """Filter the pair table `pairs` into a keep-list and report in `out`; returns the report."""
    pairs, out = str(pairs), Path(out)  # pairs may be a glob, or a URL the Spark cluster reads
    check_pair_table(pairs, FILTER_COLUMNS)
    check(cfg)
    out.mkdir(parents=True, exist_ok=True)
    unfinish(out / REPORT)  # the old keep-list is no longer this output's until the new report says so
    start = time.perf_counter()
    runner = make_engine(engine, master, memory_limit, threads, str(out / "tmp"))
    spill = SpillWatch(out / "tmp")  # DuckDB's spill files (Spark's shuffle files are not spills)
    with spill if engine == "duckdb" else contextlib.nullcontext():
        try:
            runner.register(pairs)
            if not runner.rows("SELECT count(*) FROM pairs")[0][0]:
                raise ConfigError(f"{pairs} holds no pairs: nothing to filter (did its ingest find any images?)")
            counting = count_statements(cfg, runner.dialect)
            bar = _progress(progress, len(counting) + 2)
            for name, query in counting:
                runner.materialize(name, query)
                bar.update()
            parts = runner.parts(occurrence_count_query(cfg, runner.dialect))
            hashes = runner.count_hashes(hash_query(cfg, runner.dialect), parts)
            bar.update()
            cut, distinct_terms, candidates = exact_cut(runner, cfg, hashes)
            runner.drop("term_hashes", "frequent_hashes")
            bar.update()
            flagging = flag_statements(cfg, runner.dialect, cut)
            bar.total += len(flagging)
            for name, query in flagging:
                if name in PARTED:
                    runner.materialize_parts(name, query, parts)
                else:
                    runner.materialize(name, query)
                runner.drop(*DONE_AFTER.get(name, ()))
                bar.update()
            bar.close()
            total, *counts, kept = runner.rows(summary_query())[0]
            kept_uids = runner.rows("SELECT count(DISTINCT uid) FROM (" + keep_query() + ") k")[0][0]
            rules = []
            for i, (rule, description) in enumerate(RULES.items()):
                examples = [r[0] for r in runner.rows(examples_query(rule, cfg.examples))] if counts[2 * i] else []
                rules.append({"rule": rule, "description": description.format(**asdict(cfg)),
                              "removed_alone": int(counts[2 * i] or 0), "removed_in_sequence": int(counts[2 * i + 1] or 0),
                              "examples": examples})
            originals = runner.rows("SELECT count(*) FROM pairs WHERE has_original")[0][0]
            keep_path = out / "keep.parquet"
            runner.write_keep(keep_path)
        finally:
            runner.close()
    report = {
        "stage": "filter", "input": str(pairs), "engine": engine, "config": asdict(cfg),
        # image_small and image_aspect judge the size before a downloader's resizing, where the table has it
        "sizes": {"original": int(originals), "as_stored": int(total) - int(originals)},
        "pairs": int(total), "kept_pairs": int(kept or 0), "kept_uids": int(kept_uids),
        "removed_pairs": int(total) - int(kept or 0), "distinct_terms": int(distinct_terms),
        "exactly_counted_terms": int(candidates), "rules": rules,
        "keep": str(keep_path), "seconds": round(time.perf_counter() - start, 2),
        "memory_limit": memory_limit, "spilled_bytes": spill.peak,
    }
    report["warnings"] = dominant_rules(report)
    plot_report(report, out / "filter_report.png")
    write_json(out / REPORT, report)  # last: the keep-list is finished
    return report


def _progress(progress: bool, total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="filter", unit="stage", disable=not progress, leave=False)


def plot_report(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = report["rules"]
    names = [r["rule"] for r in rules]
    alone = [r["removed_alone"] for r in rules]
    sequence = [r["removed_in_sequence"] for r in rules]
    fig, ax = plt.subplots(figsize=(8, 4))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], alone, height=0.4, label="removed on its own")
    ax.barh([i - 0.2 for i in y], sequence, height=0.4, label="removed in sequence (after the rules above)")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("pairs")
    ax.set_title(f"ALIGN filters: {report['kept_pairs']:,} of {report['pairs']:,} pairs kept "
                 f"({report['kept_pairs'] / max(report['pairs'], 1):.1%})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        limit = f"its memory limit ({report['memory_limit']})" if report.get("memory_limit") else "memory"
        lines.append(f"note: DuckDB spilled up to {report['spilled_bytes'] / 2**30:.2f} GiB to disk "
                     f"({Path(report['keep']).parent / 'tmp'}): the work did not fit {limit}, so it ran out-of-core "
                     "(slower; raise --memory-limit to avoid it)")
    if report.get("sizes", {}).get("original"):
        lines.append(f"note: image sizes judged before resizing for {report['sizes']['original']:,} pairs (their "
                     "original_width/height from img2dataset), as stored for the other "
                     f"{report['sizes']['as_stored']:,}")
    lines += [f"{report['pairs']:,} pairs -> {report['kept_pairs']:,} kept "
             f"({report['kept_pairs'] / max(report['pairs'], 1):.1%}) by {report['engine']} in {report['seconds']:.1f} s"]
    for r in report["rules"]:
        lines.append(f"  {r['rule']:<17} alone {r['removed_alone']:>10,}  in sequence {r['removed_in_sequence']:>10,}"
                     f"   {r['description']}")
    return lines
