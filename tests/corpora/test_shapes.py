"""The built-in shapes corpus: unseen colour-shape pairs stay out of training; every colour and shape is in it."""

import pytest

from openalign.config import ConfigError
from openalign.corpora import shapes
from openalign.data.tars import list_shards, read_samples, sample_meta, sample_texts


def test_heldout_pairs_cover_each_colour_and_shape_once():
    unseen = shapes.heldout_combos()
    assert len(unseen) == len(shapes.COLOURS) == len(shapes.SHAPES)
    assert {c for c, _ in unseen} == set(shapes.COLOURS) and {s for _, s in unseen} == set(shapes.SHAPES)


def test_build_keeps_unseen_pairs_out_of_training(tmp_path):
    summary = shapes.build(tmp_path, per_combo=2, eval_seen=1, eval_unseen=3, noise=0.5, seed=1)
    unseen = shapes.heldout_combos()
    assert summary["train_images"] == 56 * 2 and summary["eval_images"] == 56 + 8 * 3
    train = [sample_meta(s) for s in read_samples(list_shards(str(tmp_path / "train")))]
    names = {m["name"] for m in train}
    assert not names & {f"{c} {s}" for c, s in unseen} and len(names) == 56
    assert {n.split()[0] for n in names} == set(shapes.COLOURS) and {n.split()[1] for n in names} == set(shapes.SHAPES)
    kinds = [k for m in train for k in m["noise"]]
    assert set(kinds) == {"clean", *shapes.NOISE_KINDS} and sum(summary["noise_texts"].values()) == \
        sum(k != "clean" for k in kinds)
    held = list(read_samples(list_shards(str(tmp_path / "eval"))))
    attrs = [sample_meta(s)["attributes"] for s in held]
    assert sum(not a["seen"] for a in attrs) == 24
    assert all(((a["colour"], a["shape"]) in unseen) == (not a["seen"]) for a in attrs)
    assert sample_texts(held[0]) == [f"a {attrs[0]['colour']} {attrs[0]['shape']}",
                                     f"{attrs[0]['shape']}, {attrs[0]['colour']}"]  # held-out texts are clean


def test_bad_options_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="noise must be in"):
        shapes.build(tmp_path, noise=2.0)
    with pytest.raises(ConfigError, match="at least 1"):
        shapes.build(tmp_path, per_combo=0)


def test_shapes_scenes_name_their_objects_and_the_swapped_caption(tmp_path):
    shapes.build(tmp_path / "rel", per_combo=1, eval_seen=1, scene="relation")
    meta = [sample_meta(s) for s in read_samples(list_shards(str(tmp_path / "rel" / "eval")))]
    a, b = meta[0]["objects"]
    assert meta[0]["texts"][0] == f"a {a} {meta[0]['relation']} a {b}"
    assert meta[0]["swapped"] == f"a {b} {meta[0]['relation']} a {a}"
    assert all(m["objects"][0].split()[0] != m["objects"][1].split()[0] for m in meta)  # colours differ
    shapes.build(tmp_path / "obj", per_combo=1, eval_seen=1, scene="objects")
    meta = [sample_meta(s) for s in read_samples(list_shards(str(tmp_path / "obj" / "eval")))]
    assert {len(m["objects"]) for m in meta} == {2, 3} and all(m["texts"][0] == f"a {m['objects'][0]}" for m in meta)
    with pytest.raises(ConfigError, match="scene must be one of"):
        shapes.build(tmp_path / "x", scene="crowd")
