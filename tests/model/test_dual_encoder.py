import copy as copy_module
import dataclasses

import pytest
import torch
import transformers

from openalign import presets
from openalign.model import cls_only as cls_only_module
from openalign.model.dual_encoder import DualEncoder


def test_length_buckets_give_the_same_embeddings_and_gradients():
    cfg = presets.get("tiny").model
    torch.manual_seed(0)
    plain = DualEncoder(cfg).double().eval()  # eval: no dropout, so both see the same function
    bucketed = DualEncoder(dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, length_buckets=3))).double().eval()
    bucketed.load_state_dict(plain.state_dict())
    lengths = torch.tensor([3, 9, 2, 5, 9, 4, 7])
    ids = torch.randint(5, 300, (7, 9))
    mask = (torch.arange(9)[None, :] < lengths[:, None]).long()
    ids = ids * mask  # right padding with id 0
    out = []
    for model in (plain, bucketed):
        model.zero_grad()
        embeds = model.encode_text(ids, mask).embeds
        (embeds * torch.linspace(-1, 1, embeds.shape[1], dtype=embeds.dtype)).sum().backward()
        out.append((embeds.detach(), [p.grad.clone() for p in model.align.text_model.parameters()
                                      if p.grad is not None]))
    # transformers' eager attention takes its softmax in fp32 even for an fp64 model, so a row summed over 9
    # positions and the same row over 3 round differently where the CPU's vector width splits them (AVX2:
    # 1.5e-10 on the embeddings, 5.5e-9 on the gradients; AVX-512 machines agree exactly). A padding bug
    # would differ by ~1e-2.
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-7, atol=1e-9)
    for a, b in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def _text_grads(model, ids, mask, features):
    model.zero_grad()
    feats = features(model, ids, mask)
    (feats * torch.linspace(-1, 1, feats.shape[1], dtype=feats.dtype)).sum().backward()
    return feats.detach(), {n: p.grad.clone() for n, p in model.align.text_model.named_parameters() if p.grad is not None}


def test_cls_only_last_layer_equals_the_whole_layer():
    cfg = presets.get("tiny").model
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, num_layers=2))
    torch.manual_seed(0)
    model = DualEncoder(cfg).double().eval()
    assert model.align.text_model.encoder.layer[-1].forward.func is cls_only_module._forward
    lengths = torch.tensor([3, 9, 2, 5, 9])
    ids = torch.randint(5, 300, (5, 9))
    mask = (torch.arange(9)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    whole = _text_grads(model, ids, mask, lambda m, i, a: m.text_tower(input_ids=i, attention_mask=a).last_hidden_state[:, 0])
    routed = _text_grads(model, ids, mask, lambda m, i, a: m.text_features(i, a))
    torch.testing.assert_close(routed[0], whole[0], rtol=1e-9, atol=1e-10)
    assert routed[1].keys() == whole[1].keys()  # every text parameter still gets its gradient
    for name in whole[1]:
        torch.testing.assert_close(routed[1][name], whole[1][name], rtol=1e-7, atol=1e-9)
    with cls_only_module.cls_only():
        assert model.text_tower(input_ids=ids, attention_mask=mask).last_hidden_state.shape == (5, 1, cfg.text.hidden_size)
    # outside cls_only() (token vectors, late interaction) the layer is the library's: every token
    assert model.encode_text(ids, mask, tokens=True).tokens.shape[:2] == (5, 9)
    copy = copy_module.deepcopy(model)  # fine-tuning's Classifier copies the model: the routing follows the copy
    assert copy.align.text_model.encoder.layer[-1].forward.args[0] is copy.align.text_model.encoder.layer[-1]


@pytest.mark.skipif(not hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable"),
                    reason="an older transformers (5.18): train.grad_checkpointing is refused there (tests/test_cli.py)")
def test_cls_only_last_layer_under_activation_checkpointing():
    """The checkpointed last layer is recomputed in backward, outside cls_only(): it must recompute the same
    [CLS]-only function (a [B, T, H] recompute would not match what was saved)."""
    cfg = presets.get("tiny").model
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, num_layers=2, dropout=0.0))
    torch.manual_seed(0)
    plain = DualEncoder(cfg).double().train()
    checkpointed = copy_module.deepcopy(plain)
    checkpointed.text_tower.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ids, mask = torch.randint(5, 300, (4, 7)), torch.ones(4, 7, dtype=torch.long)
    grads = [_text_grads(model, ids, mask, lambda m, i, a: m.text_features(i, a))[1] for model in (plain, checkpointed)]
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-9, atol=1e-12)
