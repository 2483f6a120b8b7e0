"""The fine-tuning crops of the paper's transfer protocols (data/transforms.py)."""

import math
import random

import numpy as np
import pytest
import torch
from PIL import Image

from openalign.data import transforms


def test_inception_crop_draws_area_and_aspect_from_szegedys_ranges():
    rng = random.Random(0)
    width, height = 400, 400  # square: draws that do not fit are as often wide as tall
    boxes = [transforms.inception_box(width, height, rng) for _ in range(10_000)]
    assert all(0 <= left and 0 <= top and left + w <= width and top + h <= height for left, top, w, h in boxes)
    drawn = [(w * h / (width * height), w / h) for _, _, w, h in boxes if (w, h) != (width, height)]
    areas, aspects = np.array([a for a, _ in drawn]), np.array([r for _, r in drawn])
    # rounding to whole pixels moves the area and aspect a little past the ranges' ends, never further
    assert areas.min() >= 0.08 * 0.97 and areas.max() <= 1.0
    assert aspects.min() >= 3 / 4 * 0.98 and aspects.max() <= 4 / 3 * 1.02
    assert areas.min() < 0.09 and areas.max() > 0.95  # the whole range is drawn
    assert aspects.min() < 0.76 and aspects.max() > 1.31
    assert abs(np.log(aspects).mean()) < 0.02  # log-uniform: symmetric about an aspect of 1
    assert len(drawn) > 9_500  # the fallback (the whole image) is rare


def test_inception_crop_falls_back_to_the_largest_central_box_of_an_allowed_aspect():
    class Never(random.Random):
        def uniform(self, a, b):  # an area of 100% at the widest aspect never fits a 1:10 image
            return b

    assert transforms.inception_box(100, 1000, Never(0)) == (0, 433, 100, 133)  # 100 / (3/4) = 133 tall, centred
    pixels = transforms.inception_transform(Image.new("RGB", (80, 60), (200, 10, 10)), 32, random.Random(1))
    assert pixels.shape == (3, 32, 32) and pixels.dtype == torch.uint8 and int(pixels[0].min()) == 200


def test_evaluation_takes_one_central_crop_of_seven_eighths_of_the_side():
    crop = 56
    resize = round(crop / transforms.CENTER_CROP_RATIO)
    assert resize == 64
    image = Image.fromarray(np.arange(64 * 64 * 3, dtype=np.uint32).reshape(64, 64, 3).astype(np.uint8))
    pixels = transforms.eval_transform(image, resize, crop)  # a 64x64 image is not resized: the crop is exact
    expected = np.asarray(image, dtype=np.float32)[4:60, 4:60] / 127.5 - 1.0
    assert torch.equal(pixels, torch.from_numpy(expected).permute(2, 0, 1))
    assert math.isclose(crop / resize, 0.875)


@pytest.mark.parametrize("size", [(289, 360), (475, 600)])
def test_the_papers_train_and_eval_resolutions_scale_with_the_model(size):
    from openalign.eval import protocols

    name = "imagenet-probe" if size[0] == 289 else "imagenet-finetune"
    at_289 = protocols.resolve(name, 289)
    assert (at_289.train_crop, at_289.crop, at_289.resize) == (size[0], size[1], round(size[1] / 0.875))
    small = protocols.resolve(name, 64)
    assert (small.train_crop, small.crop) == (round(size[0] * 64 / 289), round(size[1] * 64 / 289))
    assert protocols.resolve(name, 64, crop=50, resize=60).crop == 50  # --crop / --resize are kept


def test_the_inception_training_crop_is_drawn_from_the_square_evaluation_sees():
    # a 90 x 30 image whose left third is red, middle green, right blue: squared to 36 x 36, each third is 12 wide
    array = np.zeros((30, 90, 3), dtype=np.uint8)
    array[:, :30, 0], array[:, 30:60, 1], array[:, 60:, 2] = 255, 255, 255
    image = Image.fromarray(array)
    rng = random.Random(0)
    whole = transforms.square_inception_transform(image, 36, 32, rng, min_area=1.0)
    # an area share of 1 at an aspect in [3/4, 4/3] fits the square only as itself: the whole square, all colours
    expected = np.asarray(image.resize((36, 36), Image.BILINEAR).resize((32, 32), Image.BILINEAR))
    flipped = expected[:, ::-1]
    got = whole.permute(1, 2, 0).numpy()
    assert np.array_equal(got, expected) or np.array_equal(got, flipped)
    # small areas zoom in: most draws at min_area 0.08 see fewer than all three colours; at 1.0 every draw sees all
    def colours(pixels):
        return sum(int((pixels[c] > 200).any()) for c in range(3))

    small = [colours(transforms.square_inception_transform(image, 36, 32, rng, min_area=0.08)) for _ in range(200)]
    assert sum(c < 3 for c in small) > 50
    assert all(colours(transforms.square_inception_transform(image, 36, 32, rng, min_area=1.0)) == 3
               for _ in range(20))
