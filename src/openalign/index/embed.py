"""`openalign embed`: image embeddings of a collection, in resumable parts, with metadata beside them.

    EMB/manifest.json          model, its fingerprint, dim, dtype, count, and the finished parts
    EMB/part-000000.npy        [n, D] L2-normalized embeddings (float32, or float16 with --float16)
    EMB/meta-000000.parquet    key, path, caption, width, height (`load` adds id: the row over all parts)

Sources: a directory of images (searched recursively; a `.txt` beside an image is its caption),
webdataset shards, or any evaluation layout (Karpathy JSON, caption table). The collection is cut into
parts of `part_size` images in a fixed order; each part is written atomically and recorded in the
manifest, so a rerun after an interruption embeds only the missing parts. Unreadable images are
skipped and counted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.data import images as image_lib
from openalign.data import shards as shard_lib
from openalign.data import transforms
from openalign.data.ingest import IMAGE_SUFFIXES
from openalign.eval.embed import evaluating

MANIFEST = "manifest.json"
META_SCHEMA = pa.schema([("key", pa.string()), ("path", pa.string()), ("caption", pa.string()),
                         ("width", pa.int32()), ("height", pa.int32())])


@dataclass(frozen=True)
class EmbedOptions:
    batch_size: int = 128
    part_size: int = 8_192
    float16: bool = False
    images: str = ""  # image root for a Karpathy JSON / caption table


@dataclass
class Item:
    key: str
    path: str
    caption: str
    read: callable  # () -> bytes


def _caption(image: Path) -> str:
    """The `.txt` sidecar of an image ('' without one); bytes that are not UTF-8 become U+FFFD, as ingest reads them."""
    sidecar = image.with_suffix(".txt")
    return sidecar.read_text(encoding="utf-8", errors="replace").strip() if sidecar.is_file() else ""


def collection(source: str, images_root: str = "", counter: dict | None = None) -> list[Item]:
    """Every image of `source` in a fixed order (not yet read); paths are absolute, so the embeddings, the
    index and the service work from any directory. Shard samples that cannot be used are counted in `counter`."""
    path = Path(source)
    if path.is_dir() and not any(path.glob("*.tar")):
        files = sorted(p for p in path.resolve().rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise ConfigError(f"no images under {source}")
        return [Item(str(f.relative_to(path.resolve())), str(f), _caption(f), f.read_bytes) for f in files]
    if path.suffix in (".json", ".csv", ".tsv", ".jsonl") and path.is_file():
        from openalign.eval.datasets import karpathy_items, table_items

        root = (Path(images_root) if images_root else path.parent).resolve()
        rows = karpathy_items(path, root, "all") if path.suffix == ".json" else table_items(path, root)
        return [Item(str(p.relative_to(root)) if p.is_relative_to(root) else str(p), str(p), caps[0] if caps else "",
                     p.read_bytes) for p, caps, *_ in rows]
    items = []
    for sample in shard_lib.read_samples([str(Path(s).resolve()) for s in shard_lib.list_shards(source)],
                                         counter=counter):
        try:
            texts = shard_lib.sample_texts(sample)
        except shard_lib.BadSample as err:
            if err.reason != "no_text":  # an image without a caption is still an image to index
                shard_lib.skip(counter, err.reason)
                continue
            texts = []
        try:
            data = shard_lib.image_bytes(sample)
        except shard_lib.BadSample as err:
            shard_lib.skip(counter, err.reason)
            continue
        items.append(Item(sample["__key__"], sample["__url__"], texts[0] if texts else "", lambda d=data: d))
    if not items:
        raise ConfigError(f"no images in {source}: give an image directory, shards, or a Karpathy JSON / caption table")
    return items


def _decoded(items: list[Item], resize: int, crop: int, counter: dict) -> Iterator[tuple[Item, torch.Tensor, tuple]]:
    for item in items:
        try:
            image = image_lib.load_rgb(item.read())
        except (OSError, image_lib.BadImage) as err:
            shard_lib.skip(counter, getattr(err, "reason", "missing_file"))
            continue
        yield item, transforms.eval_transform(image, resize, crop), image.size


def _write_part(out: Path, index: int, embeds: np.ndarray, rows: list[dict]) -> None:
    for name, write in ((f"part-{index:06d}.npy", lambda f: np.save(f, embeds)),
                        (f"meta-{index:06d}.parquet", lambda f: pq.write_table(pa.Table.from_pylist(rows, schema=META_SCHEMA), f))):
        tmp = out / (name + ".tmp")
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, out / name)


def embed(model_dir: Path, sources: list[str], out: Path, options: EmbedOptions = EmbedOptions(),
          progress: bool = True) -> dict:
    """Embed every image of `sources` (in order; see the module docstring) into `out`."""
    from openalign.model.hub import load_pretrained, weights_fingerprint

    model, _, cfg = load_pretrained(model_dir)
    resize, crop = cfg.model.vision.resize_size, cfg.model.vision.image_size
    unusable: dict = {}  # shard samples that are not images at all: counted, never embedded
    items = [item for source in sources for item in collection(source, options.images, unusable)]
    source = ",".join(sources)
    out.mkdir(parents=True, exist_ok=True)
    plan = {"model": str(Path(model_dir).resolve()), "weights": weights_fingerprint(model_dir), "source": source,
            "n_items": len(items), "part_size": options.part_size, "dtype": "float16" if options.float16 else "float32",
            "dim": cfg.model.embed_dim, "resize": resize, "crop": crop}
    previous = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).is_file() else {}
    done = previous.get("parts", {}) if all(previous.get(k) == v for k, v in plan.items()) else {}
    if previous and not done and previous.get("parts"):
        for stale in out.glob("part-*.npy"):  # another model, source or layout: start over
            stale.unlink()
        for stale in out.glob("meta-*.parquet"):
            stale.unlink()
    parts = [items[i:i + options.part_size] for i in range(0, len(items), options.part_size)]
    skipped = sum(p["skipped"] for p in done.values())
    bar = tqdm(total=len(items), desc="embed", unit="img", disable=not progress)
    bar.update(sum(len(parts[int(k)]) for k in done if int(k) < len(parts)))
    for index, part in enumerate(parts):
        if str(index) in done:
            continue
        counter: dict = {}
        embeds, rows, pending = [], [], []

        def flush():
            with evaluating(model):
                embeds.append(model.encode_image(torch.stack([p for _, p, _ in pending])).embeds.float().numpy())
            rows.extend({"key": item.key, "path": item.path, "caption": item.caption, "width": size[0],
                         "height": size[1]} for item, _, size in pending)
            pending.clear()

        for decoded in _decoded(part, resize, crop, counter):
            pending.append(decoded)
            bar.update(1)
            if len(pending) == options.batch_size:
                flush()
        if pending:
            flush()
        bar.update(counter.get("skipped", 0))
        matrix = np.concatenate(embeds) if embeds else np.zeros((0, cfg.model.embed_dim), np.float32)
        _write_part(out, index, matrix.astype(np.float16 if options.float16 else np.float32), rows)
        done[str(index)] = {"rows": len(rows), "skipped": counter.get("skipped", 0)}
        skipped += counter.get("skipped", 0)
        (out / MANIFEST).write_text(json.dumps(plan | {"parts": done, "complete": False}, indent=2) + "\n")
    bar.close()
    count = sum(p["rows"] for p in done.values())
    manifest = plan | {"parts": done, "complete": True, "count": count,
                       "skipped": skipped + unusable.get("skipped", 0), "unusable_samples": unusable.get("reasons", {})}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def load(emb: Path) -> tuple[np.ndarray, pa.Table]:
    """All embeddings [N, D] (float32) and their metadata, with ids 0..N-1 in part order."""
    manifest = json.loads((Path(emb) / MANIFEST).read_text()) if (Path(emb) / MANIFEST).is_file() else {}
    if not manifest.get("complete"):
        raise ConfigError(f"{emb} is not a finished `openalign embed` output; run (or rerun) openalign embed")
    parts = sorted(manifest["parts"], key=int)
    matrix = np.concatenate([np.load(Path(emb) / f"part-{int(i):06d}.npy") for i in parts]).astype(np.float32)
    meta = pa.concat_tables([pq.read_table(Path(emb) / f"meta-{int(i):06d}.parquet") for i in parts])
    return matrix, meta.add_column(0, "id", pa.array(np.arange(len(meta)), pa.int64()))
