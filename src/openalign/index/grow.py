"""Growing an index: `openalign index --add EMB INDEX` appends the embed output's new parts, `openalign index
--delete IDS INDEX` takes ids out of every search.

An index records the embed parts it holds (index.json `parts`: index, rows and a digest of each part's plan and
inputs). `embed` keeps parts append-only, so a collection that grew has the same first parts and new ones after
them: `--add` checks that the recorded parts are unchanged and adds the rest, its ids continuing from the index's
count. A flat index takes the vectors as they are; an IVF index keeps its trained quantizer (the new vectors go
into its cells, or into new shards beside the old ones); HNSW adds them to its graph. The metadata is appended.

Then the drift check: recall@10 of the index's own search parameter, measured as the build tuned it (leave-one-out
queries sampled from the new rows, against exact search), is compared with the figure recorded at the build; a fall
of more than `DRIFT` means the new data sits where the quantizer's training sample did not, and one sentence says
so and what to do (rebuild, which trains the cells again).

Atomic, with no half state: a change writes the files of a new generation under new names (index-g2.faiss,
meta-g2.parquet, vectors-f16-g2.npy, new shard files, deleted-g2.parquet), then replaces index.json, which names them;
only then are the previous generation's files removed. A kill -9 at any point leaves index.json naming a complete
generation: the old one, or the new. A rerun writes the same names again, byte for byte. A running `serve` loads the
new generation at its next request (serve/catalog.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from openalign.config import ConfigError
from openalign.index import build, opened, takedown
from openalign.index.parts import Parts, part_files, read_manifest
from openalign.outputs import staged, write_json

__all__ = ["add", "delete"]

DRIFT = 0.02  # recall@10 below the recorded figure by more than this: the new data has drifted
WORK = "_work"  # INDEX/_work: an add's resumable shard tasks (build._add_shards)


def _rebuild(index_dir: Path, emb: Path) -> str:
    return f"rebuild it with `openalign index {emb} --out {index_dir}`"


def _generation_names(gen: int) -> dict:
    return {"index": f"index-g{gen}.faiss", "meta": f"meta-g{gen}.parquet", "exact16": f"vectors-f16-g{gen}.npy"}


def _new_parts(emb: Path, index_dir: Path, info: dict) -> list[list]:
    """The embed output's part records after those the index holds, which must be unchanged."""
    vectors = info.get("vectors", "image")
    manifest = read_manifest(emb, vectors)
    if info.get("weights") and manifest.get("weights") != info["weights"]:
        raise ConfigError(f"{emb} was embedded with another model than {index_dir}; embed with the index's model, "
                          f"or {_rebuild(index_dir, emb)}")
    held = info.get("parts")
    if held is None:
        raise ConfigError(f"{index_dir} was built before indexes recorded their embed parts; {_rebuild(index_dir, emb)}"
                          " once, and add to it after")
    records = build.part_records(emb, vectors)
    for had, now in zip(held, records + [None] * len(held)):
        if now is None or list(had) != list(now):
            raise ConfigError(f"part {had[0]} of {emb} changed since {index_dir} was built (images removed, replaced "
                              f"or embedded again), so its rows' ids moved; {_rebuild(index_dir, emb)}")
    return records[len(held):]


def _files_of(info: dict) -> set[str]:
    """The files a generation's index.json names."""
    return {opened.file_of(info, role) for role in opened.FILES} | set(info.get("shards") or []) | \
        {info.get("trained") or "", (info.get("deleted") or {}).get("file", "")}


def _clear_leftovers(index_dir: Path, info: dict) -> None:
    """Files no generation names: an interrupted add's or delete's (a rerun writes them again)."""
    named = _files_of(info) | {opened.INFO}
    temporary = [*index_dir.glob("*.tmp"), *index_dir.glob(".*.tmp")]  # one writer at a time: the lock (cli)
    for path in [*build.generation_files(index_dir), *index_dir.glob("shard-*.faiss"), *temporary]:
        if path.name not in named:
            path.unlink(missing_ok=True)


def _commit(index_dir: Path, old: dict, new: dict) -> None:
    """index.json replaced (the change happens here, atomically), then the previous generation's files removed."""
    write_json(index_dir / opened.INFO, new)
    keep = _files_of(new)
    for role in opened.FILES:
        if opened.file_of(old, role) not in keep:
            (index_dir / opened.file_of(old, role)).unlink(missing_ok=True)
    deleted = (old.get("deleted") or {}).get("file")
    if deleted and deleted not in keep:
        (index_dir / deleted).unlink(missing_ok=True)
    shutil.rmtree(index_dir / WORK, ignore_errors=True)


