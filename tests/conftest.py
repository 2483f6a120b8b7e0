import io
import json
import random
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from openalign.data.shards import ShardWriter

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (240, 210, 20)}
SHAPES = ("circle", "square", "triangle")


def shape_image(color: str, shape: str, size: int = 40) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    box = (6, 6, size - 6, size - 6)
    if shape == "circle":
        draw.ellipse(box, fill=COLORS[color])
    elif shape == "square":
        draw.rectangle(box, fill=COLORS[color])
    else:
        draw.polygon([(size // 2, 6), (size - 6, size - 6), (6, size - 6)], fill=COLORS[color])
    return image


def jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_shapes(out: Path, n: int, per_shard: int, seed: int = 0, corrupt: int = 0) -> dict:
    """Coloured-shape pairs with two captions each; `corrupt` samples get undecodable image bytes."""
    rng = random.Random(seed)
    writer = ShardWriter(out, "shapes", per_shard)
    for i in range(n):
        color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
        texts = [f"a {color} {shape}", f"{shape}, {color}"]
        data = b"not an image" if i < corrupt else jpeg(shape_image(color, shape))
        writer.write(f"s{i:05d}", data, "jpg", texts[0], {"texts": texts, "name": f"{color} {shape}"})
    return writer.close()


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    write_shapes(root / "train", 96, 24, seed=0, corrupt=2)
    write_shapes(root / "eval", 24, 24, seed=1)
    return {"train": root / "train", "eval": root / "eval"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]
