import math

import pytest
import torch
import torch.nn.functional as F

from openalign import loss as L
from openalign.config import LossConfig
from openalign.loss import base, softmax


def naive_softmax_loss(img, txt, t, smoothing):
    logits = img @ txt.T / t
    labels = torch.arange(len(img))
    return (F.cross_entropy(logits, labels, label_smoothing=smoothing)
            + F.cross_entropy(logits.T, labels, label_smoothing=smoothing))


def test_hand_computed_two_pairs():
    # img = txt = identity: logits [[1/t, 0], [0, 1/t]] with t = 0.5 -> [[2, 0], [0, 2]]
    img = torch.eye(2, dtype=torch.float64)
    t = torch.tensor(0.5, dtype=torch.float64)
    p_pos = math.exp(2) / (math.exp(2) + 1)
    expected_plain = 2 * -math.log(p_pos)  # both directions, each the mean over 2 identical rows
    assert L.softmax_loss(img, img, t, 0.0).item() == pytest.approx(expected_plain, rel=1e-12)
    # smoothing 0.1 over K = 2 candidates: target (0.95, 0.05)
    expected_smooth = 2 * -(0.95 * math.log(p_pos) + 0.05 * math.log(1 - p_pos))
    assert L.softmax_loss(img, img, t, 0.1).item() == pytest.approx(expected_smooth, rel=1e-12)


def unit_rows(g: torch.Generator, n: int, d: int) -> torch.Tensor:
    """[n, d] fp64 unit rows, a leaf that takes gradients."""
    return F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1).requires_grad_()


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_equals_fp64_naive_reference_with_gradients(smoothing):
    g = torch.Generator().manual_seed(0)
    img = unit_rows(g, 16, 8)
    txt = unit_rows(g, 16, 8)
    t = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    ours = L.softmax_loss(img, txt, t, smoothing)
    ref = naive_softmax_loss(img, txt, t, smoothing)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    g_ours = torch.autograd.grad(ours, (img, txt, t))
    g_ref = torch.autograd.grad(ref, (img, txt, t))
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("implementation", ["naive", "chunked"])
def test_one_direction_is_one_cross_entropy_term(implementation):
    g = torch.Generator().manual_seed(3)
    img = F.normalize(torch.randn(12, 6, generator=g, dtype=torch.float64), dim=-1)
    txt = F.normalize(torch.randn(12, 6, generator=g, dtype=torch.float64), dim=-1)
    t, labels = torch.tensor(0.1, dtype=torch.float64), torch.arange(12)
    logits = img @ txt.T / t
    rows = F.cross_entropy(logits, labels, label_smoothing=0.1)  # each image picks its caption
    columns = F.cross_entropy(logits.T, labels, label_smoothing=0.1)  # each caption picks its image
    assert rows.item() != pytest.approx(columns.item(), rel=1e-3)  # the case tells the two apart
    for direction, expected in (("image_to_text", rows), ("text_to_image", columns), ("both", rows + columns)):
        got = L.contrastive_loss(img, txt, t, 0.1, implementation=implementation, direction=direction)
        assert got.item() == pytest.approx(expected.item(), rel=1e-12), direction


def test_temperature_floor_keeps_loss_finite():
    img = F.normalize(torch.randn(8, 4), dim=-1)
    t = L.create(LossConfig()).temperature({"temperature": torch.tensor(-3.0)})
    assert t.item() == pytest.approx(1e-3)
    assert torch.isfinite(L.softmax_loss(img, img.flip(0), t, 0.1))


def test_negatives_mask_keeps_positive_and_fraction():
    mask = L.negatives_mask(9, 0.5, torch.Generator().manual_seed(1))
    assert mask.diagonal().all()
    assert (mask.sum(dim=1) == 1 + 4).all()  # positive + round(0.5 * 8) negatives per row
    assert L.negatives_mask(9, 1.0, None) is None


def test_masked_loss_equals_loss_on_the_kept_columns():
    g = torch.Generator().manual_seed(2)
    img = F.normalize(torch.randn(6, 5, generator=g), dim=-1)
    txt = F.normalize(torch.randn(6, 5, generator=g), dim=-1)
    mask = L.negatives_mask(6, 0.4, g)
    logits = img @ txt.T / 0.1
    expected = 0.0
    for i in range(6):  # row by row: cross-entropy over the kept candidates only
        kept = mask[i].nonzero().flatten()
        target = (kept == i).nonzero().item()
        expected += F.cross_entropy(logits[i, kept][None], torch.tensor([target]), label_smoothing=0.1) / 6
    got = L.smoothed_cross_entropy(logits, 0.1, mask)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)