def add(emb: Path, index_dir: Path, options: build.IndexOptions = build.IndexOptions(), engine=None,
        progress: bool = False) -> build.IndexResult:
    """Append the embed output's new parts to the index in `index_dir` (`added`: how many rows; `warnings`: what
    a drift of the added vectors from the quantizer's sample cost)."""
    emb, index_dir = Path(emb), Path(index_dir)
    info = opened.read_info(index_dir)
    new_parts = _new_parts(emb, index_dir, info)
    _clear_leftovers(index_dir, info)  # an interrupted add's: before the new index.json, its files; after, the old
    if not new_parts:
        return build.IndexResult.of(index_dir, info | {"warnings": []})
    vectors = info.get("vectors", "image")
    files = part_files(emb, vectors)
    old_n, gen = int(info["count"]), int(info.get("generation", 0)) + 1
    new = Parts(files[len(info["parts"]):])
    if new.d != info["dim"]:
        raise ConfigError(f"{emb}'s vectors have {new.d} dimensions, {index_dir} holds {info['dim']}")
    names = _generation_names(gen)
    chunk_rows = int((info.get("options") or {}).get("chunk_rows", options.chunk_rows))
    files_now = dict(info.get("files") or {role: opened.FILES[role] for role in opened.FILES})
    shards = list(info.get("shards") or [])
    if info.get("storage") == "shards":
        trained = index_dir / (info.get("trained") or "")
        if not info.get("trained") or not trained.is_file():
            raise ConfigError(f"{index_dir} keeps no trained quantizer ({opened.TRAINED}: indexes built before it "
                              f"was kept); {_rebuild(index_dir, emb)} once, and add to it after")
        added, _ = build._add_shards(trained, new, index_dir, options, engine, progress, first=len(shards))
        shards += added
    else:
        index = faiss.read_index(str(index_dir / opened.file_of(info, "index")))
        for _, chunk in new.chunks(rows=chunk_rows):
            index.add(chunk)  # an IVF's ids continue from its count (its direct map is sequential)
        _write_atomic(index_dir / names["index"], lambda tmp: faiss.write_index(index, str(tmp)))
        files_now["index"] = names["index"]
    if info["params"].get("refine"):
        old16 = np.load(index_dir / opened.file_of(info, "exact16"), mmap_mode="r")
        _write_exact16(index_dir / names["exact16"], old16, new, chunk_rows)
        files_now["exact16"] = names["exact16"]
    _append_meta(index_dir / opened.file_of(info, "meta"), emb, [r[0] for r in new_parts], old_n,
                 index_dir / names["meta"])
    files_now["meta"] = names["meta"]
    grown = info | {"count": old_n + new.n, "generation": gen, "files": files_now, "shards": shards,
                    "parts": info["parts"] + new_parts}
    taken = takedown.read(index_dir, info, index_dir / opened.file_of(info, "meta"))
    again = takedown.moved(taken, index_dir / names["meta"], first=old_n)
    again = again.filter(pc.greater_equal(again.column("id"), 0))
    if len(again):  # a taken-down image embedded again: its new rows are deleted too
        table = takedown.merged(taken, again)
        takedown.write(index_dir / takedown.file_name(gen), table)
        grown["deleted"] = takedown.entry(takedown.file_name(gen), table)
    if grown["params"].get("shards"):
        grown["params"] = grown["params"] | {"shards": len(shards)}
    recall = _drift_recall(index_dir, grown, emb, old_n, new.n, options, shards[len(info.get("shards") or []):])
    grown["adds"] = list(info.get("adds") or []) + [{"rows": new.n, "parts": [r[0] for r in new_parts],
                                                     "recall_at_10": recall}]
    warnings = []
    if recall is not None and recall < info["recall_at_10"] - DRIFT:
        warnings.append(f"the added vectors have drifted from the quantizer's training sample: recall@10 on them is "
                        f"{recall:.3f} against {info['recall_at_10']:.3f} when the index was built; "
                        f"{_rebuild(index_dir, emb)} to train its cells again")
    grown["warnings"] = warnings
    _commit(index_dir, info, grown)
    return build.IndexResult.of(index_dir, grown, added=new.n, kept_down=len(again))


def _write_atomic(path: Path, write) -> None:
    with staged(path, tmp=path.with_name(path.name + ".tmp")) as tmp:
        write(tmp)


def _write_exact16(path: Path, old: np.ndarray, new: Parts, chunk_rows: int) -> None:
    """The float16 copies of the old rows, then of the new ones, streamed into one .npy."""
    def write(tmp):
        with open(tmp, "wb") as f:
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": False,
                      "shape": (len(old) + new.n, old.shape[1])}
            np.lib.format.write_array_header_1_0(f, header)
            for a in range(0, len(old), chunk_rows):
                f.write(np.ascontiguousarray(old[a:a + chunk_rows]).tobytes())
            for _, chunk in new.chunks(rows=chunk_rows):
                f.write(np.ascontiguousarray(chunk, dtype=np.float16).tobytes())
    _write_atomic(path, write)


