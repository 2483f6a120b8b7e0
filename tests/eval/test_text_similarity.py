import pytest
import torch

from openalign.config import ConfigError
from openalign.eval import features, text_similarity
from openalign.eval.features import Context
from openalign.eval.options import EvalOptions


def test_text_pair_spearman_against_an_exact_model(tmp_path, monkeypatch):
    """With embeddings whose cosines are known, the task returns scipy's Spearman of those cosines."""
    vectors = {"a": [1.0, 0.0], "b": [0.8, 0.6], "c": [0.0, 1.0], "d": [-1.0, 0.0]}
    monkeypatch.setattr(features, "encode_texts", lambda model, tok, texts, batch_size, max_length: torch.tensor(
        [vectors[t] for t in texts]))
    (tmp_path / "sts.csv").write_text("sentence1,sentence2,score\na,b,4\na,c,2\na,d,0\nb,c,3\n")
    # cosines: a-b 0.8, a-c 0, a-d -1, b-c 0.6 -> same order as the scores: Spearman 1
    ctx = Context(None, None, EvalOptions(), path=str(tmp_path / "sts.csv"))
    out = text_similarity.text_pair_similarity(ctx, "sts")
    assert out == {"spearman": 1.0, "n_pairs": 4}
    (tmp_path / "bad.csv").write_text("x,y\n1,2\n")
    with pytest.raises(ConfigError, match="sentence1, sentence2"):
        text_similarity.text_pair_similarity(Context(None, None, EvalOptions(), path=str(tmp_path / "bad.csv")), "sts")
