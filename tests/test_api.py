"""openalign.load (openalign/api.py): the notebook API over the functions the commands encode through."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import openalign
from openalign import cli, presets
from openalign.config import ConfigError
from openalign.model.dual_encoder import DualEncoder
from openalign.model.hub import save_pretrained
from openalign.tokenizer import train_tokenizer


def test_importing_the_data_layer_does_not_import_torch_through_the_api():
    code = "import sys, openalign, openalign.data.tables; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_api_gives_what_embed_stores_and_says_what_is_wrong(tmp_path):
    cfg = presets.get("tiny")
    model = DualEncoder(cfg.model).eval()
    save_pretrained(model, train_tokenizer(["a red circle", "a blue square"] * 5, vocab_size=40), tmp_path / "m", cfg)
    folder = tmp_path / "images"
    folder.mkdir()
    for i, color in enumerate(["red", "blue", "green"]):
        Image.new("RGBA", (40 + 9 * i, 31), color).save(folder / f"{i}.png")
    assert cli.main(["embed", str(tmp_path / "m"), "--images", str(folder), "--out", str(tmp_path / "e"), "--quiet"]) == 0
    m = openalign.load(tmp_path / "m", device="cpu")
    stored = torch.from_numpy(np.load(tmp_path / "e" / "part-000000.npy"))
    got = m.encode_images([folder / f"{i}.png" for i in range(3)])
    torch.testing.assert_close(got, stored, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(m.encode_images([Image.open(folder / "0.png")]), got[:1])  # a PIL image, as its path
    probs = m.classify([folder / "0.png", folder / "1.png"], ["red", "blue"], templates=["a {} circle", "{}"])
    assert m.head == "softmax" and probs.shape == (2, 2)
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(2))
    for templates in (["a circle"], ["{} {}"], ["{name}"], ["a { circle"]):  # before: "{} {}" raised IndexError
        with pytest.raises(ConfigError, match="must hold {} once"):
            m.classify([folder / "0.png"], ["red"], templates=templates)
    with pytest.raises(TypeError, match=r"encode_texts\(\['hello'\]\)"):  # before: five one-letter texts
        m.encode_texts("hello")
    with pytest.raises(TypeError, match="wrap it in a list"):
        m.encode_images(str(folder / "0.png"))
    with pytest.raises(ConfigError, match="is not a readable image"):
        (tmp_path / "bad.png").write_bytes(b"not a png")
        m.encode_images([tmp_path / "bad.png"])


def test_the_front_of_the_pipeline_is_public_and_does_not_import_torch():
    code = ("import sys, openalign; f = openalign.fetch; e = openalign.extract; "
            "o = openalign.FetchOptions(per_host=2); import openalign.pipeline.web.fetch as m; "
            "print(f is m.fetch, o.per_host, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "2", "False"]
    with pytest.raises(AttributeError):
        openalign.nothing_here  # noqa: B018
