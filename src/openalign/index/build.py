"""`openalign index`: a FAISS index over `openalign embed` output, tuned to a recall target.

    INDEX/index.faiss      the FAISS index (inner product = cosine: the embeddings are normalized)
    INDEX/meta.parquet     id, key, path, caption, width, height (read with DuckDB or pyarrow)
    INDEX/index.json       kind, search parameters, the recall@10 measured against exact search, counts

Kinds: `flat` (exact), `ivf` (inverted lists over k-means cells; vectors stored as 8-bit codes, or
product-quantized when those would not fit `max_bytes`; `codes=flat` keeps float32), `hnsw` (a graph). `auto` is exact up to `exact_up_to` vectors
and IVF beyond. Approximate indexes are tuned on a sample of the collection's own vectors as queries:
the smallest nprobe / efSearch whose recall@10 against exact search reaches the target, each
query's own vector left out. Queries from the other modality (texts against images) sit elsewhere
in the space than the indexed vectors; raise `--recall` if their measured recall falls short.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq

from openalign.config import ConfigError
from openalign.index import exact
from openalign.index.embed import load as load_embeddings

KINDS = ("auto", "flat", "ivf", "hnsw")
CODES = ("auto", "flat", "sq8", "pq")
FILE, META, INFO = "index.faiss", "meta.parquet", "index.json"


@dataclass(frozen=True)
class IndexOptions:
    kind: str = "auto"
    recall: float = 0.95  # recall@10 target of approximate indexes, against exact search
    exact_up_to: int = 200_000  # auto: exact search up to this many vectors
    codes: str = "auto"  # ivf: flat (float32) | sq8 (8-bit per dimension) | pq | auto: sq8, pq beyond max_bytes
    max_bytes: int = 8 * 2**30  # ivf auto: 8-bit codes up to this size, product quantization beyond
    nlist: int = 0  # ivf: k-means cells; 0: 4 sqrt(n) (FAISS's rule of thumb)
    train_per_cell: int = 64  # ivf: k-means training points per cell (FAISS warns below 39, caps at 256)
    tune_queries: int = 1_000
    seed: int = 0
    vectors: str = "image"  # image | text (captions embedded by `openalign embed --texts`)


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact top 10 that `found` [Q, 10] contains."""
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist())]))


