"""A faster backward for EfficientNet's depthwise convolutions on small feature maps (CPU).

The profile of the demo's training step (bench/train_step.py) put a third of the step in oneDNN's weight gradient of
the depthwise convolutions whose feature maps are 2x2 and 4x4 (5x5 kernels, mostly padding): 50-100 ms each for a few
MFLOPs, against 0.4-3 ms for the input gradient of the same layer. There the weight gradient is cheap to compute
directly: per channel c, the products of every output position's gradient with every input position,

    M_c = G_c^T X_c                 G_c: [N, Ho*Wo], X_c: [N, H*W]   (a reduction over the batch)
    dW[c, i, j] = sum of M_c[(ho, wo), (h, w)] over h = s*ho + i - p, w = s*wo + j - p

where the second line is a fixed 0/1 matrix [Ho*Wo*H*W, k*k] that depends only on the shapes. The cost is
N*C*Ho*Wo*H*W multiply-adds, so this path is taken only for stride-1 layers while Ho*Wo*H*W is small
(SMALL_MAP); the other layers keep oneDNN's kernel, which is efficient there. The forward and the input
gradient are the library's own.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

# largest Ho*Wo*H*W for the direct weight gradient, stride 1 only. Measured on 2 cores at batch 128
# (bench/train_step.py's profile): 2x2 maps 47-90 ms -> 1-1.3 ms, 4x4 maps 49-71 ms -> 4-5 ms; oneDNN wins
# from 8x8 (4,096) and on the stride-2 layers (their explicit padding leaves no out-of-range taps)
SMALL_MAP = 256


@functools.lru_cache(maxsize=64)
def _tap_matrix(h: int, w: int, ho: int, wo: int, k: int, stride: int, pad: int) -> torch.Tensor:
    """[Ho*Wo*H*W, k*k] 0/1: which kernel tap links output position (ho, wo) to input position (h, w)."""
    oy, ox, iy, ix = torch.meshgrid(torch.arange(ho), torch.arange(wo), torch.arange(h), torch.arange(w),
                                    indexing="ij")
    ty, tx = iy - stride * oy + pad, ix - stride * ox + pad
    valid = ((ty >= 0) & (ty < k) & (tx >= 0) & (tx < k)).reshape(-1)
    taps = torch.zeros(ho * wo * h * w, k * k)
    rows = torch.arange(ho * wo * h * w)[valid]
    taps[rows, (ty * k + tx).reshape(-1)[valid]] = 1.0
    return taps


def _weight_grad(grad: torch.Tensor, x: torch.Tensor, k: int, stride: int, pad: int) -> torch.Tensor:
    n, c, h, w = x.shape
    ho, wo = grad.shape[-2:]
    # channels-last views [N, positions, C]; one reduction over the batch per output position (batched GEMMs of
    # [positions x N] @ [N x positions] per channel are ~15x slower here: thousands of tiny matrices)
    g = grad.permute(0, 2, 3, 1).reshape(n, ho * wo, c)
    xs = x.permute(0, 2, 3, 1).reshape(n, h * w, c)
    pairs = torch.stack([(g[:, a, None, :] * xs).sum(0) for a in range(ho * wo)])  # [Ho*Wo, H*W, C]
    taps = _tap_matrix(h, w, ho, wo, k, stride, pad).to(pairs.dtype)
    return (taps.T @ pairs.reshape(ho * wo * h * w, c)).T.reshape(c, 1, k, k)


class _DepthwiseConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, stride: int, pad: int):
        ctx.save_for_backward(x, weight)
        ctx.stride, ctx.pad = stride, pad
        return F.conv2d(x, weight, None, stride, pad, 1, x.shape[1])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        c, k = x.shape[1], weight.shape[-1]
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [ctx.stride] * 2, [ctx.pad] * 2, [1, 1], False, [0, 0], c,
                [True, False, False])[0]
        grad_w = _weight_grad(grad, x, k, ctx.stride, ctx.pad) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None


def _padding(conv: nn.Conv2d) -> int | None:
    """The symmetric padding of a square convolution ('same' for an odd kernel at stride 1 is k // 2)."""
    k = conv.kernel_size[0]
    if conv.padding == "same":
        return k // 2 if k % 2 and conv.stride == (1, 1) else None
    if isinstance(conv.padding, tuple) and conv.padding[0] == conv.padding[1]:
        return conv.padding[0]
    return None


def _small_map(conv: nn.Conv2d, x: torch.Tensor, pad: int) -> bool:
    """A stride-1 layer whose Ho*Wo*H*W is within SMALL_MAP (where the direct weight gradient wins)."""
    if conv.stride != (1, 1):
        return False
    k, (h, w) = conv.kernel_size[0], x.shape[-2:]
    return (h + 2 * pad - k + 1) * (w + 2 * pad - k + 1) * h * w <= SMALL_MAP


def _forward(conv: nn.Conv2d, pad: int, x: torch.Tensor) -> torch.Tensor:
    # under autocast the library's path keeps the gradient's dtype consistent with the saved inputs
    if (x.device.type != "cpu" or not torch.is_grad_enabled() or torch.is_autocast_enabled("cpu")
            or not _small_map(conv, x, pad)):
        return conv._conv_forward(x, conv.weight, conv.bias)
    return _DepthwiseConv.apply(x, conv.weight, conv.stride[0], pad)


def use_fast_depthwise(module: nn.Module) -> int:
    """Route every square, bias-free, depthwise nn.Conv2d under `module` through the direct weight gradient
    on small CPU feature maps; returns how many were routed. (Parameters and state dicts are untouched.)"""
    routed = 0
    for conv in module.modules():
        if (isinstance(conv, nn.Conv2d) and conv.groups == conv.in_channels == conv.out_channels > 1
                and conv.bias is None and conv.kernel_size[0] == conv.kernel_size[1]
                and conv.stride[0] == conv.stride[1] and conv.dilation == (1, 1) and conv.padding_mode == "zeros"
                and (pad := _padding(conv)) is not None):
            conv.forward = functools.partial(_forward, conv, pad)
            routed += 1
    return routed
