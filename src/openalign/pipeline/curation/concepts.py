"""Which metadata entries each pair's text holds, by MetaCLIP's matching rules: what `balance` samples from and
`card` counts concepts with.

Matching follows MetaCLIP's code (`metaclip1/substr_matching.py`, `substr_matching_ahocorasick.py`,
`curation/substr_matching.py`): the text gets a space at both ends and around each of , . ; : ? ! ` (tabs and line
breaks become spaces); an entry gets a space on each side whose end character is not punctuation or of a script
written without spaces (CJK, Thai, Lao, Burmese, Khmer, Tibetan); an entry matches where it occurs in the spaced
text, so whole words only, case-sensitively (as MetaCLIP; `ignore_case` lowercases both), and every entry found
counts, overlapping ones included (Aho-Corasick, pyahocorasick, as theirs).

The default metadata: WordNet's synset names (the first lemma of each synset, lower case, `_` as a space: MetaCLIP's
`wordnet_synsets`, read from Debian's wordnet-base) and, in place of MetaCLIP's Wikipedia unigrams, the corpus's own
words found in at least `term_min_pairs` pairs' texts.

    OUT/metadata.txt              the entries, one per line (an entry's id is its line number from 0)
    OUT/matches.parquet/          (uid, entries): each pair's matched entry ids, empty where none, in uid order: one
                                  part a match job (part-ID.parquet, its jobs' own files moved in: never merged)
    OUT/_work/plan.parquet/       the table's distinct (uid, text), cut into jobs (a folder a job)

Balance and card run their SQL over these and the pair table through `engine.engine_sql`: Spark SQL on the Spark
engine, DuckDB on the driver otherwise, the same statements.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from openalign.config import ConfigError, Options
from openalign.data.engine import (Engine, Job, driver_duckdb, duckdb_plan, engine_sql, job_id, read_plan, run_jobs,
                                   spark_for, spark_plan)
from openalign.data.pairs import parts_glob
from openalign.outputs import place, sources_key, staged, staged_dir, write_json

__all__ = ["Matched", "MetadataOptions", "default_metadata", "match_entries", "match_table",
           "read_entries", "spaced_entry", "spaced_text", "wordnet_entries", "write_table"]

WORK = "_work"
WORDNET = "/usr/share/wordnet"  # Debian's wordnet-base: data.noun, data.verb, data.adj, data.adv
WRAPPED = ",.;:?!`"  # MetaCLIP's `spacing`: each gets a space on either side
TAIL_BINS = ((1, 1), (2, 10), (11, 100), (101, 1_000), (1_001, 10_000))  # the reports' counts of entries by size


@dataclass(frozen=True)
class MetadataOptions(Options):
    metadata: str = ""  # a file of metadata entries, one per line (none: WordNet's synset names + the corpus's words)
    wordnet: str = WORDNET  # WordNet's database folder, for the default metadata
    term_min_pairs: int = 100  # the default metadata's corpus words: those in at least this many pairs' texts (0: none)
    ignore_case: bool = False  # lowercase texts and entries before matching (MetaCLIP matches case-sensitively)
    pairs_per_task: int = 100_000  # the unit of distribution, retry and resume

    def cross_field_problems(self) -> list[str]:
        if self.term_min_pairs < 0 or self.pairs_per_task < 1:
            return ["--term-min-pairs must be at least 0 and --pairs-per-task at least 1"]
        return []


@dataclass(frozen=True)
class Matched:
    """What `match_table` wrote."""

    entries: list[str]  # the metadata, in id order (OUT/metadata.txt)
    origin: dict  # where the entries came from, and their fingerprint
    matches: Path  # OUT/matches.parquet/: a folder of the match jobs' parts
    reused: bool  # the matches of an earlier run with the same table and metadata
    plan: Path  # OUT/_work/plan.parquet
    parts: list[str]  # each job's (uid, entries), in plan order: the parts of OUT/matches.parquet/
    pairs: int  # distinct pairs
    key: str  # a fingerprint of the table, the metadata and the rules



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

MAX_ENTRY = 1_000  # characters of one metadata entry


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


def write_table(table: pa.Table, path: str) -> None:
    """A job's Parquet output, whole or not at all."""
    with staged(Path(path)) as tmp:
        pq.write_table(table, tmp)


def words_task(plan: str, index: int, out_path: str, ignore_case: bool) -> dict:
    """One job: each word and the number of the job's pairs whose text holds it."""
    counts: dict[str, int] = {}
    rows = read_plan(plan, index)
    for row in rows:
        for word in words_of(row["text"], ignore_case):
            counts[word] = counts.get(word, 0) + 1
    words = pa.table({"word": pa.array(list(counts), pa.string()),
                      "pairs": pa.array(list(counts.values()), pa.int64())})
    write_table(words, out_path)
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
    longest = max(entries, key=len, default="")
    if len(longest) > MAX_ENTRY:  # pyahocorasick segfaults on a 10 MB entry (exit 139)
        line = next(n for n, text in enumerate(lines, 1) if text.strip() == longest)
        raise ConfigError(f"--metadata {path} line {line:,} is an entry of {len(longest):,} characters; entries are "
                          f"words and names (MetaCLIP's are at most a few hundred characters; the cap is "
                          f"{MAX_ENTRY:,}): is it the right file?")
    unique = list(dict.fromkeys(entries))
    if not unique:
        raise ConfigError(f"--metadata {path} holds no entry; give a text file with one entry per line")
    return unique, len(entries) - len(unique)


