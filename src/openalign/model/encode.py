"""Encoding texts and images with a trained dual encoder: the one place every stage encodes through.

    with evaluating(model): ...                          eval mode + no autograd, the mode restored after
    encode_texts(model, tokenizer, texts, batch_size, max_length)   -> [N, D] float32, input order
    encode_images(model, pixels)                          -> [n, D] float32 of one batch [n, 3, H, W]
    encode_image_stream(model, decoded, batch_size)       -> (payloads, [n, D]) per batch of a stream

Evaluation, `embed`, `dedup --mode embedding`, `search` and `serve` all call these. On CUDA the towers run
under bf16 autocast with channels_last images, and the embeddings are normalized again in fp32; on the
CPU everything is fp32 and the towers' normalized output is returned as is. Outputs are on the CPU.
"""

from __future__ import annotations

import contextlib
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from openalign import host
from openalign.model.dual_encoder import TwoTowers

__all__ = ["encode_image_stream", "encode_image_tokens", "encode_images", "encode_text_tokens", "encode_texts",
           "evaluating", "load_for_inference", "token_ids"]

T = TypeVar("T")


def device_of(model: TwoTowers) -> torch.device:
    return next(model.parameters()).device


@contextmanager
def evaluating(model: TwoTowers):
    """Eval mode (BatchNorm running statistics, no dropout) and no autograd. A model in training mode is put
    in eval mode and back after; a model already in eval mode (a service's, shared by its requests) is not
    touched, so concurrent requests never write to it."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            model.train()


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def _finish(embeds: torch.Tensor, device: torch.device) -> torch.Tensor:
    embeds = embeds.float()
    if device.type == "cuda":  # normalized again after bf16
        embeds = F.normalize(embeds, dim=-1)
    return embeds.cpu()


_TOKENIZING = threading.Lock()


def token_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Each text's ids, truncated to `max_length`. One call at a time: a fast tokenizer sets its truncation on
    the Rust object it shares with every thread, and a second thread encoding meanwhile gets "RuntimeError:
    Already borrowed" (huggingface/tokenizers#537); a service's request threads tokenize through here."""
    with _TOKENIZING:
        return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"] if texts else []


def _width(ids: list[list[int]], max_length: int, padding: str) -> int:
    """The padded length of these texts' ids: their longest (TextConfig.padding `longest`), or `max_length`
    (`max_length`: SigLIP's convention)."""
    return max_length if padding == "max_length" else max((len(i) for i in ids), default=1)


def _text_batches(ids: list[list[int]], tokenizer, batch_size: int, max_length: int, padding: str):
    """(rows, ids [b, width], mask [b, width]) of texts' token ids (`token_ids`: tokenized in one call) in order
    of length, each batch padded with the tokenizer's pad id to its own `_width`, on the side the tokenizer pads
    (Siglip2's Gemma tokenizer pads on the left, and SigLIP pools the last position: the side changes the vector)."""
    pad, left = tokenizer.pad_token_id or 0, getattr(tokenizer, "padding_side", "right") == "left"
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = _width([ids[i] for i in rows], max_length, padding)
        batch = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, i in enumerate(rows):
            place = slice(width - len(ids[i]), width) if left else slice(0, len(ids[i]))
            batch[j, place] = torch.tensor(ids[i])
            mask[j, place] = 1
        yield rows, batch, mask


def encode_texts(model: TwoTowers, tokenizer, texts: list[str], batch_size: int = 256,
                 max_length: int = 64) -> torch.Tensor:
    """[len(texts), D] normalized embeddings, rows in input order (encoded in order of length)."""
    out = torch.empty(len(texts), model.cfg.embed_dim)
    device = device_of(model)
    with evaluating(model), _autocast(device):
        for rows, ids, mask in _text_batches(token_ids(tokenizer, texts, max_length), tokenizer,
                                             batch_size, max_length, model.cfg.text.padding):
            out[rows] = _finish(model.encode_text(ids.to(device), mask.to(device)).embeds, device)
    return out


