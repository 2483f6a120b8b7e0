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


def test_a_pairs_file_is_read_by_the_rules_for_text_of_every_table(tmp_path, monkeypatch):
    """Before: the file was opened in the locale's encoding, strictly: a byte that is not UTF-8 (a Latin-1 STS file)
    was a UnicodeDecodeError traceback, and a BOM became part of the first column's name ("missing sentence1")."""
    seen = []

    def encode(model, tok, texts, batch_size, max_length):
        seen.extend(texts)
        return torch.tensor([[1.0, float(i)] for i, _ in enumerate(texts)])

    monkeypatch.setattr(features, "encode_texts", encode)
    (tmp_path / "sts.tsv").write_bytes(b"\xef\xbb\xbfsentence1\tsentence2\tscore\ncaf\xe9\tb\t4\na\tc\t2\na\td\t0\n")
    out = text_similarity.text_pair_similarity(Context(None, None, EvalOptions(), path=str(tmp_path / "sts.tsv")),
                                               "sts")
    assert out["n_pairs"] == 3 and "caf\ufffd" in seen
