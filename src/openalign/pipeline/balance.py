"""Balance the corpus over concepts as MetaCLIP does: match every alt-text against metadata entries, then cap each
entry at t pairs by sampling.

    openalign balance PAIRS [--metadata FILE] --per-entry 20000 --out DIR

MetaCLIP (Xu et al. 2024, facebookresearch/MetaCLIP) made CLIP's curation public. Matching follows its code
(`metaclip1/substr_matching.py`, `substr_matching_ahocorasick.py`, `curation/substr_matching.py`): the text gets a
space at both ends and around each of , . ; : ? ! ` (tabs and line breaks become spaces); an entry gets a space on
each side whose end character is not punctuation or of a script written without spaces (CJK, Thai, Lao, Burmese,
Khmer, Tibetan); an entry matches where it occurs in the spaced text, so whole words only, case-sensitively (as
MetaCLIP; `--ignore-case` lowercases both), and every entry found counts, overlapping ones included (Aho-Corasick,
pyahocorasick, as theirs). Sampling follows `metaclip1/balancing.py`: an entry matched by n pairs keeps each with
probability p = min(1, t / n), and a pair is kept when any of its entries samples it (so with probability
1 - prod(1 - p_i)); a pair that matches no entry is dropped, as MetaCLIP drops it, and counted. A draw is a hash of
(seed, uid, entry), not a random stream, so a rerun and either engine keep the same pairs at one seed.

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
import os
import re
import shutil
import string
import time
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign.config import ConfigError
from openalign.data.engine import Engine, Job, duckdb_plan, job_id, read_plan, run_jobs, spark_plan, spark_session
from openalign.data.pairs import check_pair_table, sql_path, write_keep_report
from openalign.outputs import sources_key, unfinish, write_json

__all__ = ["BalanceOptions", "BalanceResult", "balance", "default_metadata", "match_entries", "spaced_entry",
           "spaced_text", "wordnet_entries"]

REPORT = "balance_report.json"
WORK = "_work"
WORDNET = "/usr/share/wordnet"  # Debian's wordnet-base: data.noun, data.verb, data.adj, data.adv
WRAPPED = ",.;:?!`"  # MetaCLIP's `spacing`: each gets a space on either side
HEAD = 20  # entries shown at the head of the report
TAIL_BINS = ((1, 1), (2, 10), (11, 100), (101, 1_000), (1_001, 10_000))  # the report's counts of entries by size


@dataclass(frozen=True)
class BalanceOptions:
    metadata: str = ""  # a file of metadata entries, one per line (none: WordNet's synset names + the corpus's words)
    per_entry: int = 20_000  # t: an entry matched by n > t pairs keeps each with probability t / n (MetaCLIP: 20,000)
    seed: int = 0  # the draws: a hash of (seed, uid, entry)
    term_min_pairs: int = 100  # the default metadata's corpus words: those in at least this many pairs' texts (0: none)
    wordnet: str = WORDNET  # WordNet's database folder, for the default metadata
    ignore_case: bool = False  # lowercase texts and entries before matching (MetaCLIP matches case-sensitively)
    examples: int = 8  # texts shown for the unmatched pairs and the head entries
    workers: int = 0  # local engine: processes (0: one per core)
    pairs_per_task: int = 100_000  # the unit of distribution, retry and resume


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


# ---------------------------------------------------------------------------------------------- matching rules

def spaced_text(text: str) -> str:
    """MetaCLIP's `spacing`: a space at both ends and around each of , . ; : ? ! ` ; tabs and line breaks as spaces."""
    spaced = f" {text} "
    for mark in WRAPPED:
        spaced = spaced.replace(mark, f" {mark} ")
    for char in "\t\n\r":
        spaced = spaced.replace(char, " ")
    return spaced


NO_SPACE_SCRIPTS = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2EBEF), (0xF900, 0xFAFF),
                    (0x2E80, 0x2FFF), (0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x0F00, 0x0FFF))
# MetaCLIP's `is_cjk_or_similar` ranges (CJK, Thai, Lao, Burmese, Khmer, Tibetan)


def _unspaced(char: str) -> bool:
    """An entry's end character that gets no space beside it: punctuation, or a script written without spaces."""
    code = ord(char)
    return (char in string.punctuation or unicodedata.category(char).startswith("P")
            or any(low <= code <= high for low, high in NO_SPACE_SCRIPTS))