def encode_text_tokens(model: TwoTowers, tokenizer, texts: list[str], batch_size: int = 256,
                       max_length: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Late interaction's text side: ([len(texts), L, D] normalized token vectors, [len(texts), L] bool mask of
    real tokens), L the longest text's token count, rows in input order."""
    ids = token_ids(tokenizer, texts, max_length)  # once: the widest row and the batches
    longest = _width(ids, max_length, model.cfg.text.padding)
    tokens = torch.zeros(len(texts), longest, model.cfg.embed_dim)
    real = torch.zeros(len(texts), longest, dtype=torch.bool)
    device = device_of(model)
    with evaluating(model), _autocast(device):
        for rows, batch, mask in _text_batches(ids, tokenizer, batch_size, max_length,
                                               model.cfg.text.padding):
            out = model.encode_text(batch.to(device), mask.to(device), tokens=True)
            width = batch.shape[1]
            tokens[rows, :width] = _finish(out.tokens, device)
            real[rows, :width] = mask.bool()
    return tokens, real


def encode_images(model: TwoTowers, pixels: torch.Tensor) -> torch.Tensor:
    """[n, D] normalized embeddings of one batch of pixels [n, 3, H, W] (the evaluation transform's)."""
    device = device_of(model)
    pixels = pixels.to(device)
    if device.type == "cuda":
        pixels = pixels.contiguous(memory_format=torch.channels_last)
    with evaluating(model), _autocast(device):
        return _finish(model.encode_image(pixels).embeds, device)


def encode_image_tokens(model: TwoTowers, pixels: torch.Tensor, top: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, D] normalized embeddings, [n, P, D] normalized patch / feature-map cell vectors) of one batch;
    `top` > 0: only that many patch vectors per image, those largest before normalization, in that order."""
    device = device_of(model)
    pixels = pixels.to(device)
    if device.type == "cuda":
        pixels = pixels.contiguous(memory_format=torch.channels_last)
    with evaluating(model), _autocast(device):
        out = model.encode_image(pixels, tokens=True)
        patches = out.tokens
        if 0 < top < patches.shape[1]:
            keep = out.token_norms.topk(top, dim=1).indices  # [n, top]
            patches = patches.gather(1, keep[:, :, None].expand(-1, -1, patches.shape[2]))
        return _finish(out.embeds, device), _finish(patches, device)


def encode_image_stream(model: TwoTowers, decoded: Iterable[tuple[T, torch.Tensor]], batch_size: int,
                        encoder: Callable = encode_images) -> Iterator[tuple[list[T], object]]:
    """Batches of a stream of (payload, pixels): yields (the batch's payloads, `encoder(model, pixels)`: their
    [n, D] embeddings, or with encode_image_tokens also their patch vectors), in stream order; the payload is
    whatever the caller needs back with each image (its metadata)."""
    payloads, pending = [], []
    for payload, pixels in decoded:
        payloads.append(payload)
        pending.append(pixels)
        if len(pending) == batch_size:
            yield payloads, encoder(model, torch.stack(pending))
            payloads, pending = [], []
    if pending:
        yield payloads, encoder(model, torch.stack(pending))


def load_for_inference(model_dir: Path, device: str = "auto", local_rank: int = 0):
    """(model, tokenizer, config) on `device` in eval mode: `auto` is this rank's GPU when there is one,
    else the CPU; on CUDA the weights are channels_last (EfficientNet's depthwise convolutions)."""
    from openalign.model.hub import load_pretrained

    model, tokenizer, cfg = load_pretrained(Path(model_dir))
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    model.to(torch.device(device))
    if torch.device(device).type == "cuda":
        model.to(memory_format=torch.channels_last)
    model.eval()
    if torch.device(device).type == "cpu":
        host.settle_vector_math()  # before any operator runs MKL's vector math on several threads (host.py)
    return model, tokenizer, cfg