def test_sigmoid_loss_matches_pairwise_reference():
    g = torch.Generator().manual_seed(3)
    img = F.normalize(torch.randn(5, 4, generator=g), dim=-1)
    txt = F.normalize(torch.randn(5, 4, generator=g), dim=-1)
    t, b = torch.tensor(0.1), torch.tensor(-2.0)
    expected = 0.0
    for i in range(5):
        for j in range(5):
            z = (img[i] @ txt[j]) / t + b
            expected += -F.logsigmoid(z if i == j else -z) / 5
    assert L.sigmoid_loss(img, txt, t, b).item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_loss_equals_the_naive_loss_and_gradients(smoothing, chunk):
    g = torch.Generator().manual_seed(3)
    img = unit_rows(g, 23, 8)
    txt = unit_rows(g, 23, 8)
    t = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)
    ours = L.chunked_cross_entropy(img, txt, t, smoothing, columns=True, chunk=chunk)
    ref = naive_softmax_loss(img, txt, t, smoothing)
    assert abs(ours.item() - ref.item()) <= 1e-6 * abs(ref.item())
    for a, b in zip(torch.autograd.grad(ours, (img, txt, t)), torch.autograd.grad(ref, (img, txt, t))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_chunked_rows_with_an_offset_equal_cross_entropy_on_a_slice_of_columns():
    """One rank's rows against gathered columns: row i's positive is column offset + i."""
    g = torch.Generator().manual_seed(4)
    a = unit_rows(g, 4, 6)
    b = unit_rows(g, 12, 6)
    t = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    ours = L.chunked_cross_entropy(a, b, t, 0.1, offset=8, chunk=3)
    ref = F.cross_entropy(a @ b.T / t, torch.arange(8, 12), label_smoothing=0.1)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-10)
    for x, y in zip(torch.autograd.grad(ours, (a, b, t)), torch.autograd.grad(ref, (a, b, t))):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-10)


def naive_sigmoid(a, b, t, bias, offset=0):
    """Oracle: every pair's binary log-loss from a label matrix, +1 at (i, offset + i)."""
    labels = -torch.ones(len(a), len(b), dtype=a.dtype)
    labels[torch.arange(len(a)), torch.arange(offset, offset + len(a))] = 1.0
    return -F.logsigmoid(labels * (a @ b.T / t + bias)).sum() / len(a)


@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 64])  # 7 does not divide 23
def test_chunked_sigmoid_loss_equals_the_naive_loss_and_gradients(chunk):
    g = torch.Generator().manual_seed(5)
    img = unit_rows(g, 23, 8)
    txt = unit_rows(g, 23, 8)
    t = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True)
    ours = L.chunked_sigmoid_loss(img, txt, t, bias, chunk=chunk)
    ref = naive_sigmoid(img, txt, t, bias)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    assert L.sigmoid_loss(img, txt, t, bias).item() == pytest.approx(ref.item(), rel=1e-12)
    for x, y in zip(torch.autograd.grad(ours, (img, txt, t, bias)), torch.autograd.grad(ref, (img, txt, t, bias))):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_chunked_sigmoid_rows_with_an_offset_against_more_columns():
    """One rank's images against every rank's texts: row i's positive is column offset + i."""
    g = torch.Generator().manual_seed(6)
    a = unit_rows(g, 4, 6)
    b = unit_rows(g, 12, 6)
    t = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor(-1.5, dtype=torch.float64, requires_grad=True)
    ours = L.chunked_sigmoid_loss(a, b, t, bias, offset=8, chunk=3)
    ref = naive_sigmoid(a, b, t, bias, offset=8)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    for x, y in zip(torch.autograd.grad(ours, (a, b, t, bias)), torch.autograd.grad(ref, (a, b, t, bias))):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_chunked_sigmoid_keeps_no_block_for_the_backward():
    """The saved tensors are the inputs: nothing of size [n, m] waits for the backward."""
    a = torch.randn(300, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(300, 8, dtype=torch.float64, requires_grad=True)
    t, bias = torch.tensor(0.1, dtype=torch.float64, requires_grad=True), torch.tensor(-2.0, dtype=torch.float64)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x, lambda x: x):
        L.chunked_sigmoid_loss(a, b, t, bias, chunk=16).backward()
    assert max(saved) < 300 * 300 // 4  # the naive form keeps the [300, 300] logits


def test_chunked_loss_is_stable_at_extreme_temperatures():
    g = torch.Generator().manual_seed(5)
    img = F.normalize(torch.randn(40, 16, generator=g), dim=-1)
    txt = F.normalize(torch.randn(40, 16, generator=g), dim=-1)
    for t in (1e-3, 1e3):  # logits up to 1,000 in magnitude: exp would overflow without the shifts
        t = torch.tensor(t)
        ours = L.chunked_cross_entropy(img, txt, t, 0.1, columns=True, chunk=7)
        ref = L.softmax_loss(img.double(), txt.double(), t.double(), 0.1)
        assert torch.isfinite(ours) and ours.item() == pytest.approx(ref.item(), rel=1e-4)


