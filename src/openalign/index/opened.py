"""An index opened for search (`load` -> `Loaded`): its files as index.json names them, memory-mapped where FAISS
can, its metadata read by row id on demand, and the rows `index --delete` took down left out of every search.
index.json is checked before anything is opened: a damaged or crafted one is one sentence, and names no file outside
the index's directory.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from openalign.config import ConfigError
from openalign.index import exact, takedown
from openalign.index.cells import CellScan

__all__ = ["Loaded", "load", "read_info"]

FILE, META, INFO, EXACT16 = "index.faiss", "meta.parquet", "index.json", "vectors-f16.npy"
TRAINED = "trained.faiss"  # IVF: the trained, empty index (its quantizer), for `index --add` to new shards
FILES = {"index": FILE, "meta": META, "exact16": EXACT16}  # index.json "files": a generation's names (grow.py)


def file_of(info: dict, role: str) -> str:
    """The file of `role` (index, meta, exact16) of the generation index.json describes: `index --add` writes a new
    generation's files under new names and index.json names them, so a reader never sees half of a change."""
    return (info.get("files") or {}).get(role, FILES[role])


class Refined:
    """An approximate index whose shortlist of `factor`·k candidates is re-scored with the exact vectors,
    stored as float16 (`exact16`: an array or a read-only memory map, [n, d]); row ids as the index's."""

    def __init__(self, index: faiss.Index, exact16: np.ndarray, factor: int):
        self.index, self.exact16, self.factor = index, exact16, factor

    @property
    def ntotal(self) -> int:
        return self.exact16.shape[0]

    def search(self, queries: np.ndarray, k: int, params=None) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        _, ids = self.index.search(queries, max(k, self.factor * k), params=params)
        found = ids >= 0  # fewer candidates than asked: FAISS pads with -1
        rows = np.sort(np.unique(ids[found]))  # each candidate's vector read once, in file order
        vectors = np.asarray(self.exact16[rows], dtype=np.float32)
        at = np.searchsorted(rows, np.where(found, ids, rows[0] if len(rows) else 0))
        scores = (vectors[at] @ queries[:, :, None])[..., 0] if len(rows) else np.zeros(ids.shape, np.float32)
        scores = np.where(found, scores, -np.inf).astype(np.float32)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, order, 1), np.where(np.take_along_axis(found, order, 1),
                                                               np.take_along_axis(ids, order, 1), -1)

    def reconstruct(self, i: int) -> np.ndarray:
        return np.asarray(self.exact16[i], dtype=np.float32)


def faiss_of(index) -> faiss.Index:
    """The FAISS index inside a Refined or cell-scanned one."""
    while isinstance(index, (Refined, CellScan)):
        index = index.index
    return index


def batched(index: faiss.Index):
    """Float32 cells are searched cell-major in batches (cells.py: ~4x FAISS's own search at 1,024 queries)."""
    return CellScan(index) if isinstance(index, faiss.IndexIVFFlat) else index


def open_shards(path: Path, names: list[str], d: int) -> tuple[faiss.Index, list]:
    """IVF shards (contiguous row ranges, in order) searched together: FAISS's IndexShards searches each
    memory-mapped shard and merges their top k exactly; ids are shifted to row ids of the whole. Returns
    the shards too: they must outlive the IndexShards, which does not own them."""
    shards = faiss.IndexShards(d, True, True)  # threaded, successive ids
    members = [faiss.read_index(str(path / name), faiss.IO_FLAG_MMAP) for name in names]
    for member in members:
        shards.add_shard(member)
    return shards, members


