"""Embedding parts on disk, read without loading them: what the index build and its add tasks share.

Kept free of torch, so that an add task's process (a local worker or a Spark executor) holds only numpy,
FAISS and its codes.
"""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np

from openalign.config import ConfigError
from openalign.outputs import staged

MANIFEST = "manifest.json"
VECTORS = {"image": "part", "text": "text"}
PATCHES = "patch"  # patch-000000.npy: [n, P, D] float16 patch vectors (embed --patches), for re-ranking


def read_manifest(emb: Path, vectors: str = "image") -> dict:
    manifest = json.loads((Path(emb) / MANIFEST).read_text()) if (Path(emb) / MANIFEST).is_file() else {}
    if not manifest.get("complete"):
        raise ConfigError(f"{emb} is not a finished `openalign embed` output; run (or rerun) openalign embed")
    if vectors not in VECTORS:
        raise ConfigError(f"--vectors must be image or text, not {vectors!r}")
    if vectors == "text" and not manifest.get("texts"):
        raise ConfigError(f"{emb} holds no caption embeddings; embed again with --texts")
    return manifest


def part_files(emb: Path, vectors: str = "image") -> list[Path]:
    """The vector files of a finished embed output, in part order."""
    manifest = read_manifest(emb, vectors)
    return [Path(emb) / f"{VECTORS[vectors]}-{int(i):06d}.npy" for i in sorted(manifest["parts"], key=int)]



class Parts:
    """The vector parts of an embed output, memory-mapped (float16 or float32 on disk), read in float32
    chunks: nothing ever holds all the vectors."""

    def __init__(self, files: list):
        self.files = [f if isinstance(f, np.ndarray) else str(f) for f in files]  # .npy paths, or arrays
        arrays = [self._array(i) for i in range(len(self.files))]
        self.sizes = [len(a) for a in arrays]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self.d = int(arrays[0].shape[1]) if arrays else 0
        shaped = [a for a in arrays if len(a)] or arrays
        self.row_shape = tuple(shaped[0].shape[1:]) if arrays else (0,)  # (d,), or (patches, d): patch vectors
        self.itemsize = arrays[0].dtype.itemsize if arrays else 4

    def fingerprint(self) -> list:
        """What the vectors are now: each file's path, size and modification time (an array: its shape and a
        hash of its bytes), for the keys of work that reads them."""
        import hashlib

        return [[f.shape, hashlib.blake2b(np.ascontiguousarray(f).tobytes(), digest_size=16).hexdigest()]
                if isinstance(f, np.ndarray) else [f, Path(f).stat().st_size, Path(f).stat().st_mtime_ns]
                for f in self.files]

    def _array(self, i: int) -> np.ndarray:
        f = self.files[i]
        return f if isinstance(f, np.ndarray) else np.load(f, mmap_mode="r")

    def chunks(self, start: int = 0, stop: int | None = None, rows: int = 65_536):
        """(first row id, float32 [m, d]) over rows [start, stop), part by part."""
        stop = self.n if stop is None else stop
        for i in range(len(self.files)):
            lo, hi = max(start, int(self.offsets[i])), min(stop, int(self.offsets[i + 1]))
            if lo >= hi:
                continue
            array = self._array(i)
            for a in range(lo, hi, rows):
                b = min(a + rows, hi)
                off = int(self.offsets[i])
                yield a, np.ascontiguousarray(array[a - off:b - off], dtype=np.float32)

    def take(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows `ids` (any order)."""
        out = np.empty((len(ids), *self.row_shape), np.float32)
        part = np.searchsorted(self.offsets, ids, side="right") - 1
        for i in np.unique(part):
            rows = np.nonzero(part == i)[0]
            array = self._array(i)
            out[rows] = array[ids[rows] - self.offsets[i]]
        return out


def add_shard(trained: str, files: list[str], start: int, stop: int, shard: str, chunk_rows: int) -> dict:
    """One add task: rows [start, stop) into a copy of the trained, empty index, written as one IVF shard
    (with its direct map, for queries by id)."""
    index = faiss.read_index(trained)
    for _, chunk in Parts(files).chunks(start, stop, chunk_rows):
        index.add(chunk)
    index.make_direct_map()
    with staged(Path(shard), tmp=Path(shard + ".tmp")) as tmp:
        faiss.write_index(index, str(tmp))
    return {"rows": stop - start}