def spaced_entry(entry: str) -> str:
    """An entry as matched: a space on each side whose end character is not punctuation or CJK-like (MetaCLIP's
    `get_spaced_metadata`), so "cat" matches the word, never "catalog"."""
    return ("" if _unspaced(entry[0]) else " ") + entry + ("" if _unspaced(entry[-1]) else " ")


_AUTOMATA: dict = {}  # per process: the automaton of one metadata file, built once for the jobs of a command


def _automaton(metadata: str, key: str, ignore_case: bool):
    import ahocorasick

    if (key, ignore_case) not in _AUTOMATA:
        _AUTOMATA.clear()
        automaton = ahocorasick.Automaton()
        for i, entry in enumerate(read_entries(metadata)):
            automaton.add_word(spaced_entry(entry.lower() if ignore_case else entry), i)
        automaton.make_automaton()
        _AUTOMATA[key, ignore_case] = automaton
    return _AUTOMATA[key, ignore_case]


def match_entries(automaton, text: str | None, ignore_case: bool = False) -> list[int]:
    """The sorted ids of every entry found in `text`, overlapping ones included (an empty automaton finds none)."""
    if not text or len(automaton) == 0:
        return []
    spaced = spaced_text(text.lower() if ignore_case else text)
    return sorted({entry for _, entry in automaton.iter(spaced)})


# ---------------------------------------------------------------------------------------------- metadata

