"""Streaming image/alt-text batches from webdataset shards, deterministic and exactly resumable.

Each DataLoader worker on each rank plays one *role* (rank x workers roles in all) and reads its share
of the shards (shuffled per epoch), through a seeded shuffle buffer, then decodes, augments and
tokenizes in the worker. Corrupt samples are skipped and counted, never fatal.

Determinism: shard order, the shuffle buffer, the choice of alt-text and the augmentation are seeded
by (seed, epoch, role or sample key), so the stream is a pure function of the seed. Every role yields
the same number of batches per epoch, so DataLoader's round robin makes batch b of an epoch come from
role b % workers. One loader runs epoch after epoch (an `epoch_plan`), so its workers start once per
run, not once per epoch (a small corpus has many short epochs). To resume, each role skips the raw
samples it had consumed (before decoding, which is cheap) and the roles are rotated so that the next
batch comes from the right one.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import random
from dataclasses import dataclass, field
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from openalign import host
from openalign.config import Config, ConfigError
from openalign.data import tars
from openalign.data import transforms
from openalign.data.seeds import stable_seed


@dataclass(frozen=True)
class StreamSpec:
    shards: tuple[str, ...]
    rank_batch: int  # this process's share of data.global_batch
    resize: int
    crop: int
    max_length: int
    seed: int = 0
    shuffle_buffer: int = 1000
    workers: int = 0
    rank: int = 0
    world_size: int = 1
    fraction: float = 1.0  # read only this subset of the samples (shards.in_fraction; data.fraction)
    keep: str = ""  # read only the samples this keep index keeps (shards.KeepIndex; data.keep)
    augment: str = "pretraining"  # the training crop (data.crop): pretraining or inception
    min_area: float = 0.08  # the inception crop's smallest share of the image (data.crop_min_area)
    templates: tuple[str, ...] = ()  # each text put in one of these at random (data.text_templates); () as it is

    @classmethod
    def for_config(cls, cfg: Config, shards: list[str], rank: int = 0, world_size: int = 1, **changes) -> StreamSpec:
        """Rank `rank` of `world_size`'s stream: its share of data.global_batch (config.check: it divides)."""
        spec = cls(shards=tuple(shards), rank_batch=cfg.data.global_batch // world_size,
                   resize=cfg.model.vision.resize_size, crop=cfg.model.vision.image_size,
                   max_length=cfg.model.text.max_length, seed=cfg.seed, shuffle_buffer=cfg.data.shuffle_buffer,
                   workers=cfg.data.workers, rank=rank, world_size=world_size, fraction=cfg.data.fraction,
                   augment=cfg.data.crop, min_area=cfg.data.crop_min_area, templates=cfg.data.text_templates)
        return dataclasses.replace(spec, **changes)


@dataclass
class Position:
    """Where a training stream stands; saved in checkpoints to resume exactly."""

    epoch: int = 0
    batch: int = 0  # batches delivered in this epoch on this rank
    consumed: dict[int, int] = field(default_factory=dict)  # local role -> raw samples consumed this epoch
    produced: dict[int, int] = field(default_factory=dict)  # local role -> batches produced this epoch

    def advance(self, batch: dict) -> None:
        if batch["epoch"] != self.epoch:  # the stream went on to the next epoch
            self.epoch, self.batch, self.consumed, self.produced = batch["epoch"], 0, {}, {}
        self.batch += 1
        self.consumed[batch["role"]] = batch["consumed"]
        self.produced[batch["role"]] = batch["produced"]


def shards_for_role(spec: StreamSpec, epoch: int, role: int) -> list[str]:
    order = list(spec.shards)
    random.Random(stable_seed(spec.seed, epoch, "shards")).shuffle(order)
    return order[role :: max(1, spec.workers) * spec.world_size]