class Meta:
    """meta.parquet read by row id on demand, a row group at a time (a few cached): a 160M-row table is
    never loaded whole by search or serve.

    Safe for a service's request threads: pyarrow's `ParquetFile` is not (two threads reading row groups of
    one file corrupt its read cache: `ArrowInvalid: ReadRangeCache did not find matching cache entry`, then a
    crash in libparquet), so every read of the file and every change of the cache holds one lock. A cached
    row group is an immutable Arrow table, used outside the lock."""

    def __init__(self, path: Path, cached_groups: int = 8):
        self.file = pq.ParquetFile(path)
        sizes = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.cache: dict[int, pa.Table] = {}
        self.cached_groups = cached_groups
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _group(self, g: int) -> pa.Table:
        with self.lock:
            table = self.cache.get(g)
            if table is None:
                if len(self.cache) >= self.cached_groups:
                    self.cache.pop(next(iter(self.cache)))
                table = self.cache[g] = self.file.read_row_group(g)
            return table

    def take(self, ids: list[int]) -> pa.Table:
        """Rows `ids` in that order: each row group read once, its rows taken together (10,000 rows of a service's
        large k cost one `take` per group, not a slice each)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return self.file.schema_arrow.empty_table()
        groups = np.searchsorted(self.starts, ids, side="right") - 1
        pieces, order = [], []
        for g in np.unique(groups):
            at = np.nonzero(groups == g)[0]
            pieces.append(self._group(int(g)).take(pa.array(ids[at] - self.starts[g])))
            order.append(at)
        table = pa.concat_tables(pieces)
        return table.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))

    def row(self, i: int) -> dict:
        return self.take([i]).to_pylist()[0]

    def to_pylist(self) -> list[dict]:
        with self.lock:
            return self.file.read().to_pylist()


@dataclass
class Loaded:
    index: faiss.Index | Refined | CellScan
    meta: Meta
    info: dict
    shards: list = field(default_factory=list)  # an IndexShards' members, kept alive here
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted ids `index --delete` removed

    def is_deleted(self, i: int) -> bool:
        at = int(np.searchsorted(self.deleted, i))
        return at < len(self.deleted) and int(self.deleted[at]) == i

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and row ids [q, k] (-1 past the rows there are), deleted ids never among them: the search asks
        for more than k while deleted ones are among the first, growing 4x a time."""
        if not len(self.deleted):
            return self._search(queries, k)
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.info["dim"])
        live = self.index.ntotal - len(self.deleted)
        want = min(self.index.ntotal, k + min(len(self.deleted), 4 * k))
        while True:
            scores, ids = self._search(queries, want)
            keep = ~np.isin(ids, self.deleted) & (ids >= 0)
            enough = keep.sum(axis=1) >= min(k, live)
            if enough.all() or want >= self.index.ntotal:
                break
            want = min(self.index.ntotal, 4 * want)
        out_s = np.full((len(queries), k), -np.inf, np.float32)
        out_i = np.full((len(queries), k), -1, np.int64)
        for q in range(len(queries)):
            row = np.nonzero(keep[q])[0][:k]
            out_s[q, :len(row)], out_i[q, :len(row)] = scores[q, row], ids[q, row]
        return out_s, out_i

    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and row ids [q, k]; a flat index is searched by `exact.search` (faster than FAISS's
        own at every batch size: P7) over its vectors in place."""
        if isinstance(self.index, faiss.IndexFlat):
            n, d = self.index.ntotal, self.index.d
            if n == 0:
                return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
            vectors = faiss.rev_swig_ptr(self.index.get_xb(), n * d).reshape(n, d)
            return exact.search(vectors, queries, k)
        probes = self._probes_for(k * (self.index.factor if isinstance(self.index, Refined) else 1))
        if probes:
            return self.index.search(queries, k, params=faiss.SearchParametersIVF(nprobe=probes))
        return self.index.search(queries, k)

    def _probes_for(self, k: int) -> int | None:
        """For a large k (a service's 10,000 results), the IVF cells to probe so that they hold about 4k vectors:
        the tuned nprobe's cells hold nprobe x n / nlist, a few hundred for a recall@10 target, and FAISS returns
        only what the probed cells hold. Passed per search (thread-safe); None while the tuned nprobe suffices."""
        ivf = faiss.try_extract_index_ivf(faiss_of(self.shards[0] if self.shards else self.index))
        if ivf is None or not self.index.ntotal:
            return None
        per_cell = self.index.ntotal / ivf.nlist
        nprobe = int(self.info["params"].get("nprobe", ivf.nprobe))
        if nprobe * per_cell >= 4 * k:
            return None
        return int(min(ivf.nlist, max(nprobe, math.ceil(4 * k / per_cell))))

    def vector(self, i: int) -> np.ndarray:
        """The indexed vector of row `i` (as stored: 8-bit codes come back to within their step, a refined
        index's float16 copies to within float16's)."""
        if isinstance(self.index, Refined):
            return self.index.reconstruct(i)
        if self.shards:
            starts = np.cumsum([0] + [s.ntotal for s in self.shards])
            shard = int(np.searchsorted(starts, i, side="right") - 1)
            return self.shards[shard].reconstruct(int(i - starts[shard]))
        return self.index.reconstruct(i)


def _again(path: Path) -> str:
    return "build the index again with `openalign index EMB --out " + str(path) + "`"


def read_info(path: Path) -> dict:
    """An index's index.json, checked: a directory without one, or with a damaged one, is one sentence."""
    path = Path(path)
    if not (path / INFO).is_file():
        raise ConfigError(f"{path} is not an `openalign index` output (no {INFO}): an index build that did not "
                          "finish leaves none; run `openalign index` again")
    try:
        info = json.loads((path / INFO).read_text())
        problem = _damage(info)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's parser
        problem = "it is not JSON"
    if problem:
        raise ConfigError(f"{path / INFO} is damaged ({problem}); {_again(path)}")
    return info


INDEX_KINDS = ("flat", "ivf", "hnsw")
COUNTED_PARAMS = ("nprobe", "efSearch", "refine", "nlist", "shards", "M", "pq_subquantizers", "trained_on")


def plain_name(name) -> bool:
    """A file name an index may hold: a plain name inside its directory, never a path (`../x`, `/etc/x`, `a/b`)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name \
        and "\0" not in name


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _damage(info) -> str:
    """What is wrong with an index.json, or "" when it is what `openalign index` writes: every value this package
    reads has its type, and every file it names is a plain name inside the index's directory (so a crafted one can
    make openalign read or remove nothing outside it)."""
    if not isinstance(info, dict):
        return "not a JSON object"
    if info.get("kind") not in INDEX_KINDS:
        return f"its kind is not one of {', '.join(INDEX_KINDS)}"
    for key in ("dim", "count"):
        if not _count(info.get(key)):
            return f"its {key} is not a whole number"
    params = info.get("params")
    if not isinstance(params, dict):
        return "its params are not an object"
    wrong = [k for k in COUNTED_PARAMS if k in params and not _count(params[k])]
    if wrong:
        return f"its params.{wrong[0]} is not a whole number"
    if not isinstance(info.get("recall_at_10", 0), (int, float)) or isinstance(info.get("recall_at_10"), bool):
        return "its recall_at_10 is not a number"
    if not _count(info.get("generation", 0)):
        return "its generation is not a whole number"
    named = []
    files = info.get("files") or {}
    if not isinstance(files, dict) or set(files) - set(FILES):
        return f"its files must map {', '.join(FILES)} to file names"
    named += [(f"files.{role}", name) for role, name in files.items()]
    shards = info.get("shards") or []
    if not isinstance(shards, list):
        return "its shards are not a list"
    named += [("shards", name) for name in shards]
    if info.get("trained") is not None:
        named.append(("trained", info["trained"]))
    deleted = info.get("deleted")
    if deleted is not None:
        if not isinstance(deleted, dict) or not _count(deleted.get("count")):
            return "its deleted entry is not {\"file\": ..., \"count\": ...}"
        named.append(("deleted.file", deleted.get("file")))
    for where, name in named:
        if not plain_name(name):
            return (f"its {where} is {str(name)[:80]!r}, not a plain file name: an index names only files inside its "
                    "own directory")
    if not isinstance(info.get("parts", []), (list, type(None))):
        return "its parts are not a list"
    return ""


def load(path: Path, mmap: bool = True, info: dict | None = None) -> Loaded:
    """The index memory-mapped where FAISS can (in-memory inverted lists and flat vectors are mapped from
    index.faiss; IVF shards from shard-*.faiss, searched together), its metadata by id, and search parameters.
    `info`: the generation to load (default: the one index.json names; `index --add` checks a new one first)."""
    path = Path(path)
    info = read_info(path) if info is None else info
    again = _again(path)
    dim, count, params = int(info["dim"]), int(info["count"]), dict(info["params"])
    shards = list(info.get("shards") or [])
    members: list = []
    try:
        if info.get("storage") == "shards":
            index, members = open_shards(path, shards, dim)
        else:
            try:
                index = faiss.read_index(str(path / file_of(info, "index")), faiss.IO_FLAG_MMAP if mmap else 0)
            except RuntimeError:  # this index type cannot be mapped: read it
                index = faiss.read_index(str(path / file_of(info, "index")))
    except RuntimeError:  # FAISS's reader: a missing, cut or foreign file
        raise ConfigError(f"{path}'s FAISS index file is missing or damaged; {again}") from None
    if index.ntotal != count or index.d != dim:
        raise ConfigError(f"{path}'s FAISS index holds {index.ntotal:,} vectors of {index.d} dimensions, but {INFO} "
                          f"says {count:,} of {dim}: the files are of different builds; {again}")
    space = faiss.ParameterSpace()
    for name in ("nprobe", "efSearch"):
        if name in params:
            space.set_index_parameter(index, name, params[name])
    if not members:
        index = batched(index)
    if params.get("refine"):
        exact_file = path / file_of(info, "exact16")
        if not exact_file.is_file():
            raise ConfigError(f"{path} was built with --refine but its {exact_file.name} is missing; build the index "
                              "again")
        try:
            exact16 = np.load(exact_file, mmap_mode="r")
        except (OSError, ValueError):
            raise ConfigError(f"{exact_file} is damaged; {again}") from None
        if exact16.shape != (count, dim):
            raise ConfigError(f"{exact_file} holds {exact16.shape} vectors, not ({count}, {dim}); {again}")
        index = Refined(index, exact16, params["refine"])
    meta_file = path / file_of(info, "meta")
    try:
        meta = Meta(meta_file)
    except (OSError, pa.ArrowException):
        raise ConfigError(f"{meta_file} is missing or damaged; {again}") from None
    if len(meta) != count:
        raise ConfigError(f"{meta_file} has {len(meta):,} rows for {count:,} vectors; {again}")
    try:
        deleted = takedown.ids(path, info)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        raise ConfigError(f"{path}'s list of deleted ids is missing or damaged; {again}") from None
    return Loaded(index, meta, info, members, deleted)