def read_entries(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def wordnet_entries(folder: str = WORDNET) -> list[str]:
    """Every synset's name as MetaCLIP's `wordnet_synsets` takes it from NLTK: its first lemma, lower case, `_` as a
    space (an adjective's marker such as "(a)" dropped), once each, in the database's order."""
    names: dict[str, None] = {}
    for pos in ("noun", "verb", "adj", "adv"):
        path = Path(folder) / f"data.{pos}"
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            raise ConfigError(f"the default metadata reads WordNet's {path}, which is missing; install it (`sudo "
                              "apt-get install wordnet-base`; `make setup` does as root), point --wordnet at its "
                              "folder, or give --metadata FILE (one entry per line)") from None
        for line in lines:
            if line and not line.startswith(" "):
                lemma = re.sub(r"\([a-z]+\)$", "", line.split(" ", 5)[4])
                names.setdefault(lemma.replace("_", " ").lower(), None)
    return list(names)


def words_of(text: str | None, ignore_case: bool) -> set[str]:
    """The words of a text as the matcher sees them (spaced tokens with a letter in them)."""
    if not text:
        return set()
    spaced = spaced_text(text.lower() if ignore_case else text)
    return {w for w in spaced.split(" ") if w and any(c.isalpha() for c in w)}


def words_task(plan: str, index: int, out_path: str, ignore_case: bool) -> dict:
    """One job: each word and the number of the job's pairs whose text holds it."""
    counts: dict[str, int] = {}
    rows = read_plan(plan, index)
    for row in rows:
        for word in words_of(row["text"], ignore_case):
            counts[word] = counts.get(word, 0) + 1
    words = pa.table({"word": pa.array(list(counts), pa.string()), "pairs": pa.array(list(counts.values()), pa.int64())})
    _write(words, out_path)
    return {"pairs": len(rows), "words": len(counts)}


def default_metadata(wordnet: list[str], words: list[tuple[str, int]], min_pairs: int) -> list[str]:
    """WordNet's names, then the corpus's words in at least `min_pairs` pairs (most pairs first, ties by the word)
    that WordNet lacks."""
    known = set(wordnet)
    extra = sorted(((w, n) for w, n in words if n >= min_pairs and w not in known), key=lambda wn: (-wn[1], wn[0]))
    return wordnet + [w for w, _ in extra] if min_pairs > 0 else list(wordnet)


def _user_metadata(path: str) -> tuple[list[str], int]:
    """The entries of a user's file (stripped, blank lines skipped, a repeated entry once), and how many repeats."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"--metadata {path} does not exist; give a text file with one entry per line") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--metadata {path} is not UTF-8 text; give a text file with one entry per line") from None
    except OSError as err:
        raise ConfigError(f"--metadata {path} cannot be read ({err.strerror}); give a readable text file") from None
    entries = [line.strip() for line in lines if line.strip()]
    unique = list(dict.fromkeys(entries))
    if not unique:
        raise ConfigError(f"--metadata {path} holds no entry; give a text file with one entry per line")
    return unique, len(entries) - len(unique)


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

def _write(table: pa.Table, path: str) -> None:
    tmp = path + ".tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def match_task(plan: str, index: int, out_path: str, metadata: str, key: str, ignore_case: bool) -> dict:
    """One job: each pair's matched entry ids."""
    automaton = _automaton(metadata, key, ignore_case)
    rows = read_plan(plan, index)
    matched = [match_entries(automaton, r["text"], ignore_case) for r in rows]
    _write(pa.table({"uid": pa.array([r["uid"] for r in rows], pa.string()),
                     "entries": pa.array(matched, pa.list_(pa.int32()))}), out_path)
    return {"pairs": len(rows), "unmatched": sum(not m for m in matched)}


def sample_task(matches: str, out_path: str, probability: str, per_entry: int, seed: int) -> dict:
    """One job: which of a match job's pairs the entries sample."""
    table = pq.read_table(matches)
    uids, entries = table.column("uid").to_pylist(), table.column("entries").to_pylist()
    p = np.load(probability)
    kept = sample_pairs(uids, entries, p, seed)
    _write(pa.table({"uid": pa.array(uids, pa.string()), "kept": pa.array(kept, pa.bool_())}), out_path)
    expected = sum(1.0 - float(np.prod(1.0 - p[e])) for e in entries if e)  # 1 - prod(1 - p_i) per pair
    return {"pairs": len(uids), "kept": int(kept.sum()), "expected": expected}


def _plan(pairs: str, plan: Path, per_task: int, engine: Engine) -> int:
    """The table's distinct (uid, text) in uid order, cut into jobs (DuckDB locally, Spark SQL on Spark)."""
    if engine.name == "spark":
        spark = spark_session(engine.master, retries=engine.retries, memory=engine.memory)
        return spark_plan(spark.read.parquet(pairs).select("uid", "text").distinct(), "uid", per_task, plan)
    import duckdb

    with duckdb.connect() as con:
        return duckdb_plan(con, "SELECT DISTINCT uid, text FROM read_parquet(?)", [pairs], "uid", per_task, plan)


def _run(jobs: list[Job], work: Path, name: str, engine: Engine, progress: bool) -> dict:
    results, _ = run_jobs(jobs, work / f"_status-{name}", engine, name, progress)
    return results


def _check(options: BalanceOptions) -> None:
    if options.per_entry < 1:
        raise ConfigError(f"--per-entry {options.per_entry} must be at least 1 (MetaCLIP's t: 20,000 for 400M pairs)")
    if min(options.pairs_per_task, 1 + options.term_min_pairs) < 1 or min(options.workers, options.examples) < 0:
        raise ConfigError("--pairs-per-task must be at least 1, --term-min-pairs, --workers and --examples at least 0")
    if not 0 <= options.seed < 2 ** 63:
        raise ConfigError(f"--seed {options.seed} must be in [0, 2^63)")


def _metadata(pairs: str, plan: Path, n_jobs: int, work: Path, out: Path, options: BalanceOptions, inputs: str,
              engine: Engine, progress: bool) -> dict:
    """OUT/metadata.txt (written only when its contents change), and where its entries came from."""
    if options.metadata:
        entries, repeated = _user_metadata(options.metadata)
        origin = {"metadata": str(options.metadata), "repeated_lines": repeated}
    else:
        wordnet = wordnet_entries(options.wordnet)
        words: list[tuple[str, int]] = []
        if options.term_min_pairs > 0:
            parts = [str(work / f"words-{job_id(i)}.parquet") for i in range(n_jobs)]
            _run([Job(job_id(i), words_task, (str(plan), i, parts[i], options.ignore_case),
                      key=sources_key(inputs, "words", options.ignore_case, i), outputs=(parts[i],))
                  for i in range(n_jobs)], work, "words", engine, progress)
            import duckdb

            with duckdb.connect() as con:
                words = con.execute("SELECT word, sum(pairs)::BIGINT AS n FROM read_parquet(?) GROUP BY word HAVING "
                                    "n >= ? ORDER BY n DESC, word", [parts, options.term_min_pairs]).fetchall()
        entries = default_metadata(wordnet, words, options.term_min_pairs)
        origin = {"wordnet": str(options.wordnet), "wordnet_entries": len(wordnet),
                  "corpus_words": len(entries) - len(wordnet), "term_min_pairs": options.term_min_pairs}
    if options.ignore_case:
        entries = list(dict.fromkeys(e.lower() for e in entries))
    text = "".join(f"{e}\n" for e in entries)
    path = out / "metadata.txt"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return origin | {"entries": len(entries), "fingerprint": hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}


def _examples(con, where: str, n: int) -> list[dict]:
    return [{"uid": uid, "text": text} for uid, text in con.execute(
        f"SELECT uid, text FROM plan WHERE {where} ORDER BY uid LIMIT {int(n)}").fetchall()]


def _summary(out: Path, work: Path, plan: Path, options: BalanceOptions, entries: list[str],
             counts: np.ndarray, kept: np.ndarray, probability: np.ndarray) -> dict:
    import duckdb

    with duckdb.connect() as con:
        con.execute(f"CREATE TEMP VIEW plan AS SELECT uid, text FROM read_parquet('{sql_path(plan)}')")
        con.execute(f"CREATE TEMP VIEW m AS SELECT * FROM read_parquet('{sql_path(out / 'matches.parquet')}')")
        unmatched = _examples(con, "uid IN (SELECT uid FROM m WHERE len(entries) = 0)", options.examples)
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


def _plot(path: Path, counts: np.ndarray, kept: np.ndarray, per_entry: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from openalign.pipeline.scoring import save_png

    fig, ax = plt.subplots(figsize=(7, 4))
    for values, label, colour in ((counts, "before", "tab:grey"), (kept, "after", "tab:blue")):
        values = np.sort(values[values > 0])[::-1]
        if len(values):
            ax.loglog(np.arange(1, len(values) + 1), values, color=colour, label=f"{label} ({len(values):,} entries)")
    ax.axhline(per_entry, color="tab:red", lw=1, ls="--", label=f"t = {per_entry:,}")
    ax.set(xlabel="entry rank", ylabel="pairs matching the entry", title=title)
    ax.legend()
    save_png(fig, path)


def balance(pairs: Path, out: Path, options: BalanceOptions = BalanceOptions(), progress: bool = True,
            engine: Engine = Engine()) -> BalanceResult:
    """Match every pair's text against the metadata entries, count each entry's pairs, then keep each pair that
    any of its entries samples with probability min(1, t / count); write the keep-list and the report."""
    pairs, out = str(pairs), Path(out)
    _check(options)
    check_pair_table(pairs, ("uid", "text"))
    if engine.name == "local":
        engine = Engine(workers=options.workers or os.cpu_count() or 1, retries=engine.retries)
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    unfinish(out / REPORT)  # the old keep-list is no longer this output's until the new report says so
    work = out / WORK
    work.mkdir(exist_ok=True)
    plan = work / "plan.parquet"
    table = pairs if "://" in pairs else str(Path(pairs).resolve())
    n_pairs = _plan(pairs, plan, options.pairs_per_task, engine)
    n_jobs = -(-n_pairs // options.pairs_per_task)
    inputs = sources_key(table, options.pairs_per_task, n_pairs)
    origin = _metadata(pairs, plan, n_jobs, work, out, options, inputs, engine, progress)
    entries = read_entries(str(out / "metadata.txt"))
    match_key = sources_key(inputs, origin["fingerprint"], options.ignore_case)
    matches = out / "matches.parquet"
    reused = _fingerprint_of(matches) == match_key
    parts = [str(work / f"matches-{job_id(i)}.parquet") for i in range(n_jobs)]
    if not reused:
        matches.with_name(matches.name + ".inputs.json").unlink(missing_ok=True)
        _run([Job(job_id(i), match_task, (str(plan), i, parts[i], str(out / "metadata.txt"), origin["fingerprint"],
                                          options.ignore_case), key=sources_key(match_key, i), outputs=(parts[i],))
              for i in range(n_jobs)], work, "match", engine, progress)
        import duckdb

        with duckdb.connect() as con:
            con.execute(f"COPY (SELECT uid, entries FROM read_parquet(?) ORDER BY uid) TO '{sql_path(matches)}' "
                        "(FORMAT parquet)", [parts])
        write_json(matches.with_name(matches.name + ".inputs.json"), {"inputs": match_key})
    import duckdb

    with duckdb.connect() as con:
        counted = con.execute(f"SELECT e, count(*) FROM (SELECT unnest(entries) AS e FROM read_parquet("
                              f"'{sql_path(matches)}')) GROUP BY e").fetchall()
    counts = np.zeros(len(entries), dtype=np.int64)
    for entry, n in counted:
        counts[entry] = n
    probability = keep_probabilities(counts, options.per_entry)
    np.save(work / "probability.npy", probability)
    # the sampling jobs read the matches in parts of the same plan (the joined file, rewritten, would be one part)
    if reused:
        with duckdb.connect() as con:
            for i in range(n_jobs):
                con.execute(f"COPY (SELECT m.uid, m.entries FROM read_parquet('{sql_path(matches)}') m JOIN "
                            f"read_parquet('{sql_path(plan)}') p USING (uid) WHERE p.task = {i} ORDER BY uid) TO "
                            f"'{sql_path(parts[i])}' (FORMAT parquet)")
    sampled = [str(work / f"sampled-{job_id(i)}.parquet") for i in range(n_jobs)]
    sample_key = sources_key(match_key, options.per_entry, options.seed,
                             hashlib.blake2b(counts.tobytes(), digest_size=16).hexdigest())
    results = _run([Job(job_id(i), sample_task, (parts[i], sampled[i], str(work / "probability.npy"), options.per_entry,
                                       options.seed), key=sources_key(sample_key, i), outputs=(sampled[i],))
          for i in range(n_jobs)], work, "sample", engine, progress)
    keep = out / "keep.parquet"
    if keep.is_dir():
        shutil.rmtree(keep)
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT uid FROM read_parquet(?) WHERE kept ORDER BY uid) TO '{sql_path(keep)}' "
                    "(FORMAT parquet)", [sampled])
        n_kept = con.execute(f"SELECT count(*) FROM read_parquet('{sql_path(keep)}')").fetchone()[0]
        unmatched = con.execute(f"SELECT count(*) FROM read_parquet('{sql_path(matches)}') WHERE len(entries) = 0"
                                ).fetchone()[0]
        after = con.execute(f"SELECT e, count(*) FROM (SELECT unnest(m.entries) AS e FROM read_parquet("
                            f"'{sql_path(matches)}') m SEMI JOIN read_parquet('{sql_path(keep)}') k USING (uid)) "
                            "GROUP BY e").fetchall()
    kept = np.zeros(len(entries), dtype=np.int64)
    for entry, n in after:
        kept[entry] = n
    pq.write_table(pa.table({"entry": entries, "id": pa.array(np.arange(len(entries)), pa.int32()),
                             "pairs": counts, "kept": kept, "probability": probability}), out / "entries.parquet")
    summary = _summary(out, work, plan, options, entries, counts, kept, probability)
    _plot(out / "balance_report.png", counts, kept, options.per_entry,
          f"{n_pairs:,} pairs over {int((counts > 0).sum()):,} entries: {n_kept:,} kept")
    report = {
        "stage": "balance", "pairs": pairs, "engine": engine.name, "rule": f"MetaCLIP's balancing, t = "
        f"{options.per_entry:,}: a pair is kept when any matched entry samples it with probability min(1, t / n)",
        "metadata": origin, "total_pairs": int(n_pairs), "matched_pairs": int(n_pairs - unmatched),
        "unmatched_pairs": int(unmatched), "kept_pairs": int(n_kept), "removed_pairs": int(n_pairs - n_kept),
        "expected_kept_pairs": round(sum(r["expected"] for r in results.values()), 2), "entries": len(entries),
        "matched_entries": int((counts > 0).sum()), **summary, "reused_matches": reused,
        "matches": str(matches), "entries_table": str(out / "entries.parquet"), "keep": str(keep),
        "options": asdict(options), "seconds": round(time.perf_counter() - start, 2),
    }
    report = write_keep_report(out, REPORT, report, pairs)  # last: the keep-list is finished
    shutil.rmtree(work, ignore_errors=True)
    return BalanceResult(keep, matches, len(entries), report["matched_entries"], int(n_pairs), int(unmatched),
                         int(n_kept), reused, report["seconds"], report)


def _fingerprint_of(matches: Path) -> str | None:
    import json

    try:
        return json.loads(matches.with_name(matches.name + ".inputs.json").read_text())["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
