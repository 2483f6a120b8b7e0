"""Image + text query arithmetic: the triplets read from CLDR names, and recalls equal to a brute-force oracle."""

import numpy as np
import pytest
import torch

from openalign.eval import arithmetic as A
from openalign.eval import features
from openalign.eval.features import Context, EvalData
from openalign.eval.options import EvalOptions
from openalign.index.search import combine

NAMES = ["waving hand", "waving hand: medium skin tone", "waving hand: dark skin tone", "man", "man: red hair",
         "person running", "woman running", "man running", "flag: Germany", "flag", "kiss: woman, man"]


def test_triplets_from_names():
    found = A.triplets(NAMES)
    assert found == [(0, "medium skin tone", 1), (0, "dark skin tone", 2), (3, "red hair", 4),
                     (5, "woman", 6), (5, "man", 7)]  # no "flag" base; no "kiss" image
    assert [A.kind_of(m) for _, m, _ in found] == ["skin_tone", "skin_tone", "hair", "gender", "gender"]


@pytest.fixture
def data(monkeypatch):
    g = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(len(NAMES), 8, generator=g, dtype=torch.float64), dim=-1)
    words = {w: torch.nn.functional.normalize(torch.randn(8, generator=g, dtype=torch.float64), dim=0)
             for w in ("medium skin tone", "dark skin tone", "red hair", "woman", "man")}
    monkeypatch.setattr(features, "encode_texts",
                        lambda model, tok, texts, batch_size, max_length: torch.stack([words[t] for t in texts]))
    return EvalData(images, [], torch.empty(0, dtype=torch.long), list(NAMES)), words


def brute_rank(query: np.ndarray, images: np.ndarray, source: int, target: int) -> int:
    scores = [float(query @ images[j]) for j in range(len(images))]
    return sum(1 for j, s in enumerate(scores) if j not in (source, target) and s >= scores[target])


def test_recalls_equal_a_brute_force_oracle(data):
    data, words = data
    metrics, figures = A.arithmetic(Context(None, None, EvalOptions(), data))
    images = data.image_embeds.numpy()
    found = A.triplets(NAMES)
    for weight in (0.0, 0.5, 2.0, 8.0, "text"):
        ranks = []
        for source, modifier, target in found:
            text = words[modifier].numpy()
            query = text if weight == "text" else combine(images[source][None], text[None, None], np.ones((1, 1)),
                                                          1.0, weight)[0]
            ranks.append(brute_rank(query, images, source, target))
        name = "text_only" if weight == "text" else f"w{weight:g}"
        assert metrics[f"{name}_r10"] == pytest.approx(np.mean([r < 10 for r in ranks]))
        assert metrics[f"{name}_r1"] == pytest.approx(np.mean([r < 1 for r in ranks]))
        if weight == 2.0:
            assert metrics["r1"] == pytest.approx(np.mean([r < 1 for r in ranks]))
            assert metrics["r5"] == pytest.approx(np.mean([r < 5 for r in ranks]))
    assert metrics["n_queries"] == 5 and metrics["skin_tone_n"] == 2 and metrics["gender_n"] == 2
    assert metrics["chance_r1"] == pytest.approx(1 / (len(NAMES) - 1))
    assert set(figures["arithmetic"]["recall"]) == {"skin_tone", "hair", "gender"}


def test_an_exact_sum_is_found_first(data):
    """When the target's embedding is exactly image + 2 x text (normalized), the paper's weights rank it first."""
    data, words = data
    images = data.image_embeds.clone()
    for source, modifier, target in A.triplets(NAMES):
        images[target] = torch.nn.functional.normalize(images[source] + 2 * words[modifier], dim=0)
    data.image_embeds = images
    metrics, _ = A.arithmetic(Context(None, None, EvalOptions(), data))
    assert metrics["r1"] == metrics["w2_r1"] == 1.0 and metrics["w0_r1"] < 1.0
