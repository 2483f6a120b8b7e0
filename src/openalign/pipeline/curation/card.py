"""A corpus's data card: what each stage removed, per language, per host and per concept, with examples, and where
it all came from.

    openalign card PAIRS --keep filter/ --keep dedup/ --keep balance/ --out card/

Reads the pair table (or extract's candidate table) and the keep-lists of any stages (filter, dedup, screen, score,
semdedup, balance), in the order given, and writes DIR/card.md (for people), DIR/card.json (the same numbers, for
tools; written last: the card is finished when it appears) and DIR/card.png (the pairs left after each stage, and
the concepts' counts before and after):

- counts: the pairs and images of the table; each stage's removals alone, the pairs left after each stage in order,
  the removals no other stage makes, and every two stages' shared removals; each stage's own rules (filter's
  rules, removed alone and in sequence) from its report;
- per language and per host where the table carries them (`language`, `host`, or the host of `url`): pairs, kept,
  each stage's removals;
- concepts: the metadata entries' pair counts before and after curation (head, tail, entries with no pair, entries
  curation emptied). The matches come from a balance keep-list among the stages, else from balance's matching run
  here (its metadata: --metadata FILE, or WordNet and the corpus's words) into DIR/concepts/;
- examples kept and removed at each stage, and provenance: the input files with their sizes, each stage's report
  (rule, options), the command, the versions of openalign and the libraries.

The numbers are SQL over the table and keep-lists on the engine given (Spark SQL on the executors; DuckDB on the
driver, which spills to disk), in a constant number of passes whatever the stages (one grouping by uid joined with
each keep-list, one aggregate, one grouping by image, one by each group column, one of the matches by entry, and a
small ordered LIMIT for each stage's examples); only numbers, top rows and examples come back. The matching runs on
the engine too.
"""

from __future__ import annotations

import json
import platform
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime, UTC
from pathlib import Path

import numpy as np

from openalign import plots
from openalign.config import ConfigError, listed
from openalign.data.engine import Engine, EngineSql, engine_sql
from openalign.data.pairs import (KEEP_REPORT_SUFFIX, PAIR_TABLE, keep_reports, keep_source,
                                  manifest_path)
from openalign.pipeline.curation.concepts import TAIL_BINS, MetadataOptions, match_table, read_entries, table_source
from openalign.pipeline.runner import Input, Run, Stage, run_stage

__all__ = ["CardOptions", "CardResult", "card"]

CARD = "card.json"
GROUPS = ("language", "host")
VERSIONS = ("duckdb", "pyarrow", "numpy", "torch", "transformers", "pyahocorasick", "pyspark")
URL_HOST = r"^[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^/@]*@)?([^/:?#]+)"  # a URL's host: after the scheme and any user@
SETTINGS = ("against", "mode", "model", "classifier", "threshold")  # a report without `options`: these say how it ran


@dataclass(frozen=True)
class CardOptions(MetadataOptions):
    """The metadata options say what the concepts are where no balance keep-list is among the stages."""

    top: int = 15  # languages, hosts and concepts listed
    examples: int = 3  # pairs shown kept and removed at each stage
    title: str = ""  # the card's heading (default: the pair table's folder and name)

    def cross_field_problems(self) -> list[str]:
        return super().cross_field_problems() + (["--top and --examples must be at least 0"]
                                                 if min(self.top, self.examples) < 0 else [])


@dataclass(frozen=True)
class CardResult:
    """Where the card went, and its main numbers (card.json holds them all)."""

    markdown: Path  # OUT/card.md
    json: Path  # OUT/card.json
    plot: Path  # OUT/card.png
    pairs: int  # distinct pairs of the table
    kept_pairs: int  # kept by every stage
    stages: list[str]  # in the order given
    seconds: float
    card: dict


