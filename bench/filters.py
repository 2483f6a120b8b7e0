"""P9: ALIGN's corpus filters on generated pairs: DuckDB (openalign) vs a straightforward pandas version.

Generates a pair table with DuckDB (Zipf-like words, 15% boilerplate captions shared by many images,
10% images with several captions, sizes around the thresholds), then runs, each in its own process so
peak memory (max RSS) is measured per engine:

- openalign's DuckDB engine on N pairs (default 10M) and on the pandas size;
- the same rules written plainly in pandas (groupby, str.split, explode, value_counts) on a smaller
  size (default 1M: pandas holds every exploded term as a Python string, so 10M would need tens of
  GiB here) — its keep-list must equal DuckDB's, which makes it an oracle as well as a baseline;
- openalign's Spark engine (local[2]) on the pandas size: its keep-list must equal DuckDB's.

- with `--huge-rows N` (e.g. 100M), openalign's DuckDB engine out-of-core on N generated pairs under
  `--memory-limit` (spilling to disk), for issue 19's 100M rows within 4 GiB of peak memory.

    .venv/bin/python bench/filters.py [--rows 10000000] [--pandas-rows 1000000] [--vocab-size 1000000]
                                      [--huge-rows 100000000]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import peak_rss_mib, verdict, write_section

HERE = Path(__file__).resolve()


def generate(n: int, out: Path, seed: float = 0.42) -> float:
    import duckdb

    start = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SELECT setseed({seed})")
    con.execute(f"""
    COPY (
      WITH base AS (SELECT i, CASE WHEN random() < 0.1 THEN i % {max(n // 20, 1)} ELSE i END AS img,
                           random() AS r2, random() AS r3 FROM range({n}) t(i))
      SELECT md5(i::VARCHAR) AS uid, md5(img::VARCHAR) AS image_key,
             CASE WHEN r2 < 0.15 THEN 'shared caption number ' || (i % 20000)::VARCHAR
                  ELSE array_to_string(list_transform(range(1 + floor(r3 * 24)::INT),
                       lambda k: 'w' || floor(200000 * pow(random(), 3))::INT::VARCHAR), ' ') END AS text,
             (120 + hash(img) % 600)::INT AS width, (120 + hash(img + 1) % 600)::INT AS height  -- one size per image
      FROM base) TO '{out}' (FORMAT parquet)""")  # in range order: DuckDB preserves insertion order
    con.close()
    # the manifest ingest writes last: every stage refuses a pair table without it (an interrupted ingest's)
    manifest = {"stage": "ingest", "pairs": n, "written_by": "bench/filters.py (generated pairs)"}
    out.with_suffix(".manifest.json").write_text(json.dumps(manifest) + "\n")
    return time.perf_counter() - start


def pandas_filters(pairs: Path, cfg) -> list[str]:
    """The six rules in plain pandas, as one would write them first (an image has one size)."""
    import pandas as pd

    df = pd.read_parquet(pairs, columns=["uid", "image_key", "text", "width", "height"])
    short = df[["width", "height"]].min(axis=1)
    long = df[["width", "height"]].max(axis=1)
    image_small = short <= cfg.min_short_side
    image_aspect = long >= cfg.max_aspect * short
    texts_per_image = df.groupby("image_key")["text"].transform("nunique")
    image_many_texts = texts_per_image > cfg.max_texts_per_image
    images_per_text = df.groupby("text")["image_key"].transform("nunique")
    text_shared = images_per_text > cfg.max_images_per_text
    norm = df["text"].str.replace(r"[\t\n\x0b\f\r ]+", " ", regex=True).str.strip(" ")
    if cfg.lowercase:
        norm = norm.str.lower()
    words = norm.str.split(" ").apply(lambda w: [x for x in w if x])
    n_words = words.str.len()
    text_length = (n_words < cfg.min_words) | (n_words > cfg.max_words)
    terms = words if cfg.vocab_ngrams == 1 else words.apply(lambda w: w + [f"{a} {b}" for a, b in zip(w, w[1:])])
    exploded = terms.explode().dropna()
    counts = exploded.value_counts()
    ranked = counts.reset_index()
    ranked.columns = ["term", "c"]
    ranked = ranked.sort_values(["c", "term"], ascending=[False, True], kind="stable")
    rare_terms = set(ranked["term"].iloc[cfg.vocab_size:])
    rare_rows = exploded[exploded.isin(rare_terms)].index.unique()
    text_rare = pd.Series(False, index=df.index)
    text_rare.loc[rare_rows] = True
    keep = ~(image_small | image_aspect | image_many_texts | text_shared | text_length | text_rare)
    return sorted(df.loc[keep, "uid"].unique().tolist())


def run_child(engine: str, pairs: Path, out: Path, vocab_size: int, memory_limit: str, may_fail: bool = False
              ) -> dict:
    """One engine in a fresh process: seconds, peak RSS and where its keep-list went (with `may_fail`, a failed
    run is reported by its last error line instead of ending the bench)."""
    cmd = [sys.executable, str(HERE), "--child", engine, "--pairs", str(pairs), "--child-out", str(out),
           "--vocab-size", str(vocab_size), "--memory-limit", memory_limit]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 and may_fail:
        error = next((line for line in reversed(done.stderr.splitlines()) if "Error" in line), "failed")
        return {"engine": engine, "seconds": time.perf_counter() - start, "peak_gib": float("nan"),
                "spilled_gib": float("nan"), "failed": error.strip()}
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(args) -> None:
    from openalign import FilterConfig
    from openalign.data.engine import Engine
    from openalign.pipeline.curation import filter as filters

    cfg = FilterConfig(vocab_size=args.vocab_size)
    out = Path(args.child_out)
    start = time.perf_counter()
    if args.child == "pandas":
        keep = pandas_filters(Path(args.pairs), cfg)
        out.mkdir(parents=True, exist_ok=True)
        (out / "keep.json").write_text(json.dumps(keep))
    else:
        memory = args.memory_limit if args.child == "local" else ""  # DuckDB's limit; Spark's driver: its default
        engine = Engine(args.child, "local[2]", workers=2, memory=memory)
        filters.filter_pairs(Path(args.pairs), out, cfg, engine=engine, progress=False)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib() / 1024  # DuckDB and pandas run in this process
    spilled = json.loads((out / "filter_report.json").read_text()).get("spilled_bytes", 0) \
        if args.child != "pandas" else 0
    print(json.dumps({"engine": args.child, "seconds": seconds, "peak_gib": peak, "spilled_gib": spilled / 2**30}))


def read_keep(result_dir: Path) -> list[str]:
    if (result_dir / "keep.json").is_file():
        return json.loads((result_dir / "keep.json").read_text())
    from openalign.data.pairs import read_keep as read

    return read(result_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--pandas-rows", type=int, default=1_000_000)
    parser.add_argument("--vocab-size", type=int, default=1_000_000)
    parser.add_argument("--memory-limit", default="3GB")
    parser.add_argument("--huge-rows", type=int, default=0, help="also DuckDB out-of-core on this many pairs")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--child", choices=["local", "spark", "pandas"])
    parser.add_argument("--pairs")
    parser.add_argument("--child-out")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="openalign-bench-filters-"))
    work.mkdir(parents=True, exist_ok=True)
    big, small = work / "pairs_big.parquet", work / "pairs_small.parquet"
    print(f"generating {args.rows:,} and {args.pandas_rows:,} pairs in {work}", flush=True)
    gen_big = generate(args.rows, big)
    generate(args.pandas_rows, small)
    huge = work / "pairs_huge.parquet"
    if args.huge_rows:
        print(f"generating {args.huge_rows:,} pairs", flush=True)
        gen_huge = generate(args.huge_rows, huge)
    runs = {}
    for name, engine, pairs in [("duckdb_big", "local", big), ("duckdb_small", "local", small),
                                ("pandas_small", "pandas", small)] + \
                               ([] if args.no_spark else [("spark_small", "spark", small)]) + \
                               ([("duckdb_huge", "local", huge)] if args.huge_rows else []):
        print(f"running {name} ...", flush=True)
        runs[name] = run_child(engine, pairs, work / name, args.vocab_size, args.memory_limit, pairs == huge)
        runs[name]["rows"] = {big: args.rows, small: args.pandas_rows, huge: args.huge_rows}[pairs]
        runs[name]["rows_per_s"] = runs[name]["rows"] / runs[name]["seconds"]
        if "failed" in runs[name]:
            print(f"  failed after {runs[name]['seconds']:.0f} s: {runs[name]['failed']}", flush=True)
            continue
        print(f"  {runs[name]['seconds']:.1f} s, {runs[name]['rows_per_s']:,.0f} rows/s, "
              f"peak {runs[name]['peak_gib']:.2f} GiB", flush=True)
    keep_duck = read_keep(work / "duckdb_small")
    pandas_equal = keep_duck == read_keep(work / "pandas_small")
    spark_equal = None if args.no_spark else keep_duck == read_keep(work / "spark_small")
    report = json.loads((work / "duckdb_big" / "filter_report.json").read_text())
    ratio_same = runs["duckdb_small"]["rows_per_s"] / runs["pandas_small"]["rows_per_s"]
    ratio_big = runs["duckdb_big"]["rows_per_s"] / runs["pandas_small"]["rows_per_s"]
    rows = [
        f"### P9 corpus filters ({args.rows:,} generated pairs, 2 cores, vocab_size {args.vocab_size:,})", "",
        f"| engine | pairs | seconds | rows/s | peak memory (max RSS) | spilled to disk (DuckDB limit "
        f"{args.memory_limit}) |", "|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        if "failed" in r:
            rows.append(f"| {name.split('_')[0]} | {r['rows']:,} | failed after {r['seconds']:.0f} s: {r['failed']} "
                        "| | | |")
            continue
        memory = "(JVM not measured)" if name.startswith("spark") else f"{r['peak_gib']:.2f} GiB"
        spilled = f"{r['spilled_gib']:.2f} GiB" if name.startswith("duckdb") else "-"
        rows.append(f"| {name.split('_')[0]} | {r['rows']:,} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} | {memory} "
                    f"| {spilled} |")
    rows += [
        "",
        f"- DuckDB rows/s at {args.rows:,} / pandas rows/s at {args.pandas_rows:,}: **{ratio_big:.1f}x** "
        f"(same size: {ratio_same:.1f}x); target >= 30x",
        f"- keep-lists at {args.pandas_rows:,}: pandas == DuckDB: **{pandas_equal}**"
        + ("" if spark_equal is None else f"; Spark == DuckDB: **{spark_equal}**"),
        f"- {args.rows:,} pairs: {report['kept_pairs']:,} kept; {report['distinct_terms']:,} distinct "
        f"unigrams+bigrams (counted by hash), {report['exactly_counted_terms']:,} of them counted exactly (those "
        "that could reach the vocabulary); removed in sequence: "
        + ", ".join(f"{r['rule']} {r['removed_in_sequence']:,}" for r in report["rules"]),
        f"- generating the {args.rows:,}-row table took {gen_big:.0f} s (not counted); pandas runs on "
        f"{args.pandas_rows:,} rows because its exploded Python strings need tens of GiB at {args.rows:,}",
        *([f"- generating the {args.huge_rows:,}-row table took {gen_huge:.0f} s (not counted)"]
          if args.huge_rows else []),
        f"- command: `.venv/bin/python bench/filters.py --rows {args.rows} --pandas-rows {args.pandas_rows} "
        f"--vocab-size {args.vocab_size}" + (f" --huge-rows {args.huge_rows}" if args.huge_rows else "") + "`",
        "",
    ]
    print("\n".join(rows))
    write_section("P9", "\n".join(rows))
    print(verdict("P9", "filters_rows_per_s_ratio", ratio_big, 30, at_least=True))
    print(verdict("P9", "filters_peak_gib", runs["duckdb_big"]["peak_gib"], 4, at_least=False))
    if args.huge_rows:
        key = f"filters_{args.huge_rows // 1_000_000}m_peak_gib"
        if "failed" in runs["duckdb_huge"]:
            print(f"P9 {key}=failed target<=4 FAIL ({runs['duckdb_huge']['failed']})")
        else:
            print(verdict("P9", key, runs["duckdb_huge"]["peak_gib"], 4, at_least=False))
    identical = pandas_equal and spark_equal is not False
    print(f"P9 keep_lists_identical={identical} target=True {'PASS' if identical else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