def _append_meta(old: Path, emb: Path, parts: list[int], first: int, path: Path) -> None:
    """The old metadata's row groups, then the new parts' rows with ids from `first`, streamed into `path`."""
    source = pq.ParquetFile(old)

    def write(tmp):
        with pq.ParquetWriter(tmp, source.schema_arrow) as writer:
            for g in range(source.num_row_groups):
                writer.write_table(source.read_row_group(g), row_group_size=65_536)
            at = first
            for i in parts:
                table = pq.read_table(emb / f"meta-{int(i):06d}.parquet")
                table = table.add_column(0, "id", pa.array(np.arange(at, at + len(table)), pa.int64()))
                writer.write_table(table.cast(source.schema_arrow), row_group_size=65_536)
                at += len(table)
    _write_atomic(path, write)


def _drift_recall(index_dir: Path, grown: dict, emb: Path, old_n: int, added: int, options: build.IndexOptions,
                  new_shards: list[str]) -> float | None:
    """recall@10 of the grown index's own search parameter on leave-one-out queries sampled from the added rows,
    against exact search, as the build measured it: over every row (an index in memory), or over the added shards
    alone (shards: the build too tuned on one shard's own rows). None for an exact (flat) index."""
    if grown["kind"] == "flat":
        return None
    saved = {"tune_queries": options.tune_queries, "seed": options.seed} | (grown.get("options") or {})
    rng = np.random.default_rng(int(saved["seed"]) + int(grown["generation"]))
    parts = Parts(part_files(emb, grown.get("vectors", "image"))[:len(grown["parts"])])
    shard_mode = grown.get("storage") == "shards"
    lo = old_n if shard_mode else 0
    sample = np.sort(old_n + rng.choice(added, min(added, int(saved["tune_queries"])), replace=False))
    queries = parts.take(sample)
    truth = build._without_self(build.streaming_search(parts, queries, 11, stop=old_n + added, start=lo)[1], sample)
    if shard_mode:  # the added shards alone, their ids shifted to the whole's
        index, members = opened.open_shards(index_dir, new_shards, grown["dim"])
        faiss.ParameterSpace().set_index_parameter(index, "nprobe", grown["params"]["nprobe"])
        found = index.search(queries, 11)[1] + old_n
        del members
    else:
        loaded = opened.load(index_dir, info=grown)
        found = loaded.search(queries, 11)[1]
    return build.recall_at_10(build._without_self(found, sample), truth)


def delete(index_dir: Path, ids: list[int]) -> build.IndexResult:
    """Take `ids` out of every search of the index (their rows stay: ids never move), and remember their images, so
    that a rebuild or an add never brings them back (takedown.py); the new index.json. Ids deleted already change
    nothing (no new generation)."""
    index_dir = Path(index_dir)
    info = opened.read_info(index_dir)
    count = int(info["count"])
    bad = [i for i in ids if not 0 <= i < count]
    if bad:
        raise ConfigError(f"no id {bad[0]} in {index_dir} (ids are 0 to {count - 1:,}); nothing was deleted")
    wanted = np.unique(np.asarray(ids, dtype=np.int64))
    meta_file = index_dir / opened.file_of(info, "meta")
    try:
        before = takedown.read(index_dir, info, meta_file)
        added = takedown.of_rows(wanted, meta_file)
    except (OSError, ValueError, pa.ArrowException):
        raise ConfigError(f"{index_dir}'s metadata or list of deleted ids is missing or damaged; rebuild it with "
                          f"`openalign index EMB --out {index_dir}`") from None
    fresh = np.setdiff1d(wanted, before.column("id").to_numpy())
    if not len(fresh):
        return build.IndexResult.of(index_dir, info)
    _clear_leftovers(index_dir, info)
    table = takedown.merged(before, added)
    gen = int(info.get("generation", 0)) + 1
    name = takedown.file_name(gen)
    takedown.write(index_dir / name, table)
    new = info | {"generation": gen, "deleted": takedown.entry(name, table)}
    _commit(index_dir, info, new)
    return build.IndexResult.of(index_dir, new, newly_deleted=int(len(fresh)))


def parse_ids(spec: str) -> list[int]:
    """`--delete`'s ids: a comma-separated list (`3,17,42`), or `@FILE`, a file of ids (one per line, or
    comma-separated). A bare name that is no list of ids but an existing file is read too, as before `@` existed; a
    list of ids is always ids, even where a file of that name exists."""
    def tokens(text: str) -> list[str]:
        return [t.strip() for t in text.replace("\n", ",").split(",") if t.strip()]

    def numbers(items: list[str]) -> list[int] | None:
        return [int(t) for t in items] if items and all(t.lstrip("-").isdigit() for t in items) else None

    given = numbers(tokens(spec)) if not spec.startswith("@") else None
    if given is not None:
        return given
    path = Path(spec[1:] if spec.startswith("@") else spec)
    if not path.is_file():
        raise ConfigError(f"--delete takes ids (3,17,42) or @FILE, a file of ids one per line; {spec[:80]!r} is "
                          "neither" + (f" (no file {path})" if spec.startswith("@") else ""))
    found = numbers(tokens(path.read_text(encoding="utf-8-sig", errors="replace")))
    if found is None:
        raise ConfigError(f"{path} must hold ids (whole numbers), one per line or comma-separated")
    return found
