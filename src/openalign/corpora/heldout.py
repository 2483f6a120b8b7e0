"""Held-out hygiene across built-in corpora (`data.dedup_heldout`): no training image is a near-duplicate of a
held-out image of any corpus the run is evaluated on.

Each built-in corpus chooses its held-out split within itself (emoji by family, openclipart by image), so when
several are trained on together nothing stops one source's training split from holding a copy of what another
holds out: a clipart drawing of a held-out emoji, the same drawing filed twice under two names. The paper removes
near-duplicates of every evaluation image from its training data (Section 4 and Appendix A); here with the
perceptual hash of `openalign dedup` (pipeline/curation/dedup.py): a training image within `max_distance` bits (of
64) of any held-out image is left out.

The result is a keep index in data.keep's format (data/pairs.py `KeepIndex`: the resolved shard path and sample key
of every training sample kept), written once under data_dir/keep-index/ and named by a fingerprint of every shard
it read (path, size, modification time) and the distance, with its report beside it. A rebuilt corpus makes a new
one; the training loader and the tokenizer read only what it keeps, and the shards are never rewritten.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from openalign.data import tars
from openalign.outputs import staged, write_json
from openalign.pipeline.curation.dedup import phash_bytes

MAX_DISTANCE = 4  # bits of 64 at or below which two images are duplicates (openalign dedup's default)


def shards_fingerprint(shards: dict[str, list[str]]) -> list:
    """What identifies a set of shards' contents without reading them: each shard's resolved path, size and
    modification time, by source."""
    out = []
    for name, paths in sorted(shards.items()):
        for path in paths:
            stat = Path(path).stat()
            out.append([name, str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns])
    return out


def _hashes(shards: dict[str, list[str]], desc: str, progress: bool) -> tuple[list[tuple[str, str, str]], np.ndarray,
                                                                            list[tuple[str, str, str]]]:
    """((source, resolved shard path, key) of each readable image, their hashes (n, 8) uint8, and those of the
    images that could not be hashed, which are kept: the loader skips and counts them as it does any bad sample."""
    rows, hashes, unhashed = [], [], []
    total = sum(tars.count_samples(s) for paths in shards.values() for s in paths)
    with tqdm(total=total, desc=desc, unit="image", leave=False, disable=not progress) as bar:
        for name, paths in shards.items():
            for shard in paths:
                resolved = str(Path(shard).resolve())
                for sample in tars.read_samples([shard]):
                    bar.update()
                    try:
                        digest = phash_bytes(tars.image_bytes(sample))
                    except tars.BadSample:
                        digest = None
                    row = (name, resolved, sample["__key__"])
                    if digest is None:
                        unhashed.append(row)
                    else:
                        rows.append(row)
                        hashes.append(digest)
    return rows, np.stack(hashes) if hashes else np.zeros((0, 8), np.uint8), unhashed


def build_heldout_keep_index(train: dict[str, list[str]], heldout: dict[str, list[str]], data_dir: Path,
                             max_distance: int = MAX_DISTANCE, progress: bool = True) -> str:
    """The keep index of every training sample (`train`: shards by corpus) not within `max_distance` bits of a
    held-out image (`heldout`: shards by corpus); built once, then found by its fingerprint."""
    import faiss

    key = hashlib.blake2b(json.dumps({"train": shards_fingerprint(train), "heldout": shards_fingerprint(heldout),
                                      "max_distance": max_distance}).encode(), digest_size=12).hexdigest()
    out = Path(data_dir) / "keep-index" / f"heldout-{key}.parquet"
    report_path = out.with_suffix(".json")
    if out.is_file() and report_path.is_file():
        return str(out)
    held_rows, held, _ = _hashes(heldout, "hash held-out images", progress)
    rows, hashes, unhashed = _hashes(train, "hash training images", progress)
    removed: Counter = Counter()
    examples, kept = [], list(unhashed)
    if len(held) and len(rows):
        search = faiss.IndexBinaryFlat(64)
        search.add(held)
        distances, nearest = search.search(hashes, 1)
        for row, distance, match in zip(rows, distances[:, 0], nearest[:, 0]):
            if distance <= max_distance:
                removed[(row[0], held_rows[match][0])] += 1
                examples.append({"train": f"{row[0]}:{row[2]}", "heldout": f"{held_rows[match][0]}:"
                                 f"{held_rows[match][2]}", "bits": int(distance)})
            else:
                kept.append(row)
    else:
        kept.extend(rows)
    examples.sort(key=lambda e: (e["bits"], e["train"]))
    report = {
        "stage": "dedup_heldout", "rule": f"perceptual hash within {max_distance} of 64 bits of a held-out image",
        "train_images": {name: sum(r[0] == name for r in rows + unhashed) for name in train},
        "heldout_images": {name: sum(r[0] == name for r in held_rows) for name in heldout},
        "removed": {f"{a} train ~ {b} held-out": n for (a, b), n in sorted(removed.items())},
        "removed_images": sum(removed.values()), "unhashed_train_images": len(unhashed), "examples": examples[:20],
        "keep_index": str(out),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(report_path, report)
    kept.sort(key=lambda r: (r[1], r[2]))
    with staged(out) as tmp:  # last: the index is finished when it appears
        pq.write_table(pa.table({"path": [r[1] for r in kept], "key": [r[2] for r in kept]}), tmp,
                       row_group_size=100_000)
    if progress:
        by_pair = "; ".join(f"{n} {pair}" for pair, n in report["removed"].items()) or "none"
        print(f"data.dedup_heldout: left out {report['removed_images']:,} of {len(rows) + len(unhashed):,} training "
              f"images, near-duplicates of held-out ones ({by_pair}); report {report_path}")
    return str(out)


def report_of(index: str) -> dict:
    """The report written beside a keep index made here."""
    return json.loads(Path(index).with_suffix(".json").read_text())
