"""The text tower's last layer computed for the [CLS] token only, when only [CLS] is wanted.

ALIGN's text embedding is the last layer's [CLS] vector. That layer's keys and values need every token
(the [CLS] query attends to all of them), but its query, attention output, residual LayerNorms and
feed-forward block only matter at [CLS]: computing them for all T tokens spends ~10/12 of one layer's
FLOPs on rows that are thrown away (the demo's 4-layer BERT: ~20% of the text tower, forward and
backward). Under `cls_only()` the routed layer does exactly the library's operations (the same modules,
the same attention function and mask) on the [CLS] row and returns [B, 1, H]; everywhere else, and for
callers that want every token (late interaction, `encode_text(tokens=True)`), it is the library's layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.align.modeling_align import AlignTextLayer, eager_attention_forward

_CLS_ONLY = contextvars.ContextVar("cls_only", default=False)  # per thread: a server may mix both kinds of call


@contextlib.contextmanager
def cls_only():
    """Routed layers return only the [CLS] row inside this block."""
    token = _CLS_ONLY.set(True)
    try:
        yield
    finally:
        _CLS_ONLY.reset(token)


def _forward(layer: AlignTextLayer, hidden_states: torch.Tensor,
             attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    if not _CLS_ONLY.get():
        return type(layer).forward(layer, hidden_states, attention_mask, **kwargs)
    attention = layer.attention.self
    batch, length, _ = hidden_states.shape
    first = hidden_states[:, :1]  # [B, 1, H]
    heads = (attention.num_attention_heads, attention.attention_head_size)
    query = attention.query(first).view(batch, 1, *heads).transpose(1, 2)
    key = attention.key(hidden_states).view(batch, length, *heads).transpose(1, 2)
    value = attention.value(hidden_states).view(batch, length, *heads).transpose(1, 2)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :1]  # the [CLS] query's row of [B, 1, T, T]
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(attention.config._attn_implementation, eager_attention_forward)
    out, _ = attend(attention, query, key, value, attention_mask,
                    dropout=attention.attention_dropout if attention.training else 0.0, scaling=attention.scaling,
                    **kwargs)
    out = layer.attention.output(out.reshape(batch, 1, -1).contiguous(), first)
    return layer.feed_forward_chunk(out)


def use_cls_only_last_layer(text_model: nn.Module) -> bool:
    """Route the last layer of an ALIGN text tower (transformers' AlignTextModel); returns whether it was.
    Parameters and state dicts are untouched; a deepcopy keeps the routing."""
    layers = getattr(getattr(text_model, "encoder", None), "layer", None)
    if not layers or not isinstance(layers[-1], AlignTextLayer):
        return False
    layers[-1].forward = functools.partial(_forward, layers[-1])
    return True