def _stage(keep_dir: Path, pairs: str) -> tuple[str, dict]:
    """(stage name, its report) of a keep-list directory made from `pairs`; one sentence otherwise."""
    keep_source(keep_dir)  # a finished keep-list, or one sentence
    reports = keep_reports(keep_dir)
    if not reports:
        raise ConfigError(f"--keep {keep_dir} holds no report of a keep-list stage")
    path = reports[0]
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise ConfigError(f"{path} is damaged (not JSON); run that stage again into {keep_dir}") from None
    made_from = report.get(PAIR_TABLE) if isinstance(report, dict) else None
    if not isinstance(made_from, str):
        raise ConfigError(f"{path} does not name its pair table; run that stage again into {keep_dir}")
    if "://" not in pairs and "://" not in made_from and Path(made_from).resolve() != Path(pairs).resolve():
        raise ConfigError(f"--keep {keep_dir} was made from {made_from}, not {pairs}; give the keep-lists of this "
                          "pair table")
    return path.name.removesuffix(KEEP_REPORT_SUFFIX), report


def _names(stages: list[tuple[str, dict]]) -> list[str]:
    """Stage names, numbered where one stage appears twice (filter, filter#2)."""
    seen: dict[str, int] = {}
    names = []
    for name, _ in stages:
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return names


def _columns(pairs: str) -> list[str]:
    import duckdb

    with duckdb.connect() as con:
        return [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [pairs]).fetchall()]


def _load(sql: EngineSql, pairs: str, keeps: list[Path], names: list[str]) -> list[str]:
    """Table p: one row per uid (text, image, group columns) with a `k_i` column per stage (kept by it) and `kept`
    (by every stage): one grouping of the table and a join with each keep-list, on the engine."""
    columns = list(sql.spark.read.parquet(pairs).columns) if sql.spark is not None else _columns(pairs)
    groups = []
    if "language" in columns:
        groups.append("min(language) AS language")
    if "host" in columns:
        groups.append("min(host) AS host")
    elif "url" in columns:
        groups.append(f"min(lower(regexp_extract(url, '{URL_HOST}', 1))) AS host")
    image = "coalesce(member, path)" if "path" in columns else "url" if "url" in columns else "NULL"
    if "path" in columns and "url" in columns:
        image = "coalesce(url, member, path)"
    sql.source("card_pairs", pairs)
    for i, keep in enumerate(keeps):
        sql.source(f"card_keep{i}", keep_source(keep))
    select = ", ".join(["uid", "min(text) AS text", "min(image_key) AS image_key", f"min({image}) AS image", *groups])
    flags = "".join(f", k{i}.uid IS NOT NULL AS k{i}" for i in range(len(keeps)))
    joins = "".join(f" LEFT JOIN (SELECT DISTINCT uid FROM card_keep{i}) k{i} USING (uid)" for i in range(len(keeps)))
    kept = " AND ".join(f"k{i}.uid IS NOT NULL" for i in range(len(keeps))) or "true"
    sql.table("p", f"SELECT base.*{flags}, {kept} AS kept FROM (SELECT {select} FROM card_pairs GROUP BY uid) base"
                   f"{joins}")
    present = [g for g in GROUPS if g in [c.split(" AS ")[-1] for c in groups]]
    if not present:
        return []
    found = sql.rows("SELECT " + ", ".join(f"count({g})" for g in present) + " FROM p")[0]
    return [g for g, n in zip(present, found) if n]  # an all-null one: none


def _examples(sql: EngineSql, where: str, n: int) -> list[dict]:
    return [{"text": text, "image": image} for text, image in sql.rows(
        f"SELECT text, image FROM p WHERE {where} ORDER BY uid LIMIT {int(n)}")] if n else []


def _rules(report: dict) -> list[dict]:
    """A stage's own rules from its report (filter's list of rules), without their examples."""
    rules = report.get("rules")
    if not isinstance(rules, list):
        return []
    return [{k: v for k, v in r.items() if k in ("rule", "description", "removed_alone", "removed_in_sequence")}
            for r in rules if isinstance(r, dict) and "rule" in r]