def _without_self(ids: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """[Q, 10] of [Q, 11] results with each query's own vector removed (leave-one-out tuning: a query
    that is itself indexed would find its own cell and overstate recall)."""
    return np.stack([[i for i in row if i != own][:10] for row, own in zip(ids.tolist(), sample.tolist())])


def _tune(index, queries: np.ndarray, sample: np.ndarray, exact: np.ndarray, name: str, values: list[int],
          target: float):
    """The smallest value of parameter `name` reaching `target` (or the largest tried), and its recall."""
    space = faiss.ParameterSpace()
    recall = 0.0
    for value in values:
        space.set_index_parameter(index, name, value)
        recall = recall_at_10(_without_self(index.search(queries, 11)[1], sample), exact)
        if recall >= target:
            return value, recall
    return values[-1], recall


def build_index(vectors: np.ndarray, options: IndexOptions = IndexOptions()) -> tuple[faiss.Index, dict]:
    """A FAISS index over `vectors` [n, d] (normalized float32) and a description of it: kind,
    parameters, and recall@10 against exact search on leave-one-out samples of the collection."""
    if options.kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, not {options.kind!r}")
    n, d = vectors.shape
    kind = options.kind if options.kind != "auto" else ("flat" if n <= options.exact_up_to else "ivf")
    params: dict = {}
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
        index.add(vectors)
        return index, {"kind": kind, "params": params, "recall_at_10": 1.0}
    rng = np.random.default_rng(options.seed)
    sample = rng.choice(n, min(n, options.tune_queries), replace=False)
    queries = np.ascontiguousarray(vectors[sample])
    truth = _without_self(exact.search(vectors, queries, 11)[1], sample)
    if kind == "ivf":
        nlist = options.nlist or int(4 * math.sqrt(n))
        nlist = max(1, min(n // 39, nlist))  # faiss wants >= 39 training points per cell
        quantizer = faiss.IndexFlatIP(d)
        codes = options.codes if options.codes != "auto" else ("sq8" if n * d <= options.max_bytes else "pq")
        if codes == "flat":
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        elif codes == "sq8":  # a quarter of the memory read per probed vector: ~2x the queries/s (bench/search.py)
            index = faiss.IndexIVFScalarQuantizer(quantizer, d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                                  faiss.METRIC_INNER_PRODUCT)
        elif codes == "pq":
            m = next(m for m in (64, 48, 32, 16, 8, 4, 2, 1) if d % m == 0)
            index = faiss.IndexIVFPQ(quantizer, d, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
            params["pq_subquantizers"] = m
        else:
            raise ConfigError(f"--codes must be one of {', '.join(CODES)}, not {options.codes!r}")
        params["codes"] = codes
        per_cell = max(39, options.train_per_cell)
        index.train(np.ascontiguousarray(vectors[np.sort(rng.choice(n, min(n, per_cell * nlist), replace=False))]))
        for start in range(0, n, 262_144):  # in slices: a memory map is read once, never copied whole
            index.add(np.ascontiguousarray(vectors[start:start + 262_144]))
        index.make_direct_map()  # reconstruct(id): queries by an indexed image's id
        # powers of 2 and the midpoints between them (1, 2, 3, 4, 6, 8, 12, ...): recall moves fast with nprobe
        probes = sorted({min(nlist, int(m * 2**i)) for i in range(int(math.log2(nlist)) + 2) for m in (1, 1.5)})
        params["nlist"] = nlist
        params["nprobe"], recall = _tune(index, queries, sample, truth, "nprobe", probes, options.recall)
    else:
        index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 200
        index.add(vectors)
        params["M"] = 32
        params["efSearch"], recall = _tune(index, queries, sample, truth, "efSearch",
                                           [16, 32, 64, 128, 256, 512, 1024], options.recall)
    return index, {"kind": kind, "params": params, "recall_at_10": recall}


def build(emb: Path, out: Path, options: IndexOptions = IndexOptions()) -> dict:
    vectors, meta = load_embeddings(emb, options.vectors)
    n, d = vectors.shape
    if n == 0:
        raise ConfigError(f"{emb} holds no embeddings")
    index, built = build_index(vectors, options)
    kind, params, recall = built["kind"], built["params"], built["recall_at_10"]
    out.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out / FILE))
    pq.write_table(meta, out / META)
    manifest = json.loads((Path(emb) / "manifest.json").read_text())
    info = {"kind": kind, "params": params, "recall_at_10": recall, "recall_target": options.recall, "count": n,
            "dim": d, "embeddings": str(Path(emb).resolve()), "model": manifest["model"], "weights": manifest.get("weights", "")}
    (out / INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


@dataclass
class Loaded:
    index: faiss.Index
    meta: "object"  # pyarrow.Table
    info: dict

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and row ids [q, k]; a flat index is searched by `exact.search` (faster than FAISS's
        own at every batch size: P7) over its vectors in place."""
        if isinstance(self.index, faiss.IndexFlat):
            n, d = self.index.ntotal, self.index.d
            if n == 0:
                return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
            vectors = faiss.rev_swig_ptr(self.index.get_xb(), n * d).reshape(n, d)
            return exact.search(vectors, queries, k)
        return self.index.search(queries, k)


def load(path: Path, mmap: bool = True) -> Loaded:
    """The index (memory-mapped where FAISS can), its metadata and search parameters."""
    path = Path(path)
    if not (path / INFO).is_file():
        raise ConfigError(f"{path} is not an `openalign index` output (no {INFO})")
    info = json.loads((path / INFO).read_text())
    try:
        index = faiss.read_index(str(path / FILE), faiss.IO_FLAG_MMAP if mmap else 0)
    except RuntimeError:  # this index type cannot be mapped: read it
        index = faiss.read_index(str(path / FILE))
    space = faiss.ParameterSpace()
    for name in ("nprobe", "efSearch"):
        if name in info["params"]:
            space.set_index_parameter(index, name, info["params"][name])
    return Loaded(index, pq.read_table(path / META), info)
