"""data.dedup_heldout: training images that are near-duplicates of a held-out image are left out, once."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from openalign import cli
from openalign.corpora import heldout
from openalign.data.tars import ShardWriter, encode_image, list_shards, read_samples
from tests.conftest import needs_emoji_data, two_small_sources


def drawing(seed: int, size: int = 96) -> Image.Image:
    """A clipart-like picture: a few random filled shapes on white, different for every seed."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x, y = rng.integers(0, size - 30, 2)
        w, h = rng.integers(15, 30, 2)
        box = (int(x), int(y), int(x + w), int(y + h))
        colour = tuple(int(c) for c in rng.integers(0, 255, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    return image


def recoloured(image: Image.Image) -> Image.Image:
    """The same drawing with every colour shifted a little and saved again: a near-duplicate, not a copy."""
    pixels = np.asarray(image).astype(int)
    return Image.fromarray(np.clip(pixels + np.array([12, -10, 8]), 0, 255).astype(np.uint8))


def shards(out, prefix: str, pictures: dict[str, Image.Image]) -> list[str]:
    writer = ShardWriter(out, prefix, 4)
    for key, image in pictures.items():
        writer.write(key, encode_image(image), "jpg", f"picture {key}", {})
    writer.close()
    return list_shards(str(out))


def test_a_near_duplicate_of_a_heldout_image_is_left_out_and_the_index_is_made_once(tmp_path):
    held = shards(tmp_path / "b-eval", "b", {"h0": drawing(100), "h1": drawing(101)})
    train = {"a": shards(tmp_path / "a-train", "a", {f"t{i}": drawing(i) for i in range(6)} |
                         {"copy": recoloured(drawing(100))}),
             "b": shards(tmp_path / "b-train", "b", {"u0": drawing(50), "u1": recoloured(drawing(101))})}
    index = heldout.build_heldout_keep_index(train, {"b": held}, tmp_path / "data", progress=False)
    kept = set(pq.read_table(index).column("key").to_pylist())
    assert kept == {f"t{i}" for i in range(6)} | {"u0"}
    report = heldout.report_of(index)
    assert report["removed"] == {"a train ~ b held-out": 1, "b train ~ b held-out": 1}
    assert report["train_images"] == {"a": 7, "b": 2} and report["heldout_images"] == {"b": 2}
    assert {e["train"] for e in report["examples"]} == {"a:copy", "b:u1"}
    # the training loader reads only what it keeps
    assert {s["__key__"] for s in read_samples(train["a"], keep=index)} == {f"t{i}" for i in range(6)}
    # made once: the same shards find the same index, untouched
    stamp = os.stat(index).st_mtime_ns
    assert heldout.build_heldout_keep_index(train, {"b": held}, tmp_path / "data", progress=False) == index
    assert os.stat(index).st_mtime_ns == stamp
    # a held-out split that changed is never answered with the old index
    held = shards(tmp_path / "b-eval", "b", {"h0": drawing(100)})
    again = heldout.build_heldout_keep_index(train, {"b": held}, tmp_path / "data", progress=False)
    assert again != index and "u1" in set(pq.read_table(again).column("key").to_pylist())


def openclipart_tree(root, pairs: int = 10) -> None:
    """A small tree in openclipart-png's layout: each drawing filed twice (the second a recoloured copy under
    another name), and some drawings 120 px, which the paper's image-size rule (> 200 px) would drop."""
    folder = root / "animals" / "birds"
    folder.mkdir(parents=True)
    for i in range(pairs):
        size = 120 if i % 2 else 240
        drawing(i, size).save(folder / f"bird_{i}_author_01.png")
        recoloured(drawing(i, size)).save(folder / f"bird_{i}_author_02.png")


@needs_emoji_data
def test_the_clipart_preset_trains_on_both_sources_without_heldout_duplicates(tmp_path, capsys):
    openclipart_tree(tmp_path / "png")
    options = (f"data.corpus_options=emoji.limit=60,openclipart.root={tmp_path / 'png'},openclipart.image_size=64,"
               "openclipart.heldout=0.3,openclipart.min_short_side=96,"
               + two_small_sources(tmp_path).removeprefix("data.corpus_options="))
    assert cli.main(["train", "--preset", "clipart", "--out", str(tmp_path / "run"), f"data.data_dir={tmp_path / 'd'}",
                     options, "model.vision.width_coefficient=0.25", "model.vision.depth_coefficient=0.25",
                     "model.text.num_layers=1", "model.text.hidden_size=32", "model.text.num_heads=2",
                     "model.text.intermediate_size=64", "model.embed_dim=80", "model.vision.resize_size=36",
                     "model.vision.image_size=32", "data.global_batch=8", "data.workers=0", "train.steps=2",
                     "train.eval_every=0", "train.checkpoint_every=0"]) == 0
    out = capsys.readouterr().out
    report = heldout.report_of(next(str(p) for p in (tmp_path / "d" / "keep-index").glob("heldout-*.parquet")))
    assert report["train_images"]["openclipart"] + report["heldout_images"]["openclipart"] == 20  # 120 px kept
    assert report["removed"].get("openclipart train ~ openclipart held-out", 0) >= 1  # a drawing's twin held out
    assert f"data.dedup_heldout: training on {sum(report['train_images'].values()) - report['removed_images']:,}" in out
    metrics = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert metrics["openclipart/n_images"] == report["heldout_images"]["openclipart"]
    assert metrics["emoji/n_images"] == report["heldout_images"]["emoji"] > 0
    # the real sources it never trains on are measured, and said to be
    assert set(report["train_images"]) == {"openclipart", "emoji"}
    assert metrics["tuxpaint/n_images"] == report["heldout_images"]["tuxpaint"] > 0 and metrics["icons/n_images"] > 0
    assert "tuxpaint alone, never trained on:" in out and "icons alone, never trained on:" in out


def test_dedup_heldout_is_refused_with_data_of_ones_own(tmp_path, shapes, capsys):
    assert cli.main(["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "r"),
                     "data.dedup_heldout=true"]) == 2
    assert "openalign dedup" in capsys.readouterr().err
