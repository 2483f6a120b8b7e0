"""The evaluation split's image features, computed once for every task (and cached): `EvalData`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from openalign.config import ConfigError
from openalign.data import sources, transforms
from openalign.eval.options import EvalOptions
from openalign.model.dual_encoder import DualEncoder
from openalign.model.encode import (encode_image_stream, encode_image_tokens, encode_images, encode_text_tokens,
                                    encode_texts)
from openalign.outputs import files_fingerprint, staged


@dataclass
class EvalData:
    image_embeds: torch.Tensor  # [N, D] L2-normalized
    captions: list[str]  # [M] all captions, image-major
    text_to_image: torch.Tensor  # [M] index of each caption's image
    labels: list[str]  # [N] class name of each image (json `name`), for zero-shot classification
    keys: list[str] = field(default_factory=list)  # [N] image file path (or shard key) of each image
    caption_ids: list[str] = field(default_factory=list)  # [M] Karpathy sentid, or `image#i`
    skipped: int = 0
    # [N] per image, the metadata the selected tasks read (each Task's `meta` keys, e.g. multilingual's
    # texts_by_language, compositional's attributes); [] where no image has any
    meta: list[dict] = field(default_factory=list)
    image_patches: torch.Tensor | None = None  # [N, P, D] patch / cell vectors (late interaction: --rerank)


@dataclass(frozen=True)
class Context:
    """What a task is given: the model and tokenizer, the shared options, and either the split's features
    (tasks that read the split's images) or the path the user named (tasks that read their own files)."""

    model: DualEncoder
    tokenizer: object
    options: EvalOptions
    data: EvalData | None = None
    path: str = ""

    def encode(self, texts) -> torch.Tensor:
        """[N, D] normalized text embeddings, in order."""
        return encode_texts(self.model, self.tokenizer, list(texts), self.options.encode_batch, self.options.max_length)

    def encode_tokens(self, texts) -> tuple[torch.Tensor, torch.Tensor]:
        """([N, L, D] normalized token vectors, [N, L] mask of real tokens), in order (late interaction)."""
        return encode_text_tokens(self.model, self.tokenizer, list(texts), self.options.encode_batch,
                                  self.options.max_length)


def cache_path(shards: str | list[str], options: EvalOptions, patches: bool = False, meta: tuple[str, ...] = ()
               ) -> Path | None:
    """Where the embeddings of this data, model and image size are cached; None without a cache. The
    key covers the model, the data's files (and the image root's), every option that changes them, and what
    the cache holds (EvalData's fields, the metadata kept)."""
    if not options.cache:
        return None
    sources = [shards] if isinstance(shards, str) else list(shards)
    key = json.dumps([options.model_id, files_fingerprint(*sources, options.images), options.split, options.resize,
                      options.crop, CACHED_FIELDS, sorted(meta)] + (["patches"] if patches else [])
                     + ([options.image_column, options.text_column]
                        if options.image_column or options.text_column else []))
    return Path(options.cache) / f"embeddings-{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.pt"


def embed_split(model: DualEncoder, shards: str | list[str], options: EvalOptions, progress: bool = True,
                patches: bool = False, meta: tuple[str, ...] = ()) -> EvalData:
    """Encode every image of the evaluation data (shards, Karpathy JSON or a caption table; see
    eval/datasets.py); captions are kept as text for the tasks. `patches`: each image's patch vectors too
    (late interaction); `meta`: the keys of each image's metadata to keep (what the selected tasks read). With
    `options.cache`, a second run on the same model and data loads them instead."""
    cached = cache_path(shards, options, patches, meta)
    if cached is not None and cached.is_file():
        data = read_cache(cached)
        if data is not None:
            return data
    data = _embed(model, shards, options, progress, patches, meta)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with staged(cached, tmp=cached.with_suffix(".tmp")) as tmp:
            torch.save({name: getattr(data, name) for name in CACHED_FIELDS}, tmp)
    return data


CACHED_FIELDS = tuple(f.name for f in dataclasses.fields(EvalData))  # all of it: tensors and plain values


def read_cache(path: Path) -> EvalData | None:
    """The cached embeddings at `path`, tensors and plain values only (a pickled object, which loading would run
    as code, is refused); None, with a line saying why, when the file is damaged or not ours: embed again."""
    try:
        state = torch.load(path, weights_only=True)
        if not isinstance(state, dict) or set(state) != set(CACHED_FIELDS):
            raise ValueError("not openalign's cached embeddings")
        return EvalData(**state)
    except Exception as err:  # noqa: BLE001 - refused objects, truncated zips, foreign files: all embedded again
        why = ("it holds Python objects besides tensors, which loading would run as code"
               if "Weights only load failed" in str(err)
               else f"it is damaged or not openalign's ({type(err).__name__})")
        print(f"openalign: ignoring the cached embeddings {path}: {why}; embedding again", file=sys.stderr)
        return None


def split_items(data: str | list[str], options: EvalOptions, counter: dict):
    """The items of an evaluation split: any data/sources.py layout, or a list of shards. Shard samples
    without a caption are skipped and counted (every evaluation image needs a caption or a label)."""
    return sources.items(data, options.images, options.split, counter, captionless=False,
                         columns=(options.image_column, options.text_column))


def _embed(model: DualEncoder, shards: str | list[str], options: EvalOptions, progress: bool,
           patches: bool = False, meta: tuple[str, ...] = ()) -> EvalData:
    counter: dict = {}
    decoded = sources.decoded(tqdm(split_items(shards, options, counter), desc="embed eval images", unit="img",
                                   disable=not progress, leave=False), counter, model.cfg.vision.alpha)
    transform = transforms.vision_transform(model.cfg.vision, options.resize, options.crop)  # at the evaluation's sizes
    pixels = ((item, transform(image)) for item, image in decoded)
    embeds, captions, owner, labels, keys, caption_ids, kept = [], [], [], [], [], [], []
    cells = []
    encoder = encode_image_tokens if patches else encode_images
    for batch, vectors in encode_image_stream(model, pixels, options.encode_batch, encoder):
        if patches:
            vectors, patch_vectors = vectors
            cells.append(patch_vectors)
        embeds.append(vectors)
        for item in batch:
            index = len(labels)
            labels.append(item.label or (item.texts[0] if item.texts else ""))
            keys.append(item.name)
            caption_ids += item.caption_ids or [f"{Path(item.name).name}#{i}" for i in range(len(item.texts))]
            captions += item.texts
            owner += [index] * len(item.texts)
            kept.append({k: item.meta[k] for k in meta if item.meta.get(k)})
    if not labels:
        raise ConfigError(f"no readable evaluation images in {shards}")
    return EvalData(torch.cat(embeds), captions, torch.tensor(owner, dtype=torch.long), labels, keys, caption_ids,
                    counter.get("skipped", 0), kept if any(kept) else [], torch.cat(cells) if patches else None)


def train_split(ctx: Context, train_data: str, task: str, crop: int = 0):
    """Embeddings and integer labels of the labeled training split (at the evaluation's image size, or at `crop`
    with the evaluation's resize-to-crop ratio), and the test labels, for image-only tasks."""
    if not train_data:
        raise ConfigError(f"--task {task} needs --train-data (a labeled training split: folders, a table or shards)")
    data, common = ctx.data, ctx.options
    if crop and crop != common.crop:
        ratio = common.resize / common.crop if common.crop else 1.0
        common = dataclasses.replace(common, crop=crop, resize=max(crop, round(crop * ratio)))
    train = embed_split(ctx.model, train_data, common, progress=False)
    classes = {c: i for i, c in enumerate(sorted(set(train.labels) | set(data.labels)))}
    to_ids = lambda labels: torch.tensor([classes[c] for c in labels], dtype=torch.long)  # noqa: E731
    return train.image_embeds, to_ids(train.labels), to_ids(data.labels), len(classes)
