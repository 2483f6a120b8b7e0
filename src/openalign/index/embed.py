"""`openalign embed`: image (and caption) embeddings of a collection, in resumable parts, with metadata.

    EMB/manifest.json          model, its fingerprint, dim, dtype, count, and the finished parts
    EMB/part-000000.npy        [n, D] L2-normalized image embeddings (float32, or float16 with --float16)
    EMB/text-000000.npy        [n, D] embeddings of the same rows' captions (--texts; zeros for no caption)
    EMB/patch-000000.npy       [n, P, D] float16 patch (ViT) or feature-map cell (EfficientNet) vectors
                               (--patches; --top-patches N keeps the N of largest norm), for late-interaction
                               re-ranking; the manifest says their bytes per image
    EMB/meta-000000.parquet    key, path, caption, width, height (`load` adds id: the row over all parts)
    EMB/part-000000.json       the part's status: rows, skipped, the plan it belongs to (written last)

Sources: a directory of images (searched recursively; a `.txt` beside an image is its caption),
webdataset shards, or any evaluation layout (Karpathy JSON, caption table). Shards are one part each
(clip-retrieval's layout: a part reads only its tar); other sources are cut into parts of `part_size`
images in a fixed order. Unreadable images are skipped and counted. Parts are append-only: a rerun on a
collection that grew keeps every finished part's images in that part and puts the new ones in new parts after
the last (each part's status records its images), so only they are embedded and the existing rows keep their ids.

Under torchrun each rank embeds the parts i with i % WORLD_SIZE == RANK, skipping parts whose status
says they are finished for this plan (model weights, sources, layout); rank 0 then writes the manifest.
So a rerun, with any number of processes, embeds only the missing parts, and the result equals a
one-process run. On CUDA the towers run in bf16 autocast, images in channels_last.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from openalign.config import ConfigError, expect, listed
from openalign import distributed
from openalign.data import sources as source_lib
from openalign.data import transforms
from openalign.index.options import EmbedOptions
from openalign.index.parts import MANIFEST, PATCHES, part_files, read_manifest
from openalign.model.encode import (encode_image_stream, encode_image_tokens, encode_images, encode_texts,
                                    load_for_inference)
from openalign.model.hub import model_fingerprint, weights_fingerprint
from openalign.outputs import sources_key, staged, unfinish, write_json, writing

__all__ = ["EmbedOptions", "EmbedResult", "embed"]

META_SCHEMA = pa.schema([("key", pa.string()), ("path", pa.string()), ("caption", pa.string()),
                         ("width", pa.int32()), ("height", pa.int32())])


@dataclass(frozen=True)
class Part:
    """One unit of embedding work: a whole shard, or some images of listed sources ((source, position) pairs)."""

    index: int
    shard: str = ""
    items: tuple = ()


def _unit(item: source_lib.Item) -> tuple:
    """What an image is across runs: its file, or its tar and member."""
    return item.path, item.member


def _recorded_units(out: Path | None) -> dict[int, list[tuple]]:
    """Each finished part's units as its status recorded them: [("shard", path)] or [(path, member), ...]."""
    recorded = {}
    for status_file in sorted(out.glob("part-*.json")) if out is not None and out.is_dir() else ():
        try:
            status = json.loads(status_file.read_text())
            index = int(status_file.stem[5:])
        except (OSError, ValueError):
            continue
        if isinstance(status.get("units"), list):
            recorded[index] = [tuple(u) for u in status["units"]]
    return recorded


