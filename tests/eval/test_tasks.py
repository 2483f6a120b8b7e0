import torch

from openalign import presets
from openalign.eval.tasks import EvalOptions, encode_texts
from openalign.model.dual_encoder import DualEncoder
from openalign.tokenizer import train_tokenizer


def test_length_ordered_text_encoding_equals_one_text_at_a_time():
    torch.manual_seed(0)
    model = DualEncoder(presets.get("tiny").model).eval()
    texts = ["a", "a red circle on white", "blue", "a long caption with many many words in it", "square", ""]
    tokenizer = train_tokenizer(texts * 5, 120, 16)
    together = encode_texts(model, tokenizer, texts, EvalOptions(batch_size=4, max_length=16))
    alone = torch.cat([encode_texts(model, tokenizer, [t], EvalOptions(batch_size=1, max_length=16)) for t in texts])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    assert encode_texts(model, tokenizer, [], EvalOptions()).shape == (0, model.cfg.embed_dim)
