"""The paper's image transforms with Pillow: train = resize, random crop, horizontal flip; eval = center crop.

Images are decoded with `draft()`, which lets libjpeg decode at 1/2, 1/4 or 1/8 scale when the target
is small (nearly 2x faster decode+resize), then resized to a square (paper: 346x346) and cropped
(paper: 289). Pixels are scaled to [-1, 1] as in transformers' ALIGN image processor.
"""

from __future__ import annotations

import io
import random
import warnings

import numpy as np
import torch
from PIL import Image

# Decompression bombs: refuse images above ~90 MP (Pillow's own warning threshold is ~89 MP).
Image.MAX_IMAGE_PIXELS = 90_000_000


def decode(data: bytes, size: int) -> Image.Image:
    """Decode to RGB at no less than `size` on the short side where the format allows."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (size, size))
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            image = image.convert("RGBA")
            background = Image.new("RGBA", image.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, image)  # transparent -> white, not black
        return image if image.mode == "RGB" else image.convert("RGB")  # (convert would copy an RGB image)


def to_tensor(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image, dtype=np.float32)  # [H, W, 3] in 0..255
    return torch.from_numpy(array).permute(2, 0, 1).div_(127.5).sub_(1.0)  # [3, H, W] in [-1, 1]


def train_transform(image: Image.Image, resize: int, crop: int, rng: random.Random) -> torch.Tensor:
    """[3, crop, crop] uint8: a quarter of the bytes through the loader's workers and onto the device;
    `to_unit_range` makes it the model's input there."""
    image = image.resize((resize, resize), Image.BILINEAR)
    left, top = rng.randint(0, resize - crop), rng.randint(0, resize - crop)
    image = image.crop((left, top, left + crop, top + crop))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def to_unit_range(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels (from `train_transform`) -> float in [-1, 1], as `to_tensor`; float input passes."""
    if pixels.dtype != torch.uint8:
        return pixels
    return pixels.float().div_(127.5).sub_(1.0)


def eval_transform(image: Image.Image, resize: int, crop: int) -> torch.Tensor:
    image = image.resize((resize, resize), Image.BILINEAR)
    offset = (resize - crop) // 2
    return to_tensor(image.crop((offset, offset, offset + crop, offset + crop)))


def eval_pixels(image: Image.Image, resize: int, crop: int) -> torch.Tensor | Image.Image:
    """The evaluation tensor, or with crop=0 the image resized to resize x resize and left as a PIL
    image (fine-tuning keeps those in memory and draws random crops from them each step)."""
    return eval_transform(image, resize, crop) if crop else image.resize((resize, resize), Image.BILINEAR)