def _counts(sql: EngineSql, names: list[str], reports: list[dict], examples: int) -> dict:
    """Every count in two passes: one aggregate over p (each stage's removals alone, the pairs left after it, its own
    removals, every two stages' shared ones) and one grouping by image (the images left; a grouping spills, and
    `count(DISTINCT)` does not)."""
    n = len(names)
    left = ["true"]
    for i in range(n):
        left.append(f"{left[-1]} AND k{i}")
    only = [" AND ".join([f"NOT k{i}", *(f"k{j}" for j in range(n) if j != i)]) for i in range(n)]
    counted = ["count(*)", *(f"count(*) FILTER (WHERE NOT k{i})" for i in range(n)),
               *(f"count(*) FILTER (WHERE {left[i + 1]})" for i in range(n)),
               *(f"count(*) FILTER (WHERE {only[i]})" for i in range(n)),
               *(f"count(*) FILTER (WHERE NOT k{i} AND NOT k{j})" for i in range(n) for j in range(n)),
               "count(*) FILTER (WHERE kept)"]
    values = [int(v or 0) for v in sql.rows("SELECT " + ", ".join(counted) + " FROM p")[0]]
    total, alone, after, own = values[0], values[1:1 + n], values[1 + n:1 + 2 * n], values[1 + 2 * n:1 + 3 * n]
    overlap = [values[1 + 3 * n + i * n: 1 + 3 * n + (i + 1) * n] for i in range(n)]
    kept = values[-1]
    per_image = ", ".join(["image_key", *(f"bool_or({left[i + 1]}) AS l{i}" for i in range(n)),
                           "bool_or(kept) AS kept"])
    counted = ["count(*)", *(f"count(*) FILTER (WHERE l{i})" for i in range(n)), "count(*) FILTER (WHERE kept)"]
    images = [int(v or 0) for v in sql.rows(f"SELECT {', '.join(counted)} FROM (SELECT {per_image} FROM p "
                                            "GROUP BY image_key)")[0]]
    stages = [{"stage": name, "rule": reports[i].get("rule"), "removed_alone": alone[i], "left_after": after[i],
               "images_left_after": images[1 + i], "removed_only_here": own[i], "rules": _rules(reports[i]),
               "removed_examples": _examples(sql, f"NOT k{i}", examples)} for i, name in enumerate(names)]
    return {"pairs": total, "images": images[0], "kept_pairs": kept, "kept_images": images[-1], "stages": stages,
            "removed_by_both": overlap, "kept_examples": _examples(sql, "kept", examples)}


def _groups(sql: EngineSql, groups: list[str], names: list[str], top: int) -> dict:
    """Per language and per host: the `top` values with the most pairs, and how many values there are (one grouping
    each, written on the engine; its count and its top rows come back)."""
    out = {}
    for column in groups:
        removed = "".join(f", count(*) FILTER (WHERE NOT k{i}) AS r{i}" for i in range(len(names)))
        sql.table(f"g_{column}", f"SELECT coalesce({column}, '(none)') AS v, count(*) AS n, "
                                 f"count(*) FILTER (WHERE kept) AS kept{removed} FROM p GROUP BY coalesce({column}, "
                                 "'(none)')")
        values = int(sql.rows(f"SELECT count(*) FROM g_{column}")[0][0])
        rows = sql.rows(f"SELECT * FROM g_{column} ORDER BY n DESC, v LIMIT {int(top)}") if top else []
        out[column] = {"values": values, "top": [
            {column: r[0], "pairs": int(r[1]), "kept": int(r[2]),
             "removed_by": {name: int(r[3 + i]) for i, name in enumerate(names)}} for r in rows]}
    return out


