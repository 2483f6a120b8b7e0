"""ALIGN's frequency filters as SQL over the Parquet pair table: one statement text, two dialects (DuckDB, Spark).

One set of queries, two dialects: the statement text below is shared, and each engine (filter_sql.py) only
supplies the spelling of a few list functions, so both engines compute the same thing by construction (a test
runs both on one corpus and compares the keep-lists).

Rules (thresholds are `FilterConfig` fields; every statistic is counted on the raw table):

    image_small       shorter side <= min_short_side (paper: keep > 200 px)
    image_aspect      long / short >= max_aspect (paper: keep < 3)
    image_many_texts  the image carries > max_texts_per_image distinct alt-texts (paper: 1000)
    text_shared       the alt-text is shared by > max_images_per_text distinct images (paper: 10)
    text_length       fewer than min_words or more than max_words unigrams (paper: 3..20)
    text_rare         a unigram or bigram outside the vocab_size most frequent ones (paper: 100M)

Words are the alt-text split on whitespace (optionally lowercased), or a candidate table's `words` where its
language is written without spaces (zh, ja, th: segmented by extract); otherwise nothing language-specific, so the
multilingual corpus uses the same rules. A pair of unknown image size (a candidate table's) passes the size rules;
`rules` (text, image, all) leaves the others out. Term frequencies count every pair; terms are ranked by count, then
by their UTF-8 bytes, so the top-K cut is deterministic. Terms are counted by a 64-bit hash first
(fixed-size keys that spill to disk), then exactly, by their strings, only those that can reach the top K:
the result is exact whatever the hash collides (`exact_cut`). Lowercasing follows each engine's
Unicode tables; they agree except for a few special cases (e.g. Turkish dotted I).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from openalign.config import NON_NEGATIVE, POSITIVE_INT, Options, Rule, at_least, non_negative

@dataclass(frozen=True)
class FilterConfig(Options):
    """ALIGN's frequency filters (paper section 3); a pair is kept only if no rule fires.

    Rules are counted on the raw pair table, before any other rule, as the paper describes."""

    min_short_side: Annotated[int, non_negative("0 or more pixels")] = 200  # image: keep only if the shorter side is >
                                                                            # this many pixels
    max_aspect: Annotated[float, at_least(1)] = 3.0  # image: keep only if long side / short side < this
    max_texts_per_image: Annotated[int, POSITIVE_INT] = 1000  # image: drop images with more distinct alt-texts than
                                                              # this
    max_images_per_text: Annotated[int, POSITIVE_INT] = 10  # text: drop alt-texts shared by more distinct images than
                                                            # this
    min_words: Annotated[int, NON_NEGATIVE] = 3  # text: keep only texts with min_words..max_words unigrams
    max_words: Annotated[int, POSITIVE_INT] = 20  # text: and at most this many
    vocab_size: Annotated[int, POSITIVE_INT] = 100_000_000  # text: drop texts with a unigram/bigram outside the K most
                                                            # frequent
    vocab_ngrams: Annotated[int, Rule(lambda x: x in (1, 2), "1 or 2")] = 2  # 2: unigrams and bigrams are both checked
                                                                             # (paper); 1: unigrams only
    lowercase: bool = True  # count words case-insensitively
    examples: Annotated[int, NON_NEGATIVE] = 3  # example texts per rule in the report
    rules: Literal["auto", "all", "text", "image"] = "auto"  # which rules run: text (a candidate table, before the
        # download), image (the pair table after it, where the text rules ran on its candidates), all; auto: image
        # for a pair table whose manifest says its candidates were filtered by the text rules (fetch --keep), else all

    def spell(self, name: str) -> str:
        return name  # as an override writes it: `openalign filter PAIRS min_words=3`

    def cross_field_problems(self) -> list[str]:
        if self.min_words > self.max_words:
            return [f"min_words={self.min_words} must not exceed max_words={self.max_words}"]
        return []


RULE_OPTIONS = {  # the FilterConfig keys that set each rule's threshold (`openalign filter ... key=value`)
    "image_small": ("min_short_side",), "image_aspect": ("max_aspect",), "image_many_texts": ("max_texts_per_image",),
    "text_shared": ("max_images_per_text",), "text_length": ("min_words", "max_words"), "text_rare": ("vocab_size",),
}
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
    pieces dropped (= split on runs of whitespace; 3x faster here than one regular-expression replace). The text
    split is `words_text`: a candidate table's `words` where its language has a segmenter (zh, ja, th: the words
    joined by spaces), else the text itself (`words_columns`)."""
    norm = "words_text"
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
                  "(SELECT text, min(words_text) AS words_text, count(*) AS n_pairs FROM pairs GROUP BY text) g"),
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

    def on(flag: str, rule: str) -> str:  # a rule --rules leaves out flags nothing
        return f"{flag if applies(rule, cfg) else 'false'} AS {rule}"

    steps += [
        ("text_flags", f"SELECT t.text, {on('s.text IS NOT NULL', 'text_shared')}, "
                       f"{on(f'({size} < {cfg.min_words} OR {size} > {cfg.max_words})', 'text_length')}, "
                       f"{on('r.tid IS NOT NULL', 'text_rare')} FROM texts t LEFT JOIN rare_texts r "
                       "ON t.tid = r.tid LEFT JOIN shared_texts s ON t.text = s.text"),
        # distinct texts are counted only on images in more pairs than the limit, as for shared texts (grouping
        # every (image, text) first ran out of memory at 100M pairs under 3GB)
        ("images", "SELECT image_key, least(min(width), min(height)) AS short, greatest(max(width), max(height)) "
                   "AS long, count(*) AS n_pairs FROM pairs GROUP BY image_key"),
        ("crowded_images", f"SELECT p.image_key FROM pairs p {d.semi_join} (SELECT image_key FROM images "
                           f"WHERE n_pairs > {cfg.max_texts_per_image}) c ON p.image_key = c.image_key "
                           "GROUP BY p.image_key "
                           f"HAVING count(DISTINCT p.text) > {cfg.max_texts_per_image}"),
        # an image of unknown size (a candidate table's WAT links) is not judged by the size rules
        ("image_flags", f"SELECT i.image_key, {on(f'coalesce(i.short <= {cfg.min_short_side}, false)', 'image_small')}"
                        f", {on(f'coalesce(i.long >= {float(cfg.max_aspect)} * i.short, false)', 'image_aspect')}, "
                        f"{on('c.image_key IS NOT NULL', 'image_many_texts')} FROM images i "
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


def applies(rule: str, cfg: FilterConfig) -> bool:
    """Whether `rule` runs under `cfg.rules` (text, image or all)."""
    return cfg.rules == "all" or rule.startswith(cfg.rules)


def _rule_tables() -> list[tuple[str, str]]:
    return [(r, "i" if r.startswith("image") else "t") for r in RULES]


def summary_query() -> str:
    """One row: total pairs, then per rule (alone, in sequence), then kept pairs."""
    parts, earlier = ["count(*)"], list[str]()
    for rule in RULES:
        parts.append(f"sum(CASE WHEN {rule} THEN 1 ELSE 0 END)")
        sequence = " AND ".join([rule] + [f"NOT {e}" for e in earlier])
        parts.append(f"sum(CASE WHEN {sequence} THEN 1 ELSE 0 END)")
        earlier.append(rule)
    parts.append("sum(CASE WHEN " + " AND ".join(f"NOT {r}" for r in RULES) + " THEN 1 ELSE 0 END)")
    return "SELECT " + ", ".join(parts) + " FROM flags"


def keep_query() -> str:
    return "SELECT DISTINCT uid FROM flags WHERE " + " AND ".join(f"NOT {r}" for r in RULES)


def examples_query(rule: str, n: int) -> str:
    return f"SELECT text FROM flags WHERE {rule} ORDER BY uid LIMIT {n}"


GROUPS = ("language", "host")  # a candidate table's columns the report counts each rule by


def group_columns(names: list[str]) -> str:
    """`, language, host` where the table has them (a candidate table), for the report's counts per group."""
    return "".join(f", {name}" for name in GROUPS if name in names)


def group_query(column: str, top: int) -> str:
    """Per value of `column` (the `top` with the most pairs): pairs, kept pairs, and each rule's removals alone."""
    rules = ", ".join(f"sum(CASE WHEN f.{rule} THEN 1 ELSE 0 END)" for rule in RULES)
    kept = " AND ".join(f"NOT f.{rule}" for rule in RULES)
    return (f"SELECT p.{column}, count(*) AS n, sum(CASE WHEN {kept} THEN 1 ELSE 0 END), {rules} "
            f"FROM flags f JOIN pairs p ON f.uid = p.uid GROUP BY p.{column} ORDER BY n DESC, p.{column} LIMIT {top}")


def words_columns(names: list[str]) -> str:
    """The text the rules split into words: a candidate table's segmented `words` where it has them (a function of
    the text and its language: one per text, `min` where a table were to hold two), else the text."""
    return "coalesce(words, text) AS words_text" if "words" in names else "text AS words_text"


def size_columns(names: list[str]) -> str:
    """The image size the rules judge: the original one where the pair table records it (an img2dataset download
    resized to 256 x 256 would otherwise pass image_small and image_aspect whatever it was), else as stored."""
    if "original_width" in names and "original_height" in names:
        return ("coalesce(original_width, width) AS width, coalesce(original_height, height) AS height, "
                "original_width IS NOT NULL AS has_original")
    return "width, height, false AS has_original"