def batches_per_role(spec: StreamSpec, epoch: int, counts: dict[str, int]) -> int:
    """Batches every role yields in `epoch`: the same for all roles (the smallest share decides)."""
    n_roles = max(1, spec.workers) * spec.world_size
    if len(spec.shards) < n_roles:
        raise ConfigError(f"{len(spec.shards)} shards cannot feed {n_roles} readers (ranks x data.workers); "
                          "lower data.workers or write more, smaller shards")
    per_role = [sum(counts[s] for s in shards_for_role(spec, epoch, r)) // spec.rank_batch for r in range(n_roles)]
    if min(per_role) == 0:
        raise ConfigError(f"a reader gets fewer than one batch of {spec.rank_batch} samples (data.global_batch="
                          f"{spec.rank_batch * spec.world_size} over {spec.world_size} process"
                          f"{'es' * (spec.world_size > 1)}); lower data.global_batch or data.workers")
    return min(per_role)


def epoch_plan(spec: StreamSpec, counts: dict[str, int], position: Position, batches: int) -> tuple[int, ...]:
    """Batches per role of the epochs from `position.epoch` on that hold `batches` more batches of this rank
    (one per training step); every epoch's reader shares are checked here, before any worker starts."""
    plan, left = [], batches + position.batch
    while left > 0:
        plan.append(batches_per_role(spec, position.epoch + len(plan), counts))
        left -= plan[-1] * max(1, spec.workers)
    return tuple(plan)


def shuffled(samples, buffer: int, rng: random.Random):
    pool = []
    for sample in samples:
        if len(pool) < buffer:
            pool.append(sample)
            continue
        i = rng.randrange(len(pool))
        pool[i], sample = sample, pool[i]
        yield sample
    rng.shuffle(pool)
    yield from pool


class TrainStream(IterableDataset):
    """Yields collated training batches, epoch after epoch as `plan` gives them (batches per role of epochs
    position.epoch, position.epoch + 1, ...); one text per image per visit, chosen at random."""

    def __init__(self, spec: StreamSpec, tokenizer, plan: tuple[int, ...], position: Position | None = None):
        self.spec, self.tokenizer, self.plan = spec, tokenizer, plan
        self.position = copy.deepcopy(position or Position())  # where it starts (the trainer advances its own)

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        workers = max(1, self.spec.workers)
        # The rotation on resume holds for later epochs too: every epoch ends after a multiple of `workers`.
        local = ((info.id if info else 0) + self.position.batch) % workers
        for i, n_batches in enumerate(self.plan):
            resumed = i == 0  # the epoch the position is in: skip what its roles had consumed
            skip = self.position.consumed.get(local, 0) if resumed else 0
            produced = self.position.produced.get(local, 0) if resumed else 0
            yield from self._epoch(self.position.epoch + i, local, n_batches, skip, produced)

    def _epoch(self, epoch: int, local: int, n_batches: int, skip: int, produced: int) -> Iterator[dict]:
        role = self.spec.rank * max(1, self.spec.workers) + local
        consumed, pending, counter, reported = 0, [], {}, 0
        if produced >= n_batches:
            return
        # A role whose corrupt samples leave it short wraps around its shards, so every role yields
        # exactly n_batches and the round robin (hence the resume rotation) stays exact.
        for lap in itertools.count():
            rng = random.Random(stable_seed(self.spec.seed, epoch, "buffer", role, lap))
            raw = tars.read_samples(shards_for_role(self.spec, epoch, role), fraction=self.spec.fraction,
                                         counter=counter, keep=self.spec.keep)
            decoded, lap_start = 0, consumed
            for sample in shuffled(raw, self.spec.shuffle_buffer, rng):
                consumed += 1
                if consumed <= skip or sample["__key__"] in (item[2] for item in pending):
                    continue  # (an image already in the pending batch can come again only on a wrap)
                try:
                    pending.append(self.prepare(sample, epoch))
                    decoded += 1
                except Exception as err:  # noqa: BLE001 - any undecodable sample is skipped and counted
                    tars.skip(counter, getattr(err, "reason", "undecodable_image"))
                    continue
                if len(pending) == self.spec.rank_batch:
                    produced += 1
                    yield collate(pending, self.tokenizer, self.spec.max_length) | {
                        "epoch": epoch, "role": local, "consumed": consumed, "produced": produced,
                        "skipped": counter.get("skipped", 0) - reported}
                    pending, reported = [], counter.get("skipped", 0)
                if produced >= n_batches:
                    return
            if decoded == 0 and lap_start >= skip:
                shards = shards_for_role(self.spec, epoch, role)
                raise ConfigError(f"no usable sample in {len(shards)} shard(s) ({shards[0]}, ...) of reader {role}: "
                                  f"skipped {tars.skip_summary(counter)}; check the shards (or remove them)")

    def prepare(self, sample: dict, epoch: int) -> tuple[torch.Tensor, str, str]:
        key = sample["__key__"]
        rng = random.Random(stable_seed(self.spec.seed, epoch, "sample", key))
        texts = tars.sample_texts(sample)
        image = transforms.decode(tars.image_bytes(sample), self.spec.resize)
        if self.spec.augment == "inception":
            pixels = transforms.square_inception_transform(image, self.spec.resize, self.spec.crop, rng,
                                                           self.spec.min_area)
        else:
            pixels = transforms.train_transform(image, self.spec.resize, self.spec.crop, rng)
        text = rng.choice(texts)
        if self.spec.templates:  # drawn after the text, so a run without templates reads the stream it always did
            text = templated(text, self.spec.templates, rng)
        return pixels, text, key


def templated(text: str, templates: tuple[str, ...], rng: random.Random) -> str:
    """`text` in one of `templates` drawn by `rng` (each has one `{}`; the text's own braces are left alone)."""
    return rng.choice(templates).replace("{}", text)


def collate(items: list[tuple[torch.Tensor, str, str]], tokenizer, max_length: int) -> dict:
    pixels, texts, keys = zip(*items)
    tokens = tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return {
        "pixel_values": torch.stack(pixels),  # [B, 3, crop, crop] uint8 (transforms.to_unit_range on the device)
        "input_ids": tokens["input_ids"],  # [B, T]
        "attention_mask": tokens["attention_mask"],  # [B, T]
        "keys": list(keys),
    }


def _worker_init(_: int) -> None:
    host.set_threads(1)  # workers decode with Pillow; BLAS threads would only oversubscribe


def train_loader(spec: StreamSpec, tokenizer, plan: tuple[int, ...], position: Position | None = None):
    """Batches of the epochs in `plan` (see `epoch_plan`) from `position` on, in one DataLoader."""
    stream = TrainStream(spec, tokenizer, plan, position)
    return DataLoader(stream, batch_size=None, num_workers=spec.workers, worker_init_fn=_worker_init,
                      generator=torch.Generator().manual_seed(spec.seed),  # leaves the global RNG alone
                      prefetch_factor=4 if spec.workers else None)
