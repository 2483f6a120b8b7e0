"""--task multilingual on shards whose images carry their texts per language (the built-in emoji corpus)."""

import pytest
import torch

from openalign.eval import multilingual as ml
from openalign.eval import features
from openalign.eval.features import Context, EvalData
from openalign.eval.options import EvalOptions

WORDS = ("cat", "dog", "sun", "moon")
GERMAN = {"Katze": "cat", "Hund": "dog", "Sonne": "sun", "Mond": "moon"}


def fake_encode_texts(model, tokenizer, texts, batch_size, max_length):
    """English words point at their image; German ones at the next image (a model that knows no German)."""
    rows = []
    for t in texts:
        i = WORDS.index(t) if t in WORDS else (WORDS.index(GERMAN[t]) + 1) % len(WORDS)
        rows.append(torch.eye(len(WORDS))[i])
    return torch.stack(rows)


def test_per_language_recall_on_one_gallery_of_images_with_every_language(monkeypatch):
    monkeypatch.setattr(features, "encode_texts", fake_encode_texts)
    by_language = [{"en": [w], "de": [g]} for w, g in zip(WORDS, GERMAN)]
    by_language.append({"en": ["cat"]})  # no German text: not in the gallery of any language
    images = torch.cat([torch.eye(len(WORDS)), torch.eye(len(WORDS))[:1]])
    data = EvalData(images, [], torch.empty(0, dtype=torch.long), list(WORDS) + ["extra"],
                    [str(i) for i in range(5)], meta=[{"texts_by_language": t} for t in by_language])
    out, _ = ml.multilingual(Context(None, None, EvalOptions(), data))
    assert out["n_images"] == 4 and out["languages"] == "de,en"
    assert out["en_i2t_r1"] == out["en_t2i_r1"] == out["en_mean_recall"] == 1.0
    assert out["de_i2t_r1"] == out["de_t2i_r1"] == 0.0  # every German text ranks its image second of four
    assert out["de_i2t_r5"] == 1.0 and out["chance_de_t2i_r1"] == pytest.approx(1 / 4)
    assert out["mean_recall"] == pytest.approx((out["en_mean_recall"] + out["de_mean_recall"]) / 2)
