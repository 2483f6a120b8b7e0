import dataclasses

import torch

from openalign import presets
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