def plan_parts(sources: list[str], options: EmbedOptions, out: Path | None = None
               ) -> tuple[list[Part], dict[str, list[source_lib.Item]], dict[int, str]]:
    """The parts of `sources` in order, the listed sources' items, and each part's inputs fingerprint: a shard's
    path, size and modification time; for listed images, each one's path, size, time and captions. A changed
    image or caption changes only its own part's fingerprint.

    Parts are append-only: a part finished in `out` keeps its index and its images (those still present); images
    and shards no finished part holds go into new parts after the last, in the listing's order (shards one part
    each, images `part_size` at a time; a part whose status was lost is planned again in its place). So a collection
    that grew embeds only its new images, and the rows of the parts already indexed keep their ids (`index --add`)."""
    listings, present, order = {}, {}, []  # unit -> (source, position) or shard; units in listing order
    for source in sources:
        listed = source_lib.listing(source, options.images, "all", options.image_column, options.text_column)
        if listed is None:
            for shard in (str(Path(s).resolve()) for s in source_lib.shard_list(source)):
                unit = ("shard", shard)
                if unit not in present:
                    present[unit] = shard
                    order.append(unit)
            continue
        listings[source] = listed
        for position, item in enumerate(listed):
            unit = _unit(item)
            if unit not in present:
                present[unit] = (source, position)
                order.append(unit)
    parts, claimed = [], set()
    for index, units in sorted(_recorded_units(out).items()):
        kept = [u for u in units if u in present and u not in claimed]
        claimed.update(kept)
        if kept:
            parts.append(_part(index, [present[u] for u in kept]))
    new = [u for u in order if u not in claimed]
    taken = {p.index for p in parts}
    free = (i for i in itertools.count() if i not in taken)  # gaps first (a part lost its status), then after the last
    items = [present[u] for u in new if not isinstance(present[u], str)]
    for unit in new:
        if isinstance(present[unit], str):
            parts.append(Part(next(free), shard=present[unit]))
    for start in range(0, len(items), options.part_size):
        parts.append(_part(next(free), items[start:start + options.part_size]))
    parts.sort(key=lambda p: p.index)
    inputs = {}
    for part in parts:
        inputs[part.index] = sources_key(part.shard) if part.shard else sources_key(
            [[i.path, i.member, i.texts] for i in part_items(part, listings)])
    return parts, listings, inputs


def _part(index: int, where: list) -> Part:
    return Part(index, shard=where[0]) if isinstance(where[0], str) else Part(index, items=tuple(where))


def part_items(part: Part, listings: dict[str, list[source_lib.Item]]) -> list[source_lib.Item]:
    return [listings[source][position] for source, position in part.items]


def _units(part: Part, listings: dict) -> list:
    """What the part's status records to keep its images across runs."""
    return [["shard", part.shard]] if part.shard else [list(_unit(i)) for i in part_items(part, listings)]


def _write_part(out: Path, index: int, embeds: np.ndarray, rows: list[dict], texts: np.ndarray | None = None,
                patches: np.ndarray | None = None) -> None:
    files = [(f"part-{index:06d}.npy", lambda f: np.save(f, embeds)),
             (f"meta-{index:06d}.parquet", lambda f: pq.write_table(pa.Table.from_pylist(rows, schema=META_SCHEMA), f))]
    if texts is not None:
        files.append((f"text-{index:06d}.npy", lambda f: np.save(f, texts)))
    if patches is not None:
        files.append((f"{PATCHES}-{index:06d}.npy", lambda f: np.save(f, patches)))
    for name, write in files:
        # a full disk: one sentence, and no half-written temporary file left
        with staged(out / name, tmp=out / (name + ".tmp")) as tmp, writing(tmp), open(tmp, "wb") as f:
            write(f)


def _status(out: Path, index: int) -> dict | None:
    try:
        return json.loads((out / f"part-{index:06d}.json").read_text())
    except (OSError, ValueError):
        return None


def _finished(out: Path, part: Part, key: str, inputs: str, options: EmbedOptions) -> dict | None:
    """The part's status when it is finished for this plan and these inputs, else None."""
    status = _status(out, part.index)
    return status if _why_redo(out, part, key, inputs, options, status) is None else None


def _why_redo(out: Path, part: Part, key: str, inputs: str, options: EmbedOptions, status: dict | None) -> str | None:
    """Why a part must be embedded (again), or None when its files are this plan's and its inputs unchanged."""
    files = [f"part-{part.index:06d}.npy", f"meta-{part.index:06d}.parquet"] + \
        ([f"text-{part.index:06d}.npy"] if options.texts else []) + \
        ([f"{PATCHES}-{part.index:06d}.npy"] if options.patches else [])
    if not status:
        return "new"
    if status.get("plan") != key:
        return "model or options changed"
    if status.get("inputs") != inputs:
        return "images or captions changed"
    if not all((out / f).is_file() for f in files):
        return "files missing"
    return None


class Encoder:
    """The model on this rank's device (model/encode.py: bf16 autocast and channels_last on CUDA)."""

    def __init__(self, model_dir: Path, device: str, local_rank: int):
        self.model, self.tokenizer, self.cfg = load_for_inference(model_dir, device, local_rank)

    def texts(self, captions: list[str], batch_size: int) -> np.ndarray:
        """[n, D] caption embeddings; zero rows where there is no caption."""
        out = np.zeros((len(captions), self.cfg.model.embed_dim), np.float32)
        rows = [i for i, c in enumerate(captions) if c]
        if rows:
            out[rows] = encode_texts(self.model, self.tokenizer, [captions[i] for i in rows], batch_size,
                                     self.cfg.model.text.max_length).numpy()
        return out


