"""Compositional zero-shot on an oracle embedding space: colour and shape are orthogonal directions."""

import math

import pytest
import torch

from openalign.config import ConfigError
from openalign.eval import compositional
from openalign.eval import features
from openalign.eval.features import Context, EvalData
from openalign.eval.options import EvalOptions

COLOURS, SHAPES = ("red", "green", "blue"), ("circle", "star", "square")
DIM = 12


def direction(word: str) -> torch.Tensor:
    v = torch.zeros(DIM)
    v[(COLOURS + SHAPES).index(word)] = 1.0
    return v


def fake_encode_texts(model, tokenizer, texts, batch_size, max_length):
    rows = [sum((direction(w) for w in t.replace(",", " ").split() if w in COLOURS + SHAPES), torch.zeros(DIM))
            for t in texts]
    return torch.nn.functional.normalize(torch.stack(rows), dim=1)


def oracle_data(per_pair: int = 3) -> EvalData:
    """Images of every pair, (colour i, shape i) unseen; each image its pair's direction plus a little noise."""
    g = torch.Generator().manual_seed(0)
    embeds, attributes = [], []
    for i, c in enumerate(COLOURS):
        for j, s in enumerate(SHAPES):
            for _ in range(per_pair):
                noise = torch.zeros(DIM)
                noise[6:] = 0.05 * torch.randn(DIM - 6, generator=g)
                embeds.append(direction(c) + direction(s) + noise)
                attributes.append({"colour": c, "shape": s, "seen": i != j})
    n = len(embeds)
    return EvalData(torch.nn.functional.normalize(torch.stack(embeds), dim=1), [], torch.empty(0, dtype=torch.long),
                    [f"{a['colour']} {a['shape']}" for a in attributes], [str(i) for i in range(n)],
                    meta=[{"attributes": a} for a in attributes])


def test_oracle_space_classifies_unseen_pairs_and_swaps_colours(monkeypatch):
    monkeypatch.setattr(features, "encode_texts", fake_encode_texts)
    out, _ = compositional.compositional(Context(None, None, EvalOptions(), oracle_data()),
                                         compositional.CompositionalOptions(templates=("{}",)))
    assert out["unseen_top1"] == out["seen_top1"] == out["harmonic_top1"] == 1.0
    assert out["unseen_colour_top1"] == out["unseen_shape_top1"] == 1.0
    assert out["n_unseen_images"] == 9 and out["n_seen_images"] == 18 and out["n_classes"] == 9
    # image(c1, s) - "c1" + "c2" finds (c2, s); 3 unseen pairs x 2 seen sources of its shape x 3 images
    assert out["arithmetic_n_queries"] == 18
    assert out["arithmetic_r1"] == out["arithmetic_w2_r1"] == out["arithmetic_text_only_r1"] == 1.0
    assert out["arithmetic_w0_r1"] == 0.0  # the image alone finds its own pair first
    n, p = 27 - 1, 3  # chance: one of p targets among the n other images in the top k
    for k in (1, 5, 10):
        assert out[f"chance_arithmetic_r{k}"] == pytest.approx(1 - math.comb(n - p, k) / math.comb(n, k))


def test_data_without_attributes_is_a_one_line_error():
    data = oracle_data()
    data.meta = []
    with pytest.raises(ConfigError, match="shapes corpus"):
        compositional.compositional(Context(None, None, EvalOptions(), data))
