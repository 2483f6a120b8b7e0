"""The paper's image transforms with Pillow: train = resize, random crop, horizontal flip; eval = center crop.

Images are decoded with `draft()`, which lets libjpeg decode at 1/2, 1/4 or 1/8 scale when the target
is small (nearly 2x faster decode+resize), then resized to a square (paper: 346x346) and cropped
(paper: 289). Pixels are scaled to [-1, 1] as in transformers' ALIGN image processor.
"""

from __future__ import annotations

import functools
import io
import math
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


INCEPTION_SCALE = (0.08, 1.0)  # Szegedy et al. 2015: the crop's share of the image's area
INCEPTION_RATIO = (3 / 4, 4 / 3)  # and its aspect ratio (width / height), drawn log-uniformly
CENTER_CROP_RATIO = 0.875  # evaluation after such training: one central crop of 87.5% of the resized side


def inception_box(width: int, height: int, rng: random.Random, scale=INCEPTION_SCALE, ratio=INCEPTION_RATIO,
                  attempts: int = 10) -> tuple[int, int, int, int]:
    """(left, top, crop width, crop height) of Szegedy et al.'s random-resized crop: an area fraction uniform in
    `scale` and an aspect ratio log-uniform in `ratio`, placed uniformly; after `attempts` draws that do not fit,
    the largest central box of an allowed aspect (the rule torchvision's RandomResizedCrop follows)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(attempts):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    aspect = width / height
    w, h = (width, round(width / ratio[0])) if aspect < ratio[0] else \
        (round(height * ratio[1]), height) if aspect > ratio[1] else (width, height)
    return (width - w) // 2, (height - h) // 2, w, h


def inception_transform(image: Image.Image, size: int, rng: random.Random, scale=INCEPTION_SCALE) -> torch.Tensor:
    """[3, size, size] uint8: an `inception_box` of `image` resized to size x size (bilinear), flipped
    horizontally half of the time (the paper's fine-tuning crop; `to_unit_range` makes it the model's input)."""
    left, top, w, h = inception_box(image.width, image.height, rng, scale)
    image = image.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def square_inception_transform(image: Image.Image, resize: int, crop: int, rng: random.Random,
                               min_area: float = INCEPTION_SCALE[0]) -> torch.Tensor:
    """[3, crop, crop] uint8 for training with data.crop=inception: the image resized to the square of `resize`
    that evaluation centre-crops (as `train_transform` starts), then an `inception_transform` of it whose area
    share is uniform in [min_area, 1]: the same aspect as evaluation sees, at scales down to min_area."""
    square = image.resize((resize, resize), Image.BILINEAR)
    return inception_transform(square, crop, rng, (min_area, INCEPTION_SCALE[1]))


def to_unit_range(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels (from `train_transform`) -> float in [-1, 1], as `to_tensor`; float input passes."""
    if pixels.dtype != torch.uint8:
        return pixels
    return pixels.float().div_(127.5).sub_(1.0)


def resized(image: Image.Image, resize: int, mode: str = "square", resample: str = "bilinear") -> Image.Image:
    """`image` resized as an image processor does: to resize x resize (`square`), or its shortest side to `resize`
    and the other to int(resize * long / short) (`shortest_edge`: CLIP's processor, transformers'
    `get_resize_output_image_size`)."""
    if mode == "square":
        size = (resize, resize)
    else:
        width, height = image.size
        short, long = min(width, height), max(width, height)
        other = int(resize * long / short)
        size = (resize, other) if width <= height else (other, resize)
    return image.resize(size, Image.Resampling[resample.upper()])  # VisionConfig.resample: Pillow's filter by name


def eval_transform(image: Image.Image, resize: int, crop: int, mode: str = "square",
                   resample: str = "bilinear", crop_round: str = "down") -> torch.Tensor:
    """[3, crop, crop] in [-1, 1]: `resized`, then the center crop, its top-left corner at half the margins rounded
    down (`down`: transformers' `center_crop`) or to the nearest pixel, halves to even (`nearest`: torchvision's
    `CenterCrop`, which OpenCLIP's preprocessing uses)."""
    image = resized(image, resize, mode, resample)
    if crop_round == "nearest":
        left, top = int(round((image.width - crop) / 2.0)), int(round((image.height - crop) / 2.0))
    else:
        left, top = (image.width - crop) // 2, (image.height - crop) // 2
    return to_tensor(image.crop((left, top, left + crop, top + crop)))


def naflex_transform(image: Image.Image, patch: int, max_patches: int, resample: str = "bilinear") -> torch.Tensor:
    """[max_patches, 3 * patch * patch + 3]: Siglip2's NaFlex input of one image in one fixed-shape tensor, so that it
    batches and caches as every other model's pixels do. The image is resized, its aspect kept, to the size
    transformers' Siglip2 processor picks (`get_image_size_for_max_num_patches`: the largest whole grid of patches
    that holds at most `max_patches`), cut into patches row by row (each patch's pixels row-major, channels last,
    in [-1, 1]), padded with zeros to `max_patches` rows; the last three columns are each row's mask (1 for a real
    patch) and the grid's height and width in patches (model/families.py `unpack_naflex`)."""
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    height, width = get_image_size_for_max_num_patches(image.height, image.width, patch, max_patches)
    pixels = to_tensor(image.resize((width, height), Image.Resampling[resample.upper()]))  # [3, H, W]
    rows, cols = height // patch, width // patch
    patches = pixels.reshape(3, rows, patch, cols, patch).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    out = torch.zeros(max_patches, patches.shape[1] + 3)
    out[: rows * cols, :-3] = patches
    out[: rows * cols, -3] = 1.0
    out[:, -2], out[:, -1] = rows, cols
    return out


def vision_transform(vision, resize: int = 0, crop: int = 0) -> functools.partial:
    """image -> the model's evaluation pixels, as its VisionConfig says (picklable: data workers apply it):
    `eval_transform` with its resize, crop, mode, filter and crop rounding (`resize` / `crop`: other sizes, for an
    evaluation at another resolution), or `naflex_transform` for a NaFlex model (which has no fixed size)."""
    if vision.resize_mode == "naflex":
        return functools.partial(naflex_transform, patch=vision.patch_size, max_patches=vision.max_num_patches,
                                 resample=vision.resample)
    return functools.partial(eval_transform, resize=resize or vision.resize_size, crop=crop or vision.image_size,
                             mode=vision.resize_mode, resample=vision.resample, crop_round=vision.crop_round)


def eval_pixels(image: Image.Image, resize: int, crop: int) -> torch.Tensor | Image.Image:
    """The evaluation tensor, or with crop=0 the image resized to resize x resize and left as a PIL
    image (fine-tuning keeps those in memory and draws random crops from them each step)."""
    return eval_transform(image, resize, crop) if crop else image.resize((resize, resize), Image.BILINEAR)
