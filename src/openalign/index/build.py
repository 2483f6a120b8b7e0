"""`openalign index`: a FAISS index over `openalign embed` output, tuned to a recall target.

    INDEX/index.faiss      the FAISS index (inner product = cosine: the embeddings are normalized)
    INDEX/meta.parquet     id, key, path, caption, width, height (read with DuckDB or pyarrow)
    INDEX/index.json       kind, search parameters, the recall@10 measured against exact search, counts
    INDEX/vectors-f16.npy  with `refine`: the vectors as float16, memory-mapped, to re-score the shortlist

Kinds: `flat` (exact), `ivf` (inverted lists over k-means cells; vectors stored as 8-bit codes, or
product-quantized when those would not fit `max_bytes`; `codes=flat` keeps float32, and batches of queries
are then searched cell-major: cells.py), `hnsw` (a graph). `auto` is exact up to `exact_up_to` vectors
and IVF beyond. Approximate indexes are tuned on a sample of the collection's own vectors as queries:
the smallest nprobe / efSearch whose recall@10 against exact search reaches the target, each
query's own vector left out. With `refine` F, an approximate index returns F·k candidates, re-scored
exactly with float16 copies of the vectors (2 bytes per dimension on disk, read only for the candidates):
the codes' rounding no longer reorders near neighbours (bench/search.py, P8). Queries from the other
modality (texts against images) sit elsewhere in the space than the indexed vectors; raise `--recall`
if their measured recall falls short.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign.config import ConfigError, as_flags, check, expect
from openalign.index import exact, takedown
from openalign.index.cells import CellScan
from openalign.index.opened import (EXACT16, FILE, FILES, INFO, META, TRAINED, Refined, batched, faiss_of, file_of,
                                    read_info)
from openalign.index.options import IndexOptions
from openalign.index.parts import Parts, add_shard, part_files, read_manifest
from openalign.outputs import place, staged, unfinish, write_json

__all__ = ["IndexOptions", "IndexResult", "build"]


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact top 10 that `found` [Q, 10] contains."""
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist())]))


