"""Helpers shared by the bench scripts."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

# The names outside openalign's public API (a module's `__all__`, or `openalign`'s own) that the benches import: the
# internals they exist to measure, each with why. tests/test_bench.py fails on a bench importing a name that is
# neither public nor here, on a name here that no bench imports, and on a name that no longer exists.
MEASURED = {
    "openalign.data.engine.Job": "a job as the engine runs it: extract's and ingest's finished tasks (P19)",
    "openalign.data.engine.run_jobs": "semdedup's assign and cells tasks between its global steps (P19 curation)",
    "openalign.data.pairs.write_keep_duckdb": "the generated keep-lists, bucketed as a stage writes them (P19)",
    "openalign.data.pairs.write_keep_report": "the generated keep-lists' reports, which card reads (P19)",
    "openalign.pipeline.shard.plan_duckdb": "shard's plan on the local engine: the kept images grouped (P19)",
    "openalign.pipeline.shard.plan_spark": "shard's plan on Spark (P19)",
    "openalign.pipeline.curation.balance.Balance": "balance's stage, for a Run of its counts, sampling and merge (P19)",
    "openalign.data.tables.dataset": "a table given as a folder of parts, as fetch reads it (P19)",
    "openalign.pipeline.ingest.Ingest": "ingest's stage, for a Run of its merge alone (P19)",
    "openalign.pipeline.ingest.REJECT_SCHEMA": "the rejects' schema, for the parts the concatenation reads (P19)",
    "openalign.pipeline.ingest._concatenate": "ingest's file layout: its tasks' parts into one file (P19)",
    "openalign.pipeline.ingest._distinct": "ingest's merge after its tasks: distinct uids and images (P19)",
    "openalign.pipeline.web.extract.Extract": "extract's stage, for a Run of its merge alone (P19)",
    "openalign.pipeline.web.extract._merge": "extract's merge: the grouping of keys and a task per part (P19)",
    "openalign.pipeline.web.extract._tallies": "extract's report's tallies (P19)",
    "openalign.corpora.hosts.Hosts": "the built-in web's hosts, served for the fetch benches (P15, HTTP clients)",
    "openalign.corpora.hosts.sample_web": "a sample of the built-in web for the fetch benches",
    "openalign.data.engine.Engine": "the engine a stage runs on, local or Spark (P11, P14)",
    "openalign.data.engine.spark_session": "a local Spark session, started once outside the timed part",
    "openalign.data.engine.warm_pool": "the local engine's process pool, warmed outside the timed part (P11)",
    "openalign.data.loader.Position": "the training stream's position (P5 input pipeline, train step)",
    "openalign.data.loader.StreamSpec": "the training stream (P5 input pipeline, train step)",
    "openalign.data.loader.batches_per_role": "the batches each loader worker yields (P5)",
    "openalign.data.loader.epoch_plan": "the training stream's epochs (P5, train step)",
    "openalign.data.loader.train_loader": "the training loader itself (P5)",
    "openalign.data.pairs.normalize_text": "the alt-text normalization cc2dataset is compared on (P14)",
    "openalign.data.pairs.read_keep": "a keep-list as the filter bench checks it against pandas'",
    "openalign.data.workers.load_readers": "the shard readers each data-plane worker opens (P11)",
    "openalign.eval.datasets.load_templates": "the zero-shot prompt templates (classifier build time)",
    "openalign.index.build.Parts": "the embedding parts an index is built from (P12)",
    "openalign.index.build.recall_at_10": "the recall an index is tuned to (P12)",
    "openalign.index.build.streaming_search": "exact truth streamed over the parts (P12)",
    "openalign.index.embed.MANIFEST": "the embeddings' manifest name, for synthetic collections (P12, serve load)",
    "openalign.index.embed.META_SCHEMA": "the metadata schema of synthetic collections (P12)",
    "openalign.index.embed._write_part": "one embeddings part written as embed writes it (serve load)",
    "openalign.index.parts.part_files": "the part files of a collection (P12)",
    "openalign.index.scan.tile_scores": "the exact scan's kernel, against FAISS's (P13 search)",
    "openalign.model.dual_encoder.DualEncoder": "the model, built without a run (train step, memory per device)",
    "openalign.model.dual_encoder.Encoding": "a tower's output, for the reference step (train step)",
    "openalign.model.dual_encoder.hf_config": "the Hugging Face config of the reference model (train step)",
    "openalign.tokenizer.train_tokenizer": "a vocabulary for the synthetic batches (P5, train step)",
    "openalign.train.optim.build_optimizer": "LAMB as training builds it (train step, memory per device)",
    "openalign.train.optim.set_lr": "the step's learning rate (train step, memory per device)",
    "openalign.train.step.batch_loss": "the loss of one batch (train step)",
    "openalign.train.step.forward_backward": "one training step's work (train step, memory per device)",
}


def write_section(name: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace the block between `<!-- NAME begin/end -->` markers in docs/benchmarks.md (append if absent)."""
    begin, end = f"<!-- {name} begin -->", f"<!-- {name} end -->"
    text = path.read_text() if path.is_file() else "# Benchmarks\n\nRatios measured side by side in one run.\n\n"
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def verdict(target: str, name: str, value: float, bound: float, at_least: bool, fmt: str = ".2f") -> str:
    ok = value >= bound if at_least else value <= bound
    line = f"{target} {name}={value:{fmt}} target{'>=' if at_least else '<='}{bound:g} {'PASS' if ok else 'FAIL'}"
    if not ok and bound and value == value:  # how far off, as a factor of the target
        line += f" ({value / bound:.2f}x the target: {'short' if at_least else 'over'} by " \
                f"{abs(value - bound) / bound:.0%})"
    return line


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM belongs to the address space, so unlike ru_maxrss it
    does not inherit the high-water mark of the parent that forked us."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_mib() -> float:
    """This process's resident memory now (the baseline for an extra-peak measurement)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ P19 (scale.py, scale_curation.py)

def jvm_peak_mib(spark) -> float:
    """The Spark JVM's peak resident memory (local mode: the driver and the executors in one process)."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def step_setup(step: str, engine_name: str, folder: Path, local_memory: str):
    """(engine, its Spark session started outside the timed part or None, an empty output folder) of one P19 step:
    the local engine with 2 workers under `local_memory` (P19_LOCAL_MEMORY overrides), or Spark local[2] with 4g."""
    from openalign.data.engine import Engine, spark_session

    engine = (Engine("spark", master="local[2]", memory="4g") if engine_name == "spark"
              else Engine("local", workers=2, memory=os.environ.get("P19_LOCAL_MEMORY", local_memory)))
    spark = spark_session(engine.master, memory=engine.memory) if engine_name == "spark" else None
    out = folder / f"out-{step.replace(' ', '-')}-{engine_name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return engine, spark, out


