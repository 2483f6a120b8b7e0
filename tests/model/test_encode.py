import torch

from openalign import presets
from openalign.model.dual_encoder import DualEncoder
from openalign.model.encode import encode_image_stream, encode_images, encode_texts, evaluating
from openalign.tokenizer import train_tokenizer


def _model(calibrate: torch.Tensor | None = None):
    torch.manual_seed(0)
    model = DualEncoder(presets.get("tiny").model)
    if calibrate is not None:  # BatchNorm statistics measured on the images (at their initial values an
        with torch.no_grad():  # untrained tower embeds every image alike; see conftest.save_tiny_model)
            for module in model.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    module.reset_running_stats()
                    module.momentum = None
            model.encode_image(calibrate)
    return model


def test_length_ordered_text_encoding_equals_one_text_at_a_time():
    model = _model().eval()
    texts = ["a", "a red circle on white", "blue", "a long caption with many many words in it", "square", ""]
    tokenizer = train_tokenizer(texts * 5, 120, 16)
    together = encode_texts(model, tokenizer, texts, batch_size=4, max_length=16)
    alone = torch.cat([encode_texts(model, tokenizer, [t], batch_size=1, max_length=16) for t in texts])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    assert encode_texts(model, tokenizer, [], 4, 16).shape == (0, model.cfg.embed_dim)


def test_image_stream_batches_equal_one_batch_and_keep_payloads_in_order():
    size = presets.get("tiny").model.vision.image_size
    pixels = torch.rand(7, 3, size, size, generator=torch.Generator().manual_seed(0)) * 2 - 1
    model = _model(pixels)
    whole = encode_images(model, pixels)
    got = list(encode_image_stream(model, ((f"p{i}", pixels[i]) for i in range(7)), batch_size=3))
    assert [len(payloads) for payloads, _ in got] == [3, 3, 1]
    assert [p for payloads, _ in got for p in payloads] == [f"p{i}" for i in range(7)]
    torch.testing.assert_close(torch.cat([v for _, v in got]), whole, rtol=1e-5, atol=1e-6)
    assert (whole[0] - whole[1]).abs().max() > 1e-3
    assert whole.dtype == torch.float32 and torch.allclose(whole.norm(dim=-1), torch.ones(7), atol=1e-5)


def test_evaluating_restores_the_training_mode_and_disables_autograd():
    model = _model().train()
    with evaluating(model):
        assert not model.training and not torch.is_grad_enabled()
    assert model.training and torch.is_grad_enabled()
    model.eval()
    with evaluating(model):
        pass
    assert not model.training


def test_evaluating_never_writes_to_a_model_already_in_eval_mode(monkeypatch):
    """A service's model is shared by concurrent requests: encoding must not flip its mode."""
    model = _model().eval()
    monkeypatch.setattr(model, "train", lambda mode=True: (_ for _ in ()).throw(AssertionError("mode flipped")))
    monkeypatch.setattr(model, "eval", lambda: (_ for _ in ()).throw(AssertionError("mode flipped")))
    size = model.cfg.vision.image_size
    assert encode_images(model, torch.zeros(1, 3, size, size)).shape == (1, model.cfg.embed_dim)