def embed_part(encoder: Encoder, items, options: EmbedOptions, bar) -> tuple:
    """(image embeddings, caption embeddings or None, metadata rows, skip counter, patch vectors or None) of
    one part."""
    transform = transforms.vision_transform(encoder.cfg.model.vision)
    counter: dict = {}
    pixels = (((item, image.size), transform(image))
              for item, image in source_lib.decoded(items, counter, encoder.cfg.model.vision.alpha))
    embeds, rows, cells = [], [], []
    encode = (lambda model, batch: encode_image_tokens(model, batch, options.top_patches)) if options.patches \
        else encode_images
    for batch, vectors in encode_image_stream(encoder.model, pixels, options.encode_batch, encode):
        if options.patches:
            vectors, patch_vectors = vectors
            cells.append(patch_vectors.numpy().astype(np.float16))
        embeds.append(vectors.numpy())
        rows.extend({"key": item.key, "path": os.path.realpath(item.path),
                     "caption": item.texts[0] if item.texts else "", "width": size[0], "height": size[1]}
                    for item, size in batch)
        bar.update(len(batch))
    bar.update(counter.get("skipped", 0))
    dim = encoder.cfg.model.embed_dim
    matrix = np.concatenate(embeds) if embeds else np.zeros((0, dim), np.float32)
    texts = encoder.texts([r["caption"] for r in rows], options.encode_batch) if options.texts else None
    patches = None
    if options.patches:
        patches = np.concatenate(cells) if cells else np.zeros((0, max(options.top_patches, 1), dim), np.float16)
    return matrix, texts, rows, counter, patches


@dataclass(frozen=True)
class EmbedResult:
    """What `embed` wrote (its manifest, OUT/manifest.json, holds the same and more)."""

    out: Path  # the embeddings' folder: part-*.npy, meta-*.parquet (text-*.npy, patch-*.npy)
    count: int  # images embedded (ids 0 .. count-1 in part order)
    dim: int
    dtype: str  # float32, or float16 (--float16)
    texts: bool  # the captions were embedded too
    skipped: int  # images that could not be read
    parts: int  # parts planned
    resumed_parts: int  # parts a rerun did not embed again (their inputs, model and options unchanged)
    redone: dict[str, int]  # parts embedded, by why (new, changed inputs, another model, ...)
    complete: bool  # every part is done (a torchrun rank other than 0 returns before rank 0 writes the manifest)
    patches_per_image: int  # patch vectors stored per image for re-ranking (0: none, without `patches`)
    patch_bytes_per_image: int  # their bytes per image (float16)
    manifest: dict  # the manifest as written


