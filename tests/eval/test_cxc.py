import pytest
import torch

from openalign.config import ConfigError
from openalign.eval import cxc as cxc_lib
from openalign.eval import metrics as M
from openalign.eval import features
from openalign.eval.features import Context, EvalData
from openalign.eval.options import EvalOptions


def brute_ranks(queries, gallery, positives, exclude_self):
    """Oracle: for each query row, wrong gallery items scoring >= its best positive (python loops)."""
    ranks = []
    for q, pos in positives.items():
        scores = [float(queries[q] @ g) for g in gallery]
        best = max(scores[p] for p in pos)
        ranks.append(sum(1 for j, s in enumerate(scores) if s >= best and j not in pos and not (exclude_self and j == q)))
    return ranks


@pytest.fixture
def data(monkeypatch):
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(4, 6, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(8, 6, generator=g), dim=-1)
    literal = torch.nn.functional.normalize(torch.randn(1, 6, generator=g), dim=-1)
    captions = [f"caption {i}" for i in range(8)]
    vectors = dict(zip(captions, txt)) | {"a literal sentence": literal[0]}
    monkeypatch.setattr(features, "encode_texts", lambda model, tok, texts, batch_size, max_length: torch.stack(
        [vectors[t] for t in texts]) if texts else torch.empty(0, 6))
    return EvalData(img, captions, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), ["a", "b", "c", "d"],
                    keys=[f"/imgs/COCO_val2014_{i:012d}.jpg" for i in range(4)],
                    caption_ids=[str(100 + i) for i in range(8)])