def match_task(plan: str, index: int, out_path: str, metadata: str, key: str, ignore_case: bool) -> dict:
    """One job: each pair's matched entry ids."""
    automaton = _automaton(metadata, key, ignore_case)
    rows = read_plan(plan, index)
    matched = [match_entries(automaton, r["text"], ignore_case) for r in rows]
    write_table(pa.table({"uid": pa.array([r["uid"] for r in rows], pa.string()),
                     "entries": pa.array(matched, pa.list_(pa.int32()))}), out_path)
    return {"pairs": len(rows), "unmatched": sum(not m for m in matched)}


def _plan(pairs: str, plan: Path, per_task: int, engine: Engine) -> int:
    """The table's distinct (uid, text) in uid order, cut into jobs (DuckDB locally, Spark SQL on Spark)."""
    if engine.name == "spark":
        spark = spark_for(engine, pairs)
        return spark_plan(spark.read.parquet(pairs).select("uid", "text").distinct(), "uid", per_task, plan)
    with driver_duckdb(engine, plan.parent) as con:
        return duckdb_plan(con, "SELECT DISTINCT uid, text FROM read_parquet(?)", [pairs], "uid", per_task, plan)


def _run(jobs: list[Job], work: Path, name: str, engine: Engine, progress: bool) -> dict:
    results, _ = run_jobs(jobs, work / f"_status-{name}", engine, name, progress)
    return results


def _metadata(pairs: str, plan: Path, n_jobs: int, work: Path, out: Path, options: MetadataOptions, inputs: str,
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
            with engine_sql(engine, work, *parts) as sql:
                sql.source("words", parts)
                words = [(w, int(n)) for w, n in sql.rows(
                    "SELECT word, CAST(sum(pairs) AS BIGINT) AS n FROM words GROUP BY word HAVING sum(pairs) >= ? "
                    "ORDER BY n DESC, word", [options.term_min_pairs])]
        entries = default_metadata(wordnet, words, options.term_min_pairs)
        origin = {"wordnet": str(options.wordnet), "wordnet_entries": len(wordnet),
                  "corpus_words": len(entries) - len(wordnet), "term_min_pairs": options.term_min_pairs}
    if options.ignore_case:
        entries = list(dict.fromkeys(e.lower() for e in entries))
    text = "".join(f"{e}\n" for e in entries)
    path = out / "metadata.txt"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        with staged(path, tmp=path.with_name(path.name + ".tmp")) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return origin | {"entries": len(entries), "fingerprint": hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}


def _fingerprint_of(matches: Path) -> str | None:
    try:
        return json.loads(matches.with_name(matches.name + ".inputs.json").read_text())["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def table_source(path: Path | str) -> str:
    """A Parquet table written as a file or a folder of parts, as a read_parquet argument."""
    return parts_glob(Path(path)) if Path(path).is_dir() else str(path)


def match_table(pairs: str, out: Path, options: MetadataOptions, engine: Engine, progress: bool) -> Matched:
    """Plan the table's distinct (uid, text) into jobs, write the metadata, then each pair's matched entries
    (reused when the table, the metadata and the rules are unchanged); the jobs' parts exist either way."""
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    plan = work / "plan.parquet"
    table = pairs if "://" in pairs else str(Path(pairs).resolve())
    n_pairs = _plan(pairs, plan, options.pairs_per_task, engine)
    n_jobs = -(-n_pairs // options.pairs_per_task)
    inputs = sources_key(table, options.pairs_per_task, n_pairs)
    origin = _metadata(pairs, plan, n_jobs, work, out, options, inputs, engine, progress)
    key = sources_key(inputs, origin["fingerprint"], options.ignore_case)
    matches = out / "matches.parquet"
    parts = [str(matches / f"part-{job_id(i)}.parquet") for i in range(n_jobs)]
    reused = _fingerprint_of(matches) == key and all(Path(p).is_file() for p in parts)
    if not reused:
        matches.with_name(matches.name + ".inputs.json").unlink(missing_ok=True)
        written = [str(work / f"matches-{job_id(i)}.parquet") for i in range(n_jobs)]
        _run([Job(job_id(i), match_task, (str(plan), i, written[i], str(out / "metadata.txt"), origin["fingerprint"],
                                          options.ignore_case), key=sources_key(key, i), outputs=(written[i],))
              for i in range(n_jobs)], work, "match", engine, progress)
        with staged_dir(matches) as folder:  # the jobs' files are the table's parts: moved, never merged
            for i, path in enumerate(written):
                place(Path(path), folder / Path(parts[i]).name)
        write_json(matches.with_name(matches.name + ".inputs.json"), {"inputs": key})
    return Matched(read_entries(str(out / "metadata.txt")), origin, matches, reused, plan, parts, n_pairs, key)