def embed(model_dir: Path, sources: list[str], out: Path, options: EmbedOptions = EmbedOptions(),
          progress: bool = True) -> EmbedResult:
    """Embed every image of `sources` (in order; see the module docstring) into `out`: this rank's parts,
    then (rank 0, after every rank is done) the manifest."""
    sources = listed(sources, "sources")
    options = expect(options, EmbedOptions)
    out = Path(out)
    layout = distributed.from_env()
    if layout.active and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")  # only for the barrier; the work itself never talks
    encoder = Encoder(Path(model_dir), options.device, layout.local_rank)
    cfg = encoder.cfg
    parts, listings, inputs = plan_parts(sources, options, out)
    if not parts:
        raise ConfigError(f"no images in {', '.join(sources)}")
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.float16 if options.float16 else np.float32
    plan = {"model": str(Path(model_dir).resolve()), "weights": weights_fingerprint(model_dir),
            "model_files": model_fingerprint(model_dir), "source": ",".join(sources), "part_size": options.part_size,
            "dtype": np.dtype(dtype).name, "dim": cfg.model.embed_dim, "resize": cfg.model.vision.resize_size,
            "crop": cfg.model.vision.image_size, "texts": options.texts, "patches": options.patches,
            "top_patches": options.top_patches}
    if options.top_patches < 0:
        raise ConfigError(f"--top-patches {options.top_patches} must be 0 (all) or a count of patches to keep")
    # which sources and how new images are grouped are not the plan: parts are append-only (plan_parts)
    keyed = {k: v for k, v in plan.items() if k not in ("source", "part_size")}
    key = hashlib.blake2b(json.dumps(keyed, sort_keys=True).encode(), digest_size=16).hexdigest()
    if layout.main:
        unfinish(out / MANIFEST)  # `index` refuses this output until every part is this plan's
    if layout.active:
        torch.distributed.barrier()
    mine = [p for p in parts if p.index % layout.world == layout.rank]
    why = {p.index: _why_redo(out, p, key, inputs[p.index], options, _status(out, p.index)) for p in mine}
    todo = [p for p in mine if why[p.index] is not None]
    bar = tqdm(total=sum(len(p.items) for p in todo if not p.shard) or None, desc=f"embed (rank {layout.rank})"
               if layout.active else "embed", unit="img", disable=not progress)
    for part in todo:
        counter: dict = {}
        items = source_lib.shard_items(part.shard, counter) if part.shard else part_items(part, listings)
        matrix, texts, rows, decoded, patches = embed_part(encoder, items, options, bar)
        _write_part(out, part.index, matrix.astype(dtype), rows, None if texts is None else texts.astype(dtype),
                    patches)
        status = {"plan": key, "inputs": inputs[part.index], "rows": len(rows), "units": _units(part, listings),
                  "skipped": decoded.get("skipped", 0) + counter.get("skipped", 0),
                  "unusable": counter.get("reasons", {}), "rank": layout.rank}
        write_json(out / f"part-{part.index:06d}.json", status)  # last: the part is finished
    bar.close()
    if layout.active:
        torch.distributed.barrier()
    redone = distributed.all_objects(Counter(why[p.index] for p in todo), layout)  # every rank's, by reason
    manifest = _manifest(out, parts, plan, key, inputs, options, len(mine) - len(todo))
    manifest["redone"] = dict(sum(redone, Counter()))
    if layout.main:
        write_json(out / MANIFEST, manifest)  # last: every part is finished
    if layout.active:
        torch.distributed.barrier()
    return EmbedResult(out=out, count=manifest["count"], dim=manifest["dim"], dtype=manifest["dtype"],
                       texts=bool(manifest["texts"]), skipped=manifest["skipped"], parts=len(manifest["parts"]),
                       resumed_parts=manifest["resumed_parts"], redone=manifest["redone"],
                       complete=manifest["complete"], patches_per_image=manifest.get("patches_per_image", 0),
                       patch_bytes_per_image=manifest.get("patch_bytes_per_image", 0), manifest=manifest)


def _manifest(out: Path, parts: list[Part], plan: dict, key: str, inputs: dict[int, str], options: EmbedOptions,
              resumed: int) -> dict:
    done = {str(p.index): s for p in parts if (s := _finished(out, p, key, inputs[p.index], options))}
    unusable: dict = {}
    for status in done.values():
        for reason, n in status.get("unusable", {}).items():
            unusable[reason] = unusable.get(reason, 0) + n
    planned = {p.index for p in parts}
    for stale in out.glob("part-*.npy"):  # parts no longer planned (all their images gone)
        if int(stale.stem[5:]) not in planned:
            for name in (stale.name, f"meta-{stale.stem[5:]}.parquet", f"text-{stale.stem[5:]}.npy",
                         f"{PATCHES}-{stale.stem[5:]}.npy", f"{stale.stem}.json"):
                (out / name).unlink(missing_ok=True)
    cost = {}
    if options.patches and done:  # the disk cost of late interaction: float16 patch vectors per image
        shapes = [np.load(out / f"{PATCHES}-{int(k):06d}.npy", mmap_mode="r").shape for k in done]
        patches = max((s[1] for s in shapes if s[0]), default=0)
        cost = {"patches_per_image": patches, "patch_bytes_per_image": patches * plan["dim"] * 2}
    return plan | cost | {"parts": {k: {"rows": s["rows"], "skipped": s["skipped"]} for k, s in done.items()},
                   "complete": len(done) == len(parts), "count": sum(s["rows"] for s in done.values()),
                   "skipped": sum(s["skipped"] for s in done.values()), "unusable_samples": unusable,
                   "resumed_parts": resumed, "options": asdict(options)}


def load(emb: Path, vectors: str = "image") -> tuple[np.ndarray, pa.Table]:
    """All embeddings [N, D] (float32) and their metadata, with ids 0..N-1 in part order."""
    files = part_files(emb, vectors)
    matrix = np.concatenate([np.load(f) for f in files]).astype(np.float32)
    meta = load_meta(emb)
    return matrix, meta


def load_meta(emb: Path) -> pa.Table:
    manifest = read_manifest(emb)
    parts = sorted(manifest["parts"], key=int)
    meta = pa.concat_tables([pq.read_table(Path(emb) / f"meta-{int(i):06d}.parquet") for i in parts])
    return meta.add_column(0, "id", pa.array(np.arange(len(meta)), pa.int64()))