def test_cxc_recalls_and_correlations_equal_a_brute_force_oracle(tmp_path, data):
    from scipy.stats import spearmanr

    sid = lambda i: f"COCO_val2014:sentid:{100 + i}"  # noqa: E731
    image = lambda i: f"COCO_val2014_{i:012d}.jpg"  # noqa: E731
    (tmp_path / "sts_test.csv").write_text(
        "caption1,caption2,agg_score,sampling_method\n"
        f"{sid(0)},{sid(5)},4.2,c2c\n{sid(1)},{sid(2)},3.0,c2c\n{sid(3)},{sid(6)},1.0,c2c\n"
        f"a literal sentence,{sid(7)},2.5,c2c\nCOCO_val2014:sentid:999,{sid(0)},5,c2c\n")
    (tmp_path / "sis_test.csv").write_text(
        "image1,image2,agg_score,sampling_method\n"
        f"{image(0)},{image(2)},3.5,i2i\n{image(1)},{image(3)},0.5,i2i\n{image(1)},{image(2)},2.0,i2i\n")
    (tmp_path / "sits_test.csv").write_text(
        "caption,image,agg_score,sampling_method\n"
        f"{sid(0)},{image(3)},4.0,c2i\n{sid(4)},{image(1)},1.0,c2i\n{sid(6)},{image(0)},2.0,c2i\n")
    out, _ = cxc_lib.cxc(Context(None, None, EvalOptions(), data), cxc_lib.CxcOptions(dir=str(tmp_path)))
    txt, img = torch.stack([torch.as_tensor(v) for v in features.encode_texts(0, 0, data.captions, 0, 0)]), data.image_embeds
    # text -> text: positives 0<->5 and 1<->2 (score >= 3), the query itself left out
    expected = brute_ranks(txt, txt, {0: {5}, 1: {2}, 2: {1}, 5: {0}}, exclude_self=True)
    assert out["t2t_n_queries"] == 4 and out["t2t_r1"] == pytest.approx(sum(r < 1 for r in expected) / 4)
    assert out["t2t_r5"] == pytest.approx(sum(r < 5 for r in expected) / 4)
    expected = brute_ranks(img, img, {0: {2}, 2: {0}}, exclude_self=True)
    assert out["i2i_n_queries"] == 2 and out["i2i_r1"] == pytest.approx(sum(r < 1 for r in expected) / 2)
    # image -> text: own captions plus caption 0 for image 3 (score 4); the 1.0 and 2.0 pairs are not positives
    own = {i: {2 * i, 2 * i + 1} for i in range(4)}
    expected = brute_ranks(img, txt, own | {3: {6, 7, 0}}, exclude_self=False)
    assert out["i2t_r1"] == pytest.approx(sum(r < 1 for r in expected) / 4)
    expected = brute_ranks(txt, img, {c: {c // 2} for c in range(8)} | {0: {0, 3}}, exclude_self=False)
    assert out["t2i_r1"] == pytest.approx(sum(r < 1 for r in expected) / 8)
    # correlations: the unknown sentid is counted, the literal sentence is encoded as text
    literal = features.encode_texts(0, 0, ["a literal sentence"], 0, 0)[0]
    sts = spearmanr([float(txt[0] @ txt[5]), float(txt[1] @ txt[2]), float(txt[3] @ txt[6]), float(literal @ txt[7])],
                    [4.2, 3.0, 1.0, 2.5]).statistic
    assert out["sts_spearman"] == pytest.approx(sts) and (out["sts_n_pairs"], out["sts_unmatched"]) == (4, 1)
    sis = spearmanr([float(img[0] @ img[2]), float(img[1] @ img[3]), float(img[1] @ img[2])], [3.5, 0.5, 2.0]).statistic
    assert out["sis_spearman"] == pytest.approx(sis)
    assert out["mean_spearman"] == pytest.approx((out["sts_spearman"] + out["sis_spearman"] + out["sits_spearman"]) / 3)
    assert 0 < out["chance_t2t_r1"] < out["chance_t2t_r5"] <= 1
    sts_cosines = [float(txt[0] @ txt[5]), float(txt[1] @ txt[2]), float(txt[3] @ txt[6]), float(literal @ txt[7])]
    assert (out["sts_spearman_boot_mean"], out["sts_spearman_boot_std"]) == pytest.approx(
        direct_bootstrap(sts_cosines, [4.2, 3.0, 1.0, 2.5], 1000, 0))


def direct_bootstrap(model, human, resamples, seed):
    """Oracle: scipy's Spearman on each resample drawn one at a time, skipping the undefined ones."""
    import numpy as np
    from scipy.stats import spearmanr

    draws = np.random.default_rng(seed).integers(0, len(model), size=(resamples, len(model)))
    rhos = []
    for rows in draws:
        x, y = [model[i] for i in rows], [human[i] for i in rows]
        if len(set(x)) > 1 and len(set(y)) > 1:
            rhos.append(spearmanr(x, y).statistic)
    return float(np.mean(rhos)), float(np.std(rhos, ddof=1))


def test_bootstrap_spread_of_spearman_equals_a_direct_computation():
    import numpy as np

    rng = np.random.default_rng(3)
    human = rng.integers(0, 6, 60).astype(float).tolist()  # CxC's 0-5 scores: many ties
    model = (np.asarray(human) + rng.normal(0, 2, 60)).tolist()
    mean, std = M.bootstrap_spearman(model, human, 500, seed=7)
    assert (mean, std) == pytest.approx(direct_bootstrap(model, human, 500, 7), rel=1e-9)
    assert 0 < std < 0.3 and M.bootstrap_spearman(model, human, 500, seed=8) != (mean, std)  # seeded


def test_cxc_needs_its_files(tmp_path, data):
    with pytest.raises(ConfigError, match="--cxc"):
        cxc_lib.cxc(Context(None, None, EvalOptions(), data))
    with pytest.raises(ConfigError, match="sts_test.csv"):
        cxc_lib.cxc(Context(None, None, EvalOptions(), data), cxc_lib.CxcOptions(dir=str(tmp_path)))
    (tmp_path / "sis_test.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="image1, image2"):
        cxc_lib.cxc(Context(None, None, EvalOptions(), data), cxc_lib.CxcOptions(dir=str(tmp_path)))