def _concepts(sql: EngineSql, out: Path, pairs: str, keeps: list[Path], names: list[str], options: CardOptions,
              engine: Engine, progress: bool) -> dict:
    """Each metadata entry's pairs in the whole table and among the kept, from balance's matches (one join of the
    matches with p and one grouping by entry)."""
    source = next((k for k, n in zip(keeps, names) if n.split("#")[0] == "balance"), None)
    if source is None:
        source = out / "concepts"
        match_table(pairs, source, options, engine, progress)
        shutil.rmtree(source / "_work", ignore_errors=True)
    entries = read_entries(str(Path(source) / "metadata.txt"))
    sql.source("card_matches", table_source(Path(source) / "matches.parquet"))
    sql.table("m", "SELECT m.uid AS uid, m.entries AS entries, p.kept AS kept FROM card_matches m JOIN p "
                   "ON m.uid = p.uid")
    before, after = np.zeros(len(entries), np.int64), np.zeros(len(entries), np.int64)
    for e, n, k in sql.rows(f"SELECT e, count(*), count(*) FILTER (WHERE kept) FROM (SELECT {sql.unnest}(entries) "
                            "AS e, kept FROM m) GROUP BY e"):
        before[e], after[e] = n, k
    matched_before, matched_after = (int(v or 0) for v in sql.rows(
        f"SELECT count(*) FILTER (WHERE {sql.size}(entries) > 0), count(*) FILTER (WHERE {sql.size}(entries) > 0 "
        "AND kept) FROM m")[0])
    order = np.lexsort((np.arange(len(entries)), -before))
    top = options.top

    def bins(values: np.ndarray) -> dict:
        values = values[values > 0]
        out = {"entries": int(len(values))}
        out.update({f"{low}-{high}" if high > low else f"{low}": int(((values >= low) & (values <= high)).sum())
                    for low, high in TAIL_BINS})
        out[f">{TAIL_BINS[-1][1]}"] = int((values > TAIL_BINS[-1][1]).sum())
        return out

    emptied = np.flatnonzero((before > 0) & (after == 0))
    never = np.flatnonzero(before == 0)
    return {
        "source": str(source), "entries": len(entries), "matched_pairs": matched_before,
        "matched_kept_pairs": matched_after, "head": [
            {"entry": entries[i], "pairs": int(before[i]), "kept": int(after[i])} for i in order[:top] if before[i]],
        "tail": [{"entry": entries[i], "pairs": int(before[i]), "kept": int(after[i])}
                 for i in order[:int((before > 0).sum())][-top:][::-1]],
        "bins_before": bins(before), "bins_after": bins(after),
        "entries_without_pairs": int(len(never)), "without_pairs_examples": [entries[i] for i in never[:top]],
        "entries_emptied": int(len(emptied)), "emptied_examples": [entries[i] for i in emptied[:top]],
        "_counts": (before, after),
    }


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _file(path: str) -> dict:
    p = Path(path)
    return {"path": str(p.resolve()) if "://" not in path else path,
            **({"bytes": p.stat().st_size, "modified": datetime.fromtimestamp(p.stat().st_mtime, UTC)
                .isoformat(timespec="seconds")} if "://" not in path and p.is_file() else {})}


def _provenance(pairs: str, keeps: list[Path], names: list[str], reports: list[dict], command: str | None) -> dict:
    manifest = None
    if "://" not in pairs:
        try:
            manifest = json.loads(manifest_path(Path(pairs)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = None
    made_by = None
    if isinstance(manifest, dict):
        made_by = {k: manifest.get(k) for k in ("stage", "sources", "inputs", "options", "engine", "pairs", "images",
                                                 "rejected", "candidates") if k in manifest}
    return {
        "pair_table": _file(pairs), "made_by": made_by,
        "stages": [{"stage": n, "keep": str(Path(k).resolve()), "engine": r.get("engine"),
                    "options": r.get("options") or r.get("config") or {k: r[k] for k in SETTINGS
                                                                        if r.get(k) is not None},
                    "seconds": r.get("seconds")}
                   for n, k, r in zip(names, keeps, reports)],
        "command": command, "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"openalign": _version("openalign"), "python": platform.python_version(),
                     **{name: _version(name) for name in VERSIONS}},
    }


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ") if text is not None else ""


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows)]


def _share(n: int, total: int) -> str:
    return f"{n:,} ({100 * n / total:.1f}%)" if total else f"{n:,}"