def measure_fresh(script: str, step: str, engine: str, folder: Path, local_memory: str) -> dict:
    """One step of `script` (its `--one STEP ENGINE DIR`) in a fresh process, so its peak memory is its own."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "P19_LOCAL_MEMORY": local_memory,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    found = subprocess.run([sys.executable, script, "--one", step, engine, str(folder)], capture_output=True,
                           text=True, env=env)
    if found.returncode:
        raise SystemExit(f"{step} on {engine} failed:\n{found.stderr[-3000:]}")
    return json.loads(found.stdout.strip().splitlines()[-1])


def record(found: dict, saved: Path, script: str, step: str, engine: str, folder: Path, rows: int, local_memory: str,
           unit: str) -> None:
    """One P19 step measured in a fresh process (`measure_fresh`), kept (DIR/results.json, rewritten after each) and
    printed."""
    result = measure_fresh(script, step, engine, folder, local_memory) | {"rows": rows}
    found[(step, engine, rows)] = result
    saved.write_text(json.dumps(list(found.values()), indent=1))
    print(f"{step:<20} {engine:<6} {rows:>12,} {unit}s {result['seconds']:8.1f} s "
          f"{result['seconds'] / rows * 1e6:7.2f} us/{unit}  driver {result['driver_mib']:7.0f} MiB"
          + (f"  JVM {result['jvm_mib']:6.0f} MiB" if result["jvm_mib"] else ""), flush=True)


def ratio_row(step: str, shown: str, engine: str, a: dict, b: dict, small: int, large: int) -> tuple[str, list[str]]:
    """A P19 table row of one step on one engine at N (`a`) and 10N (`b`), and its two verdicts: the driver's peak
    memory within 1.3x and the time a row within 1.5x."""
    per = (b["seconds"] / large) / (a["seconds"] / small)
    rss = b["driver_mib"] / a["driver_mib"]
    jvm = f"{a['jvm_mib']:.0f} / {b['jvm_mib']:.0f}" if a["jvm_mib"] else "-"
    line = (f"| {step} | {shown} | {a['seconds']:.1f} | {b['seconds']:.1f} | {a['seconds'] / small * 1e6:.2f} | "
            f"{b['seconds'] / large * 1e6:.2f} | {per:.2f} | {a['driver_mib']:.0f} | {b['driver_mib']:.0f} | "
            f"{rss:.2f} | {jvm} |")
    name = f"{step.replace(' ', '_')}_{engine}"
    return line, [verdict("P19", f"{name}_rss_ratio", rss, 1.3, False),
                  verdict("P19", f"{name}_time_per_row_ratio", per, 1.5, False)]


def p19_arguments(doc: str, steps: tuple[str, ...], folder: str, local_memory: str) -> argparse.ArgumentParser:
    """The flags both P19 scripts take (sizes, engines, steps, the results' folder, the local limit, one step in a
    fresh process)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--factor", type=int, default=10)
    parser.add_argument("--engines", default="local,spark")
    parser.add_argument("--steps", default=",".join(steps))
    parser.add_argument("--dir", type=Path, default=Path(folder))
    parser.add_argument("--local-memory", default=local_memory, help="the local engine's driver DuckDB limit")
    parser.add_argument("--one", nargs=3, metavar=("STEP", "ENGINE", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    return parser


def generated(base: Path, rows: int, generate, unit: str) -> Path:
    """A fresh folder of `rows` generated rows (`generate(rows, folder)`), timed and said."""
    import time

    folder = base / f"n{rows}"
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    generate(rows, folder)
    print(f"{rows:,} {unit}s generated in {time.perf_counter() - start:.0f} s", flush=True)
    return folder


def table_head(title: str, unit: str) -> list[str]:
    """A P19 table's title and header (`ratio_row` gives its rows)."""
    return [title, "", f"| step | engine | N: s | 10N: s | us/{unit} N | us/{unit} 10N | time/{unit} 10N/N | "
            "driver MiB N | driver MiB 10N | RSS 10N/N | Spark JVM MiB N / 10N |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