def _without_self(ids: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """[Q, 10] of [Q, 11] results with each query's own vector removed (leave-one-out tuning: a query
    that is itself indexed would find its own cell and overstate recall)."""
    return np.stack([[i for i in row if i != own][:10] for row, own in zip(ids.tolist(), sample.tolist())])


def _tune(index, queries: np.ndarray, sample: np.ndarray, exact: np.ndarray, name: str, values: list[int],
          target: float, search=None):
    """The smallest value of parameter `name` reaching `target` (or the largest tried), and its recall;
    `search(queries, k)` searches the index as it will be searched (default: the FAISS index itself)."""
    space = faiss.ParameterSpace()
    search = search or index.search
    recall = 0.0
    for value in values:
        space.set_index_parameter(index, name, value)
        recall = recall_at_10(_without_self(search(queries, 11)[1], sample), exact)
        if recall >= target:
            return value, recall
    return values[-1], recall


def build_index(vectors: np.ndarray, options: IndexOptions = IndexOptions()
                ) -> tuple[faiss.Index | Refined | CellScan, dict]:
    """A FAISS index over `vectors` [n, d] (normalized float32, in memory or memory-mapped) and a description
    of it: kind, parameters, and recall@10 against exact search on leave-one-out samples of the collection.
    With `options.refine`, the index is a `Refined` one (float16 vectors in memory)."""
    return build_streaming(Parts([vectors]), None, options)


def _exact16(parts: Parts, out: Path | None, chunk_rows: int) -> np.ndarray:
    """The vectors as float16: streamed part by part into out/vectors-f16.npy (plain writes: the file never
    sits in this process's memory) and memory-mapped back, or in memory without `out`."""
    if out is None:
        exact16 = np.empty((parts.n, parts.d), np.float16)
        for first, chunk in parts.chunks(rows=chunk_rows):
            exact16[first:first + len(chunk)] = chunk
        return exact16
    out.mkdir(parents=True, exist_ok=True)
    with staged(out / EXACT16, tmp=out / (EXACT16 + ".tmp")) as tmp, open(tmp, "wb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": False,
                  "shape": (parts.n, parts.d)}
        np.lib.format.write_array_header_1_0(f, header)
        for _, chunk in parts.chunks(rows=chunk_rows):
            f.write(np.ascontiguousarray(chunk, dtype=np.float16).tobytes())
    return np.load(out / EXACT16, mmap_mode="r")


# ---------------------------------------------------------------------------------------------- streaming

def streaming_search(parts: Parts, queries: np.ndarray, k: int, stop: int | None = None, score_bytes: int = 2**28,
                     start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Exact top k over the parts' rows [start, stop), a chunk at a time: each chunk's own top k merged into the
    running top k. A chunk's rows are bounded so that its [queries x rows] scores stay within `score_bytes`."""
    rows = int(max(4_096, min(262_144, score_bytes // (4 * max(1, len(queries))))))
    best_scores = np.full((len(queries), 0), -np.inf, np.float32)
    best_ids = np.zeros((len(queries), 0), np.int64)
    for first, chunk in parts.chunks(start, stop, rows):
        scores, ids = exact.search(chunk, queries, k)
        scores = np.concatenate([best_scores, scores], axis=1)
        ids = np.concatenate([best_ids, ids + first], axis=1)
        keep = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best_scores, best_ids = np.take_along_axis(scores, keep, 1), np.take_along_axis(ids, keep, 1)
    return best_scores, best_ids


def _ivf(d: int, nlist: int, codes: str, params: dict) -> faiss.Index:
    quantizer = faiss.IndexFlatIP(d)
    if codes == "flat":
        return faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    if codes == "sq8":  # a quarter of the memory read per probed vector: ~2x the queries/s (bench/search.py)
        return faiss.IndexIVFScalarQuantizer(quantizer, d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                             faiss.METRIC_INNER_PRODUCT)
    # pq (IndexOptions.codes is checked against its Literal when the build starts)
    m = next(m for m in (64, 48, 32, 16, 8, 4, 2, 1) if d % m == 0)
    params["pq_subquantizers"] = m
    return faiss.IndexIVFPQ(quantizer, d, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)


def _refined(index: faiss.Index, parts: Parts, out: Path | None, options: IndexOptions, params: dict):
    """`index` as it will be searched: Refined over float16 copies of the vectors with `options.refine`."""
    if not options.refine:
        return index
    params["refine"] = options.refine
    return Refined(index, _exact16(parts, out, options.chunk_rows), options.refine)


def shard_names(n_shards: int) -> list[str]:
    return [f"shard-{i:06d}.faiss" for i in range(n_shards)]


def build_streaming(parts: Parts, out: Path | None, options: IndexOptions, engine=None,
                    progress: bool = False) -> tuple:
    """An index over `parts` that never holds all vectors: exact (flat) while it fits `memory`, else IVF
    trained on a sample and filled part by part. When the IVF codes would pass half of `memory`, the rows are
    cut into contiguous blocks, each added by a task (local processes or Spark) into an IVF shard of its own
    on disk; they are searched together, memory-mapped (`open_shards`).

    Every strategy follows one plan: make the index (IVF: trained on a sample), fill it (in memory, or shard
    tasks), then tune its search parameter (HNSW's efSearch, IVF's nprobe) on leave-one-out queries against
    exact search over the rows it was tuned on."""
    check(options, spell=as_flags())
    n, d = parts.n, parts.d
    budget = options.memory or 2**62
    kind = options.kind if options.kind != "auto" else ("flat" if n <= options.exact_up_to else "ivf")
    if kind in ("flat", "hnsw") and n * d * 4 > budget:
        raise ConfigError(f"a {kind} index of {n:,} vectors needs {n * d * 4 / 2**30:.1f} GiB, over --memory "
                          f"{budget / 2**30:.1f} GiB; use --kind ivf (IVF shards on disk) or raise --memory")
    rng = np.random.default_rng(options.seed)
    params: dict = {}
    if kind == "ivf":
        index, tuning = _trained_ivf(parts, options, budget, rng, params)
        storage = "memory" if n * (index.code_size + 8) <= budget // 2 else "shards"  # a code and its id per row
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            faiss.write_index(index, str(out / TRAINED))  # the quantizer, kept for `index --add`
    else:
        index = faiss.IndexFlatIP(d) if kind == "flat" else faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        if kind == "hnsw":
            index.hnsw.efConstruction = 200
            params["M"] = 32
        tuning, storage = ("efSearch", [16, 32, 64, 128, 256, 512, 1024]), "memory"
    if storage == "memory":
        for first, chunk in parts.chunks(rows=options.chunk_rows):
            if kind == "ivf":
                index.add_with_ids(chunk, np.arange(first, first + len(chunk), dtype=np.int64))
            else:
                index.add(chunk)
        if kind == "flat":
            return index, {"kind": kind, "params": params, "recall_at_10": 1.0, "storage": storage}
        if kind == "ivf":
            index.make_direct_map()  # reconstruct(id): queries by an indexed image's id
            index = batched(index)
        tuned_rows, shards = n, []
    else:
        # tuned on the first shard alone, against exact search over its own rows: the cells are the same, and a
        # thousand queries probing every shard would map most of the index into memory
        shards, tuned_rows = _add_shards(index, parts, out, options, engine, progress)
        index = faiss.read_index(str(out / shards[0]), faiss.IO_FLAG_MMAP)
    index = _refined(index, parts, out, options, params)  # the first shard's rows are the file's first rows
    name, values = tuning
    sample = np.sort(rng.choice(tuned_rows, min(tuned_rows, options.tune_queries), replace=False))
    queries = parts.take(sample)
    truth = _without_self(streaming_search(parts, queries, 11, stop=tuned_rows)[1], sample)
    params[name], recall = _tune(faiss_of(index), queries, sample, truth, name, values, options.recall, index.search)
    info = {"kind": kind, "params": params, "recall_at_10": recall, "storage": storage}
    if storage == "memory":
        return index, info
    params["shards"] = len(shards)
    return None, info | {"shards": shards, "tuned_on": "the first shard"}


def _trained_ivf(parts: Parts, options: IndexOptions, budget: int, rng, params: dict) -> tuple[faiss.Index, tuple]:
    """An IVF index trained on a sample of `parts` (a quarter of the budget at most), and its tuning plan:
    nprobe over powers of 2 and the midpoints between them (1, 2, 3, 4, 6, 8, 12, ...)."""
    n, d = parts.n, parts.d
    nlist = max(1, min(n // 39, options.nlist or int(4 * math.sqrt(n))))  # faiss wants >= 39 training points per cell
    codes = options.codes if options.codes != "auto" else ("sq8" if n * d <= options.max_bytes else "pq")
    index = _ivf(d, nlist, codes, params)
    params["codes"], params["nlist"] = codes, nlist
    per_cell = max(39, options.train_per_cell)
    train_n = min(n, per_cell * nlist, max(39 * nlist, budget // 4 // (4 * d)))
    index.train(parts.take(np.sort(rng.choice(n, train_n, replace=False))))
    params["trained_on"] = int(train_n)
    probes = sorted({min(nlist, int(m * 2**i)) for i in range(int(math.log2(nlist)) + 2) for m in (1, 1.5)})
    return index, ("nprobe", probes)


def _add_shards(trained: faiss.Index | Path, parts: Parts, out: Path | None, options: IndexOptions, engine,
                progress: bool, first: int = 0) -> tuple[list[str], int]:
    """The rows cut into contiguous blocks, each added by a task into an IVF shard file of its own in `out`
    (resumable: finished shards of the same vectors and options are kept); the shards' names and the first
    block's rows. `trained`: the trained, empty index (or its file); `first`: the first shard's number (`index
    --add` appends shards after an index's own)."""
    from openalign.data.engine import Engine, Job, run_jobs, job_id

    if out is None:
        raise ConfigError("an index over its memory budget is written as shards: give an output directory")
    n, d = parts.n, parts.d
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    if not isinstance(trained, Path):
        faiss.write_index(trained, str(work / "trained.index"))
        trained = work / "trained.index"
    code_size = faiss.read_index(str(trained)).code_size
    engine = engine or Engine()
    workers = (engine.workers or 1) if engine.name == "local" else 1
    # half the budget holds every concurrent task's codes, after each task's own float32 chunk and its
    # process (numpy, FAISS, pyarrow: ~100 MiB; no torch in parts.py)
    budget = options.memory or 2**62
    per_task = (budget // 2 - workers * (options.chunk_rows * d * 4 + 128 * 2**20)) // max(1, workers)
    block_rows = options.block_rows or max(options.chunk_rows, per_task // (code_size + 8))
    bounds = [(a, min(a + block_rows, n)) for a in range(0, n, block_rows)]
    names = shard_names(first + len(bounds))[first:]
    for stale in out.glob("shard-*.faiss") if first == 0 else ():
        if stale.name not in names:
            stale.unlink()
    key = json.dumps([parts.fingerprint(), repr(options), first])  # the vectors' files as they are now
    jobs = [Job(job_id(i), add_shard, (str(trained), parts.files, a, b, str(out / names[i]),
                                       options.chunk_rows), key=f"{key}:{a}:{b}", outputs=(str(out / names[i]),))
            for i, (a, b) in enumerate(bounds)]
    run_jobs(jobs, work / "_status", engine, "index add", progress)
    return names, bounds[0][1]


BUILDING = "_build"  # OUT/_build: a build's files until it has succeeded (and its resumable shard tasks)


@dataclass(frozen=True)
class IndexResult:
    """An index as `build`, `grow.add` or `grow.delete` left it: its index.json (`info`), in the fields a caller
    reads."""

    out: Path  # the index directory
    kind: str  # flat (exact), ivf or hnsw
    count: int  # vectors: ids 0 .. count-1
    vectors: str  # image, or text (captions)
    params: dict  # what was tuned to the recall target (nlist, nprobe, codes, ...); {} for exact search
    recall_at_10: float  # against exact search, measured on held-out queries when the index was built
    deleted: int  # ids taken down (`index --delete`): never returned by a search
    warnings: list[str]
    info: dict  # index.json as written
    added: int = 0  # `grow.add`: vectors this call added
    kept_down: int = 0  # `grow.add`: added rows whose image was taken down before (they stay deleted)
    newly_deleted: int = 0  # `grow.delete`: ids this call took down

    @classmethod
    def of(cls, out: Path, info: dict, **changes) -> IndexResult:
        """The result for the index.json `info` of the index in `out`."""
        return cls(Path(out), info["kind"], int(info["count"]), info.get("vectors", "image"), info["params"],
                   info["recall_at_10"], int((info.get("deleted") or {}).get("count", 0)),
                   list(info.get("warnings") or []), info, **changes)


def build(emb: Path, out: Path, options: IndexOptions = IndexOptions(), engine=None,
          progress: bool = False) -> IndexResult:
    """Index the `vectors` of an embed output into `out` (see build_streaming); metadata is copied part by
    part into meta.parquet with the row ids.

    Everything is built in OUT/_build first; only a build that succeeded replaces the index in `out` (index.json
    removed first, each file renamed into place, index.json written last). So a rebuild that fails (a full disk,
    Ctrl-C) leaves the working index as it was."""
    options = expect(options, IndexOptions)
    import shutil

    emb, out = Path(emb), Path(out)
    manifest = read_manifest(emb, options.vectors)
    parts = Parts(part_files(emb, options.vectors))
    n, d = parts.n, parts.d
    if n == 0:
        raise ConfigError(f"{emb} holds no embeddings")
    staging = out / BUILDING
    taken = takedown.empty() if options.forget_deletions else _previous_takedowns(out)
    staging.mkdir(parents=True, exist_ok=True)
    try:
        index, built = build_streaming(parts, staging, options, engine, progress)
        if index is not None:
            faiss.write_index(faiss_of(index), str(staging / FILE))
        write_meta(emb, staging / META)
        if len(taken):  # the same images in the new rows stay deleted
            taken = takedown.moved(taken, staging / META)
            takedown.write(staging / takedown.file_name(0), taken)
    except BaseException:  # the working index in `out` is untouched; finished shard tasks are kept for a rerun
        for leftover in staging.iterdir():
            if leftover.is_file() and not leftover.name.startswith("shard-"):
                leftover.unlink()
        raise
    trained = (staging / TRAINED).is_file()
    info = {"kind": built["kind"], "params": built["params"], "recall_at_10": built["recall_at_10"],
            "recall_target": options.recall, "count": n, "dim": d, "vectors": options.vectors,
            "storage": built["storage"], "shards": built.get("shards", []), "tuned_on": built.get("tuned_on", "all"),
            "embeddings": str(Path(emb).resolve()), "model": manifest["model"], "weights": manifest.get("weights", ""),
            "generation": 0, "files": {role: FILES[role] for role in ("index", "meta", "exact16")},
            "trained": TRAINED if trained else None, "parts": part_records(emb, options.vectors),
            "options": {"chunk_rows": options.chunk_rows, "tune_queries": options.tune_queries, "seed": options.seed}}
    if len(taken):
        info["deleted"] = takedown.entry(takedown.file_name(0), taken)
    info["warnings"] = recall_warnings(info)
    new = [FILE] * (index is not None) + built.get("shards", []) + [EXACT16] * bool(built["params"].get("refine")) \
        + [TRAINED] * trained + [takedown.file_name(0)] * bool(len(taken))
    unfinish(out / INFO)  # from here until index.json is written, `out` is not an index: load says so
    for stale in [*generation_files(out), *out.glob("shard-*.faiss")]:
        if stale.name not in new:
            stale.unlink(missing_ok=True)  # a previous build's (or add's)
    for name in new + [META]:
        place(staging / name, out / name)
    write_json(out / INFO, info)
    shutil.rmtree(staging, ignore_errors=True)
    return IndexResult.of(out, info)


def _previous_takedowns(out: Path) -> pa.Table:
    """The images taken down from the index a build will replace in `out` (none when there is none): those its
    index.json names, and those of a rebuild killed after it removed index.json (its take-down file, in `out` or
    still in `out/_build`), so that no rebuild brings one back."""
    leftovers = [f for d in (out / BUILDING, out) for f in sorted(d.glob("deleted-g*.parquet"))] \
        if out.is_dir() else []
    tables = []
    if (out / INFO).is_file():
        info = read_info(out)
        try:
            tables.append(takedown.read(out, info, out / file_of(info, "meta")))
        except (OSError, ValueError, pa.ArrowException) as err:
            raise ConfigError(f"{out} has {(info.get('deleted') or {}).get('count', 0):,} deleted ids (index "
                              f"--delete), but its files no longer tell which images they are ({str(err)[:120]}); "
                              "rebuild with --forget-deletions to drop them, or restore the index") from None
        leftovers = [f for f in leftovers if f.parent != out]  # an index.json names its own
    elif any(out.glob("deleted-g*.npy")):
        raise ConfigError(f"{out} holds deleted ids (index --delete) but no {INFO} to tell which images they are; "
                          "rebuild with --forget-deletions to drop them, or restore the index")
    for leftover in leftovers:
        try:
            tables.append(pq.read_table(leftover))
        except (OSError, pa.ArrowException):
            raise ConfigError(f"{leftover} (an interrupted rebuild's take-downs) is damaged; rebuild with "
                              "--forget-deletions to drop them") from None
    return takedown.merged(*tables) if tables else takedown.empty()


def generation_files(out: Path) -> list[Path]:
    """Every file of any generation of an index in `out` (a build's names, and `index --add` / `--delete`'s)."""
    names = [FILE, META, EXACT16, TRAINED, "index-g*.faiss", "meta-g*.parquet", "vectors-f16-g*.npy",
             *takedown.PATTERNS]
    return [f for name in names for f in (out.glob(name) if "*" in name else [out / name])]


def part_records(emb: Path, vectors: str = "image") -> list[list]:
    """[part index, rows, digest] of each part of an embed output, in order: what an index holds, so that `index
    --add` can tell the parts it has (unchanged) from new ones. The digest covers the part's plan and inputs."""
    import hashlib

    manifest = read_manifest(emb, vectors)
    records = []
    for i in sorted(manifest["parts"], key=int):
        try:
            status = json.loads((Path(emb) / f"part-{int(i):06d}.json").read_text())
        except (OSError, ValueError):
            status = {}
        digest = hashlib.blake2b(json.dumps([status.get("plan"), status.get("inputs")]).encode(),
                                 digest_size=8).hexdigest()
        records.append([int(i), int(manifest["parts"][i]["rows"]), digest])
    return records


def recall_warnings(info: dict) -> list[str]:
    """A sentence when the tuned index falls short of its recall target, with what to change: the search
    parameter was raised as far as it goes, so the codes (or the graph) are the limit."""
    if info["recall_at_10"] >= info["recall_target"]:
        return []
    params = info["params"]
    if info["kind"] == "hnsw":
        fix = "build it with --kind ivf --codes flat, or lower --recall"
        reached = f"efSearch {params.get('efSearch')}"
    else:
        fix = ("the 8-bit or PQ codes are the limit: build with --refine 2 (float16 re-scoring of the shortlist) or "
               "--codes flat, or lower --recall") if params.get("codes") != "flat" \
            else "raise --nlist, or lower --recall"
        reached = f"nprobe {params.get('nprobe')} of nlist {params.get('nlist')}"
    return [f"recall@10 {info['recall_at_10']:.3f} is below the target {info['recall_target']} even at {reached} "
            f"(the most tried); {fix}"]


def write_meta(emb: Path, path: Path) -> None:
    """meta.parquet: every part's metadata with its row id, streamed part by part (row groups of a part)."""
    manifest = read_manifest(emb)
    first = 0
    tmp = path.with_name(path.name + ".tmp")
    writer = None
    for i in sorted(manifest["parts"], key=int):
        table = pq.read_table(Path(emb) / f"meta-{int(i):06d}.parquet")
        table = table.add_column(0, "id", pa.array(np.arange(first, first + len(table)), pa.int64()))
        writer = writer or pq.ParquetWriter(tmp, table.schema)
        writer.write_table(table, row_group_size=65_536)
        first += len(table)
    writer.close()
    place(tmp, path)