def markdown(card: dict) -> str:
    """The card for people: the same numbers as card.json."""
    c, names = card["counts"], [s["stage"] for s in card["counts"]["stages"]]
    lines = [f"# Data card: {card['title']}", "",
             f"{c['pairs']:,} pairs of {c['images']:,} images; after {', '.join(names) or 'no stage'}: "
             f"**{_share(c['kept_pairs'], c['pairs'])} pairs** of {c['kept_images']:,} images.", "",
             "![the pairs left after each stage; the concepts' counts before and after](card.png)", "",
             "## Stages", "", "In the order given; a pair counts as removed by every stage that removes it.", ""]
    lines += _table(["stage", "rule", "removed alone", "left after", "images left", "removed by no other stage"], [
        [s["stage"], s["rule"] or ("its rules below" if s["rules"] else ""), _share(s["removed_alone"], c["pairs"]),
         f"{s['left_after']:,}",
         f"{s['images_left_after']:,}", f"{s['removed_only_here']:,}"] for s in c["stages"]])
    if len(names) > 1:
        lines += ["", "Pairs removed by both (row and column stage):", ""]
        lines += _table(["", *names], [[n, *(f"{v:,}" for v in row)] for n, row in zip(names, c["removed_by_both"])])
    for s in c["stages"]:
        if s["rules"]:
            lines += ["", f"### {s['stage']}'s rules", ""]
            lines += _table(["rule", "what", "removed alone", "removed in sequence"], [
                [r.get("rule"), r.get("description", ""), f"{r.get('removed_alone', 0):,}",
                 f"{r.get('removed_in_sequence', 0):,}"] for r in s["rules"]])
    for column, group in card["groups"].items():
        lines += ["", f"## Per {column}", "", f"{group['values']:,} values; the {len(group['top'])} with the most "
                  "pairs:", ""]
        lines += _table([column, "pairs", "kept", *(f"removed by {n}" for n in names)], [
            [g[column], f"{g['pairs']:,}", _share(g["kept"], g["pairs"]), *(f"{g['removed_by'][n]:,}" for n in names)]
            for g in group["top"]])
    if not card["groups"]:
        lines += ["", "The table carries no language and no image URL (a candidate table from `openalign extract` has "
                  "both, a fetched corpus its URLs)."]
    k = card["concepts"]
    lines += ["", "## Concepts", "", f"{k['entries']:,} metadata entries (matches from {k['source']}): "
              f"{_share(k['matched_pairs'], c['pairs'])} of the pairs match one; after curation "
              f"{_share(k['matched_kept_pairs'], c['kept_pairs'])} of the kept. {k['entries_without_pairs']:,} "
              f"entries match no pair; curation left {k['entries_emptied']:,} more with none.", ""]
    lines += _table(["head entry", "pairs", "kept"], [[h["entry"], f"{h['pairs']:,}", f"{h['kept']:,}"]
                                                      for h in k["head"]])
    lines += [""] + _table(["entries with n pairs", *k["bins_before"]], [
        ["before", *(f"{v:,}" for v in k["bins_before"].values())],
        ["after", *(f"{v:,}" for v in k["bins_after"].values())]])
    if k["tail"]:
        lines += ["", "The tail: " + ", ".join(f"{t['entry']} ({t['pairs']} → {t['kept']})" for t in k["tail"]) + "."]
    if k["emptied_examples"]:
        lines += ["", "Emptied by curation: " + ", ".join(k["emptied_examples"]) + "."]
    lines += ["", "## Examples", ""]
    lines += _table(["", "text", "image"], [["kept", e["text"], e["image"]] for e in c["kept_examples"]] + [
        [f"removed by {s['stage']}", e["text"], e["image"]] for s in c["stages"] for e in s["removed_examples"]])
    p = card["provenance"]
    lines += ["", "## Provenance", "", f"- pair table: `{p['pair_table']['path']}`"
              + (f" ({p['pair_table']['bytes']:,} bytes, modified {p['pair_table']['modified']})"
                 if "bytes" in p["pair_table"] else "")]
    if p["made_by"]:
        lines.append(f"- made by `openalign {p['made_by'].get('stage')}` from "
                     + ", ".join(f"`{s}`" for s in (p["made_by"].get("sources") or p["made_by"].get("inputs") or [])))
    lines += [f"- {s['stage']}: `{s['keep']}` ({s['engine']} engine, {s['seconds']} s); options `"
              f"{json.dumps(s['options'], ensure_ascii=False)}`" for s in p["stages"]]
    if p["command"]:
        lines.append(f"- this card: `{p['command']}`")
    lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items() if v) + f"; written "
                 f"{p['written']}")
    return "\n".join(lines) + "\n"


