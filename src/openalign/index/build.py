"""`openalign index`: a FAISS index over `openalign embed` output, tuned to a recall target.

    INDEX/index.faiss      the FAISS index (inner product = cosine: the embeddings are normalized)
    INDEX/meta.parquet     id, key, path, caption, width, height (read with DuckDB or pyarrow)
    INDEX/index.json       kind, search parameters, the recall@10 measured against exact search, counts

Kinds: `flat` (exact), `ivf` (inverted lists over k-means cells; product-quantized codes when the
vectors would not fit `max_flat_bytes`), `hnsw` (a graph). `auto` is exact up to `exact_up_to` vectors
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
from openalign.index.embed import load as load_embeddings

KINDS = ("auto", "flat", "ivf", "hnsw")
FILE, META, INFO = "index.faiss", "meta.parquet", "index.json"


@dataclass(frozen=True)
class IndexOptions:
    kind: str = "auto"
    recall: float = 0.95  # recall@10 target of approximate indexes, against exact search
    exact_up_to: int = 200_000  # auto: exact search up to this many vectors
    max_flat_bytes: int = 8 * 2**30  # ivf: uncompressed vectors up to this size, product quantization beyond
    tune_queries: int = 1_000
    seed: int = 0


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


def build(emb: Path, out: Path, options: IndexOptions = IndexOptions()) -> dict:
    if options.kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, not {options.kind!r}")
    vectors, meta = load_embeddings(emb)
    n, d = vectors.shape
    if n == 0:
        raise ConfigError(f"{emb} holds no embeddings")
    kind = options.kind if options.kind != "auto" else ("flat" if n <= options.exact_up_to else "ivf")
    rng = np.random.default_rng(options.seed)
    sample = rng.choice(n, min(n, options.tune_queries), replace=False)
    queries = vectors[sample]
    exact = faiss.IndexFlatIP(d)
    exact.add(vectors)
    params: dict = {}
    if kind == "flat":
        index, recall = exact, 1.0
    else:
        truth = _without_self(exact.search(queries, 11)[1], sample)
        if kind == "ivf":
            nlist = max(1, min(n // 39, int(4 * math.sqrt(n))))  # faiss wants >= 39 training points per cell
            quantizer = faiss.IndexFlatIP(d)
            if n * d * 4 <= options.max_flat_bytes:
                index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            else:
                m = next(m for m in (64, 48, 32, 16, 8, 4, 2, 1) if d % m == 0)
                index = faiss.IndexIVFPQ(quantizer, d, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
                params["pq_subquantizers"] = m
            train = vectors[rng.choice(n, min(n, 256 * nlist), replace=False)]
            index.train(train)
            index.add(vectors)
            probes = sorted({min(nlist, 2**i) for i in range(int(math.log2(nlist)) + 2)})
            params["nlist"] = nlist
            params["nprobe"], recall = _tune(index, queries, sample, truth, "nprobe", probes,
                                                 options.recall)
        else:
            index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 200
            index.add(vectors)
            params["M"] = 32
            params["efSearch"], recall = _tune(index, queries, sample, truth, "efSearch",
                                                   [16, 32, 64, 128, 256, 512, 1024], options.recall)
    out.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out / FILE))
    pq.write_table(meta, out / META)
    manifest = json.loads((Path(emb) / "manifest.json").read_text())
    info = {"kind": kind, "params": params, "recall_at_10": recall, "recall_target": options.recall, "count": n,
            "dim": d, "embeddings": str(emb), "model": manifest["model"], "weights": manifest.get("weights", "")}
    (out / INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


@dataclass
class Loaded:
    index: faiss.Index
    meta: "object"  # pyarrow.Table
    info: dict


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