def test_auto_picks_the_chunked_loss_for_large_batches(monkeypatch):
    calls = []
    monkeypatch.setattr(softmax, "chunked_cross_entropy", lambda *a, **k: calls.append(len(a[0])) or torch.tensor(0.0))
    x = torch.eye(8)
    L.contrastive_loss(x, x, torch.tensor(1.0), implementation="auto")
    monkeypatch.setattr(base, "AUTO_CHUNKED_FROM", 8)
    L.contrastive_loss(x, x, torch.tensor(1.0), implementation="auto")
    L.contrastive_loss(x, x, torch.tensor(1.0), negatives=torch.ones(8, 8, dtype=torch.bool), implementation="chunked")
    assert calls == [8]  # below the threshold and with a negatives mask: materialized
    assert [L.chunked(i, n) for i, n in (("auto", 7), ("auto", 8), ("naive", 9), ("chunked", 1))] == \
        [False, True, False, True]  # one rule, which softmax.gathered_softmax_loss uses too
    # an unknown implementation is refused once, when the config is checked, not on every call
    from openalign import presets
    from openalign.config import ConfigError, check, override

    with pytest.raises(ConfigError, match="must be auto, naive or chunked"):
        check(override(presets.get("tiny"), ["loss.implementation=fast"]))


def test_late_interaction_equals_a_hand_computed_case():
    # image: two patches e1, e2; text: tokens e1 and (e1 + e2)/sqrt2, then a padding token equal to e2
    e1, e2 = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)
    img = torch.stack([e1, e2])[None]  # [1, 2, 2]
    txt = torch.stack([e1, (e1 + e2) / math.sqrt(2), e2])[None]  # [1, 3, 2]
    i2t, t2i = L.late_interaction(img, torch.tensor([[True, True]]), txt, torch.tensor([[True, True, False]]))
    r = 1 / math.sqrt(2)
    # patch e1: best token e1 (1); patch e2: best real token (e1+e2)/sqrt2 (r), not the padding e2 (1)
    assert i2t.item() == pytest.approx((1 + r) / 2, rel=1e-12)
    # token e1: best patch e1 (1); token (e1+e2)/sqrt2: r with either patch
    assert t2i.item() == pytest.approx((1 + r) / 2, rel=1e-12)
    _, t2i_one_patch = L.late_interaction(img, torch.tensor([[False, True]]), txt, torch.tensor([[True, True, False]]))
    assert t2i_one_patch.item() == pytest.approx((0 + r) / 2, rel=1e-12)  # only patch e2 counts


def test_chunked_late_interaction_and_the_filip_loss_with_its_gradients():
    g = torch.Generator().manual_seed(4)
    img = F.normalize(torch.randn(6, 3, 5, generator=g, dtype=torch.float64), dim=-1).requires_grad_()
    txt = F.normalize(torch.randn(6, 4, 5, generator=g, dtype=torch.float64), dim=-1).requires_grad_()
    img_mask, txt_mask = torch.ones(6, 3, dtype=torch.bool), torch.rand(6, 4, generator=g) > 0.3
    txt_mask[:, 0] = True
    whole = L.late_interaction(img, img_mask, txt, txt_mask)
    for a, b in zip(L.late_interaction(img, img_mask, txt, txt_mask, chunk=4), whole):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)
    # the loss: label-smoothed cross-entropy of i2t's rows and t2i's columns, by torch's own cross_entropy
    t, labels = torch.tensor(0.1, dtype=torch.float64), torch.arange(6)
    ours = L.filip_loss(img, img_mask, txt, txt_mask, t, 0.1)
    ref = F.cross_entropy(whole[0] / t, labels, label_smoothing=0.1) + F.cross_entropy(whole[1].T / t, labels,
                                                                                         label_smoothing=0.1)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(ours, (img, txt)), torch.autograd.grad(ref, (img, txt))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_rank_bound_of_pooled_scores_and_its_escape_by_late_interaction():
    g = torch.Generator().manual_seed(5)
    d = 4
    img = F.normalize(torch.randn(40, 8, d, generator=g, dtype=torch.float64), dim=-1)  # 8 patches per image
    txt = F.normalize(torch.randn(40, 5, d, generator=g, dtype=torch.float64), dim=-1)  # 5 tokens per text
    pooled = F.normalize(img.mean(dim=1), dim=-1) @ F.normalize(txt.mean(dim=1), dim=-1).T  # [40, 40]
    assert torch.linalg.matrix_rank(pooled).item() == d  # one dot product in d dimensions: rank d
    i2t, t2i = L.late_interaction(img, torch.ones(40, 8, dtype=torch.bool), txt, torch.ones(40, 5, dtype=torch.bool))
    assert torch.linalg.matrix_rank(i2t).item() == 40 and torch.linalg.matrix_rank(t2i).item() == 40  # full rank
