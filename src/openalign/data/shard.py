"""Shard: the kept pairs of a pair table -> webdataset shards the training loader reads unchanged.

    openalign shard pairs.parquet --keep FILTER_DIR [--keep DEDUP_DIR ...] --out SHARDS

A pair is written when its uid is in *every* keep-list given (the filter stage's, the dedup stage's,
an unsafe-image classifier's); with no keep-list, every pair is (a collection that is already clean). Kept pairs are grouped by image: one sample per image, with all its kept
alt-texts in `KEY.json["texts"]` (the loader draws one per visit, so an image never meets itself in a
batch) and the first in `KEY.txt`. Images are decoded upright to RGB (see images.to_rgb), resized so
the shorter side is at most `image_size` (paper: 346) keeping the aspect ratio, and stored as JPEG.

Samples are ordered by image key (a content hash, so shards are a fair shuffle) and cut into shards of
`samples_per_shard`; each shard is written to a temporary name and renamed when complete, so a rerun
skips finished shards and redoes only the missing ones.
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import webdataset as wds
from PIL import Image
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.data import images
from openalign.data.filters import keep_source
from openalign.data.ingest import SOURCE_COLUMNS, blake, check_pair_table
from openalign.data.shards import MANIFEST, encode_image
from openalign.data.workers import process_pool


@dataclass(frozen=True)
class ShardOptions:
    image_size: int = 346  # shorter side after resizing (never upscaled); 0 keeps the original size
    samples_per_shard: int = 1000
    quality: int = 90
    prefix: str = "shard"
    workers: int = 0  # 0: all cores
    max_pixels: int = images.DEFAULT_MAX_PIXELS


def kept_images(pairs: Path, keep_dirs: list[Path]) -> list[dict]:
    """Kept pairs grouped by image, ordered by image key: [{image_key, texts, uids, path, member, url}]."""
    import duckdb

    con = duckdb.connect()
    if keep_dirs:
        keep = " INTERSECT ".join("SELECT uid FROM read_parquet(?)" for _ in keep_dirs)  # in SQL: no uid set in Python
        con.execute(f"CREATE TEMP TABLE keep AS {keep}", [keep_source(k) for k in keep_dirs])
    else:  # no keep-list: every pair (an already clean collection)
        con.execute("CREATE TEMP TABLE keep AS SELECT DISTINCT uid FROM read_parquet(?)", [str(pairs)])
    rows = con.execute("""
        SELECT image_key, list(text ORDER BY uid), list(uid ORDER BY uid), min(path), min(member), min(url)
        FROM (SELECT DISTINCT p.uid, p.image_key, p.text, p.path, p.member, p.url
              FROM read_parquet(?) p JOIN keep k ON p.uid = k.uid)
        GROUP BY image_key ORDER BY image_key""", [str(pairs)]).fetchall()
    con.close()
    return [{"image_key": key, "texts": texts, "uids": uids, "path": path, "member": member, "url": url}
            for key, texts, uids, path, member, url in rows]


class _Sources:
    """Image bytes by (path, member); tar indexes are built once per process and tar."""

    def __init__(self):
        self.tars: dict[str, tuple[tarfile.TarFile, dict]] = {}

    def read(self, path: str, member: str | None) -> bytes:
        if not member:
            return Path(path).read_bytes()
        if path not in self.tars:
            tar = tarfile.open(path)
            self.tars[path] = (tar, {m.name: m for m in tar.getmembers() if m.isfile()})
        tar, index = self.tars[path]
        info = index.get(member) or next((m for name, m in index.items() if name.endswith("/" + member)), None)
        if info is None:
            raise FileNotFoundError(f"{member} not in {path}")
        return tar.extractfile(info).read()


SOURCES = _Sources()  # one per process: forked workers each build their own tar indexes


def resize_short_side(image: Image.Image, size: int) -> Image.Image:
    short = min(image.size)
    if not size or short <= size:
        return image
    scale = size / short
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BICUBIC)


def write_shard(task: tuple[Path, list[dict], ShardOptions]) -> dict:
    """Write one shard atomically; returns its counts (samples written, skipped with reasons)."""
    path, samples, options = task
    tmp = path.with_suffix(".tar.tmp")
    written, skipped = 0, {}
    with wds.TarWriter(str(tmp), mtime=0.0) as writer:  # fixed mtime: reruns give identical bytes
        for sample in samples:
            try:
                image = images.load_rgb(SOURCES.read(sample["path"], sample["member"]), options.max_pixels)
            except images.BadImage as err:
                skipped[err.reason] = skipped.get(err.reason, 0) + 1
                continue
            except OSError:
                skipped["missing_file"] = skipped.get("missing_file", 0) + 1
                continue
            image = resize_short_side(image, options.image_size)
            meta = {"texts": sample["texts"], "uids": sample["uids"], "source": sample["path"],
                    "member": sample["member"], "url": sample["url"]}
            writer.write({"__key__": sample["image_key"], "jpg": encode_image(image, quality=options.quality),
                          "txt": sample["texts"][0], "json": json.dumps(meta, ensure_ascii=False).encode()})
            written += 1
    tmp.replace(path)
    return {"name": path.name, "samples": written, "skipped": skipped}


def shard(pairs: Path, keep_dirs: list[Path], out: Path, options: ShardOptions = ShardOptions(),
          progress: bool = True, split_name: str = "") -> dict:
    """Write the kept pairs of `pairs` as shards in `out`; finished shards of an earlier run are kept."""
    pairs, out = Path(pairs), Path(out)
    check_pair_table(pairs, SOURCE_COLUMNS)
    if options.samples_per_shard < 1:
        raise ConfigError("--samples-per-shard must be at least 1")
    start = time.perf_counter()
    samples = kept_images(pairs, [Path(k) for k in keep_dirs])
    check_sources_exist(samples, pairs)
    return write_samples(samples, out, options, progress, {"pairs": str(pairs), "keep": [str(k) for k in keep_dirs],
                                                           "split": split_name}, start)


def check_sources_exist(samples: list[dict], pairs: Path, probe: int = 100) -> None:
    """Fail in one sentence when none of the first `probe` distinct source files exist from here, instead of
    writing empty shards (pair tables from before absolute paths hold paths relative to where ingest ran)."""
    paths = list(dict.fromkeys(s["path"] for s in samples))[:probe]
    if paths and not any(Path(p).is_file() for p in paths):
        raise ConfigError(f"none of the {len(paths)} source files checked from {pairs} exist from here (e.g. {paths[0]}); "
                          "a relative path is relative to where `openalign ingest` ran: run shard from there, or "
                          "ingest again (it now records absolute paths)")


def write_samples(samples: list[dict], out: Path, options: ShardOptions, progress: bool, info: dict,
                  start: float | None = None) -> dict:
    start = time.perf_counter() if start is None else start
    out.mkdir(parents=True, exist_ok=True)
    n = options.samples_per_shard
    chunks = [samples[i:i + n] for i in range(0, len(samples), n)]
    tasks, counts, skipped, resumed, prints = [], {}, {}, 0, {}
    previous = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else {}
    for index, chunk in enumerate(chunks):
        path = out / f"{options.prefix}-{index:06d}.tar"
        # a shard is reused only if it was finished for exactly these samples with these options
        prints[path.name] = blake(json.dumps([asdict(options) | {"workers": 0}, chunk], sort_keys=True).encode())
        if path.is_file() and previous.get("fingerprints", {}).get(path.name) == prints[path.name]:
            counts[path.name] = previous["shards"][path.name]
            resumed += 1
        else:
            tasks.append((path, chunk, options))
    for stale in set(previous.get("shards", {})) - set(prints):  # ours, from an earlier, larger plan
        (out / stale).unlink(missing_ok=True)
    workers = min(options.workers or os.cpu_count() or 1, max(1, len(tasks)))
    pool = process_pool(workers) if workers > 1 else None
    try:
        results = pool.imap_unordered(write_shard, tasks) if pool else map(write_shard, tasks)
        for result in tqdm(results, total=len(tasks), desc="shard", unit="shard", disable=not progress):
            counts[result["name"]] = result["samples"]
            for reason, k in result["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + k
            done = {name: prints[name] for name in counts}
            _write_manifest(out, info | {"fingerprints": done}, options, counts, skipped, resumed, start, False)
    finally:
        if pool:
            pool.terminate()
    manifest = _write_manifest(out, info | {"fingerprints": prints}, options, counts, skipped, resumed, start, True)
    if samples and manifest["n_samples"] == 0:
        reasons = ", ".join(f"{k} {v:,}" for k, v in skipped.items())
        raise ConfigError(f"no image of the {len(samples):,} to shard could be read ({reasons}); the shards in {out} "
                          "are empty")
    return manifest


def _write_manifest(out, info, options, counts, skipped, resumed, start, final) -> dict:
    """The manifest after each finished shard: a killed run leaves a record of what is done."""
    manifest = {**info, "stage": "shard", "options": asdict(options), "complete": final,
                "n_samples": sum(counts.values()), "skipped": skipped, "resumed_shards": resumed,
                "seconds": round(time.perf_counter() - start, 2), "shards": dict(sorted(counts.items()))}
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(out / MANIFEST)
    return manifest