def _figure(card: dict, counts: tuple[np.ndarray, np.ndarray]):
    plt = plots.pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    c = card["counts"]
    labels = ["table", *(s["stage"] for s in c["stages"])]
    values = [c["pairs"], *(s["left_after"] for s in c["stages"])]
    left.bar(labels, values, color=["tab:grey", *["tab:blue"] * len(c["stages"])])
    for x, v in enumerate(values):
        left.text(x, v, f"{v:,}", ha="center", va="bottom", fontsize=8)
    left.set(ylabel="pairs left", title="pairs after each stage, in order")
    for values, label, colour in ((counts[0], "all pairs", "tab:grey"), (counts[1], "kept", "tab:blue")):
        values = np.sort(values[values > 0])[::-1]
        if len(values):
            right.loglog(np.arange(1, len(values) + 1), values, color=colour, label=f"{label} ({len(values):,} "
                                                                                     "entries)")
    right.set(xlabel="entry rank", ylabel="pairs matching the entry", title="concepts before and after")
    right.legend()
    fig.suptitle(card["title"])
    return fig


@dataclass(frozen=True)
class CardReport:
    """OUT/card.json."""

    title: str
    counts: dict
    groups: dict
    concepts: dict
    provenance: dict
    options: dict


class Card(Stage):
    name = "card"
    options = CardOptions
    result = CardResult
    columns = ("uid", "image_key", "text")
    inputs = (Input("keep", "a keep-list directory of this table (filter, dedup, screen, score, semdedup, balance); "
                            "repeat in the order the stages ran", required=False, repeat=True),)
    pairs_help = "the pair table from `openalign ingest`, or the candidate table from `openalign extract`"
    out_help = "a folder: card.md, card.json and card.png"
    keeps = False
    report_file = CARD
    record_field = "card"
    provenance = True

    def __init__(self, keep=(), command: str | None = None):
        self.lists = [Path(k) for k in listed(keep, "keeps")]
        self.command = command

    def check(self, run: Run) -> None:
        stages = [_stage(k, run.pairs) for k in self.lists]
        self.names, self.reports = _names(stages), [r for _, r in stages]

    def plan(self, run: Run) -> list:
        return []  # SQL on the engine (EngineSql); the concepts' matching runs its own jobs

    def sql(self, run: Run):
        """The card's SQL: Spark SQL on the Spark engine, else a DuckDB on the driver (spilling into its work)."""
        return engine_sql(run.engine, run.work, run.pairs, *(keep_source(k) for k in self.lists))

    def merge(self, run: Run, results: dict) -> CardReport:
        options, pairs, names = run.options, run.pairs, self.names
        with self.sql(run) as sql:
            groups = _load(sql, pairs, self.lists, names)
            counts = _counts(sql, names, self.reports, options.examples)
            by_group = _groups(sql, groups, names, options.top)
            concepts = _concepts(sql, run.out, pairs, self.lists, names, options, run.engine, run.progress)
        self.entry_counts = concepts.pop("_counts")
        title = options.title or (f"{Path(pairs).resolve().parent.name}/{Path(pairs).name}" if "://" not in pairs
                                  else pairs)
        report = CardReport(title=title, counts=counts, groups=by_group, concepts=concepts,
                            provenance=_provenance(pairs, self.lists, names, self.reports, self.command),
                            options=asdict(options))
        (run.out / "card.md").write_text(markdown(asdict(report)), encoding="utf-8")
        return report

    def figure(self, run: Run, report: CardReport):
        return _figure(asdict(report), self.entry_counts)

    def result_fields(self, run: Run, report: CardReport) -> dict:
        return {"markdown": run.out / "card.md", "json": run.out / CARD, "plot": run.out / "card.png",
                "pairs": report.counts["pairs"], "kept_pairs": report.counts["kept_pairs"], "stages": self.names}

    def summary(self, result: CardResult, options: CardOptions) -> list[str]:
        after = " -> ".join(f"{s['stage']} {s['left_after']:,}" for s in result.card["counts"]["stages"])
        return [f"{result.pairs:,} pairs" + (f" -> {after}" if after else "") + f": {result.kept_pairs:,} kept"]

    def files_line(self, result: CardResult, out: Path) -> str:
        return f"card: {result.markdown} (+ {result.json.name}, {result.plot.name})"


def card(pairs: Path, keeps: list[Path], out: Path, options: CardOptions = CardOptions(), progress: bool = True,
         engine: Engine = Engine(), command: str | None = None) -> CardResult:
    """The data card of a pair table and the keep-lists of its stages (in order): card.md, card.json, card.png."""
    return run_stage(Card(keeps, command), pairs, out, options, progress, engine)
