"""P5: the input pipeline: decode + augment per core against plain Pillow, and loader worker scaling.

Images are generated photographs-like JPEGs stored the way `openalign shard` stores them (shorter side
346, quality 90), in webdataset shards. Per core: openalign's decode (JPEG draft mode) + the paper's
augmentation (resize 346x346, random crop 289, flip, scale to [-1, 1]) against a plain Pillow
reference of the same transform (open, convert, resize, crop, flip, numpy, tensor), one thread, the
same images. Scaling: samples/s of the real training loader (decode, augment, tokenize, collate) with
1 and with 2 DataLoader workers, the main process only consuming. Small corpora: many short epochs of
one shard, read by one loader for the run (what training does) against a new loader every epoch (its
worker started again each time, as training did before).

    .venv/bin/python bench/input_pipeline.py [--images 768]

Writes its table into docs/benchmarks.md and ends with PERFORMANCE.md's verdict lines.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from _common import verdict, write_section
from openalign.data import tars
from openalign.data import transforms
from openalign.data.loader import Position, StreamSpec, batches_per_role, epoch_plan, train_loader
from openalign.tokenizer import train_tokenizer

RESIZE, CROP = 346, 289


def photo_like(rng: np.random.Generator, width: int, height: int) -> bytes:
    """Smooth gradients plus texture: compresses like a photograph, not like flat colour."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([np.sin(x / rng.uniform(20, 80) + c) * np.cos(y / rng.uniform(20, 80) - c) for c in range(3)], -1)
    pixels = (base * 80 + 128 + rng.normal(0, 18, (height, width, 3))).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_shards(out: Path, n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    writer = tars.ShardWriter(out, "bench", 128)
    images = []
    for i in range(n):
        data = photo_like(rng, int(RESIZE * rng.uniform(1.0, 1.6)), RESIZE)  # shorter side 346, as sharded
        images.append(data)
        writer.write(f"img{i:05d}", data, "jpg", f"a generated picture number {i}", {"texts": [f"picture {i}"]})
    writer.close()
    return images


def plain_pillow(data: bytes, rng: random.Random) -> torch.Tensor:
    image = Image.open(io.BytesIO(data)).convert("RGB").resize((RESIZE, RESIZE), Image.BILINEAR)
    left, top = rng.randint(0, RESIZE - CROP), rng.randint(0, RESIZE - CROP)
    image = image.crop((left, top, left + CROP, top + CROP))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1.0


def ours(data: bytes, rng: random.Random) -> torch.Tensor:
    # uint8 through the loader; the conversion to [-1, 1] (done on the device in training) counted here too
    return transforms.to_unit_range(transforms.train_transform(transforms.decode(data, RESIZE), RESIZE, CROP, rng))


def per_image_seconds(fn, images: list[bytes], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        rng = random.Random(0)
        start = time.perf_counter()
        for data in images:
            fn(data, rng)
        runs.append((time.perf_counter() - start) / len(images))
    return statistics.median(runs)


def loader_rate(shards: list[str], tokenizer, workers: int, batch: int) -> float:
    spec = StreamSpec(shards=tuple(shards), rank_batch=batch, resize=RESIZE, crop=CROP, max_length=64,
                      shuffle_buffer=64, workers=workers)
    counts = {s: tars.count_samples(s) for s in shards}
    n_batches = batches_per_role(spec, 0, counts)
    iterator = iter(train_loader(spec, tokenizer, (n_batches,)))
    next(iterator)  # workers started and warm
    start, samples = time.perf_counter(), 0
    for b in iterator:
        samples += len(b["keys"])
    return samples / (time.perf_counter() - start)


def epochs_rate(shard: str, tokenizer, batch: int, epochs: int, one_loader: bool) -> float:
    """Samples/s over `epochs` epochs of one shard with 1 worker: one loader for all, or one per epoch."""
    spec = StreamSpec(shards=(shard,), rank_batch=batch, resize=RESIZE, crop=CROP, max_length=64, shuffle_buffer=64,
                      workers=1)
    counts = {shard: tars.count_samples(shard)}
    per_epoch = batches_per_role(spec, 0, counts)
    start, samples = time.perf_counter(), 0
    if one_loader:
        loaders = [train_loader(spec, tokenizer, epoch_plan(spec, counts, Position(), epochs * per_epoch))]
    else:
        loaders = (train_loader(spec, tokenizer, (batches_per_role(spec, e, counts),), Position(epoch=e))
                   for e in range(epochs))
    for loader in loaders:
        for b in loader:
            samples += len(b["keys"])
    return samples / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        images = write_shards(Path(tmp), args.images)
        plain_s = per_image_seconds(plain_pillow, images, args.repeats)
        ours_s = per_image_seconds(ours, images, args.repeats)
        rng = np.random.default_rng(1)  # unsharded web originals (e.g. img2dataset at 1024 px): draft mode's case
        originals = [photo_like(rng, 1024, 768) for _ in range(args.images // 8)]
        plain_big = per_image_seconds(plain_pillow, originals, args.repeats)
        ours_big = per_image_seconds(ours, originals, args.repeats)
        shards = tars.list_shards(tmp)
        tokenizer = train_tokenizer([f"picture {i}" for i in range(100)] * 3, 200, 64)
        one = loader_rate(shards, tokenizer, 1, 32)
        two = loader_rate(shards, tokenizer, 2, 32)
        per_run = statistics.median(epochs_rate(shards[0], tokenizer, 32, 12, True) for _ in range(args.repeats))
        per_epoch = statistics.median(epochs_rate(shards[0], tokenizer, 32, 12, False) for _ in range(args.repeats))
    ratio, scaling, small = plain_s / ours_s, two / one, per_run / per_epoch
    rows = [
        f"### P5 input pipeline ({args.images} generated JPEGs, shorter side 346, crop 289; 1 thread per process)", "",
        "| what | per image | images/s |", "|---|---|---|",
        f"| plain Pillow (open, convert, resize, crop, flip, numpy) | {plain_s * 1e3:.2f} ms | {1 / plain_s:.0f} |",
        f"| openalign decode (JPEG draft) + augment (+ the uint8 -> [-1, 1] step) | {ours_s * 1e3:.2f} ms | "
        f"{1 / ours_s:.0f} |",
        f"| plain Pillow, 1024x768 originals | {plain_big * 1e3:.2f} ms | {1 / plain_big:.0f} |",
        f"| openalign, 1024x768 originals (JPEG decoded at 1/2 scale) | {ours_big * 1e3:.2f} ms | {1 / ours_big:.0f} |",
        f"| real loader, 1 worker (decode, augment, tokenize, collate; uint8 batches) | | {one:.0f} |",
        f"| real loader, 2 workers | | {two:.0f} |",
        f"| 12 epochs of one 128-image shard (4 batches an epoch), 1 worker, a new loader every epoch | | "
        f"{per_epoch:.0f} |",
        f"| the same, one loader for the run (`epoch_plan`: what training does) | | {per_run:.0f} |", "",
        f"- per core, openalign / plain Pillow: **{ratio:.2f}x** on sharded images (target >= 1.3; the same Pillow "
        f"work: JPEG draft mode only helps above twice the target size), **{plain_big / ours_big:.2f}x** on originals",
        f"- 2 workers / 1 worker: **{scaling:.2f}x** (target >= 1.8x on 2 cores)",
        f"- small corpus, one loader per run / one per epoch: **{small:.2f}x** (the worker no longer restarts, and "
        "refills its pipeline, at every epoch)",
        f"- command: `.venv/bin/python bench/input_pipeline.py --images {args.images}`", "",
    ]
    write_section("P5", "\n".join(rows))
    print("\n".join(rows))
    print(verdict("P5", "decode_augment_ratio", ratio, 1.3, at_least=True))
    print(verdict("P5", "two_workers_scaling", scaling, 1.8, at_least=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
