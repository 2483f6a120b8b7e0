"""openalign in a notebook: any model directory `openalign embed` takes, in three lines.

    import openalign
    m = openalign.load("runs/x/model")                  # or a CLIP / SigLIP directory (docs/models.md)
    m.encode_images([Image.open("cat.jpg"), "dog.png"])  # [n, D] float32, L2-normalized
    m.encode_texts(["a cat", "a dog"])                   # [n, D]
    m.classify(images, ["cat", "dog"], templates=["a photo of a {}."])   # [n, C] probabilities

The same functions the commands encode through (model/encode.py), on the same pixels (the model's evaluation
transform, its transparency rule) and token ids (its tokenizer, its padding), so a vector here equals the one
`openalign embed` stores and `openalign eval` scores. `openalign.load` is imported lazily: `import openalign.data`
in a pool worker or a Spark executor does not import torch through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable

import torch
from PIL import Image

from openalign.config import Config, ConfigError
from openalign.data import images as image_lib
from openalign.data import transforms
from openalign.eval import metrics
from openalign.eval.datasets import check_templates
from openalign.model.dual_encoder import TwoTowers
from openalign.model.encode import encode_images, encode_texts, load_for_inference

__all__ = ["Model", "load"]


@dataclass
class Model:
    """A loaded model with its tokenizer and config; see the module's docstring."""

    model: TwoTowers  # openalign's DualEncoder or a public family's (model/families.py)
    tokenizer: object
    cfg: Config

    @property
    def head(self) -> str:
        """`softmax` or `sigmoid`: how the model turns similarities into probabilities (TwoTowers.head)."""
        return self.model.head

    def preprocess(self, image: Image.Image | str | Path) -> torch.Tensor:
        """[3, H, W]: the model's evaluation pixels of an image (a PIL image, or a file's path)."""
        if isinstance(image, (str, Path)):
            try:
                image = image_lib.load_rgb(Path(image).read_bytes(), alpha=self.cfg.model.vision.alpha)
            except OSError as err:
                raise ConfigError(f"cannot read {image}: {err.strerror or err}") from None
            except image_lib.BadImage as err:
                raise ConfigError(f"{image} is not a readable image ({err.reason})") from None
        else:
            image = image_lib.to_rgb(image, self.cfg.model.vision.alpha)
        return transforms.vision_transform(self.cfg.model.vision)(image)

    def encode_images(self, images: Iterable[Image.Image | str | Path], batch_size: int = 64) -> torch.Tensor:
        """[n, D] L2-normalized image embeddings, in input order."""
        if isinstance(images, (str, Path, Image.Image)):  # list("a.jpg") would be five "images"
            raise TypeError("encode_images takes a list of images (PIL images or paths); for one, wrap it in a list")
        images = list(images)
        out = [encode_images(self.model, torch.stack([self.preprocess(i) for i in images[start:start + batch_size]]))
               for start in range(0, len(images), batch_size)]
        return torch.cat(out) if out else torch.empty(0, self.cfg.model.embed_dim)

    def encode_texts(self, texts: Iterable[str], batch_size: int = 256) -> torch.Tensor:
        """[n, D] L2-normalized text embeddings, in input order."""
        if isinstance(texts, str):  # list("hello") would embed five one-letter texts
            raise TypeError(f"encode_texts takes a list of texts; for one text, write encode_texts([{texts[:40]!r}])")
        if self.tokenizer is None:
            raise ConfigError("this model directory has no tokenizer; save one beside it (tokenizer.json, vocab.txt, "
                              "spiece.model, ...) to encode texts")
        return encode_texts(self.model, self.tokenizer, list(texts), batch_size, self.cfg.model.text.max_length)

    def classifier(self, labels: list[str], templates: Iterable[str] = ("{}",)) -> torch.Tensor:
        """[C, D] zero-shot class embeddings: each label in every template (`{}` for the label), the templates'
        embeddings normalized, averaged and normalized again (`openalign eval --task zeroshot`'s)."""
        templates = list(check_templates([templates] if isinstance(templates, str) else templates))
        if not labels or not templates or isinstance(labels, str):
            raise ConfigError("give a list of at least one label, and templates that each hold {} for the label")
        return metrics.class_weights(self.encode_texts([t.format(label) for label in labels for t in templates]),
                                     len(labels))

    def classify(self, images: Iterable[Image.Image | str | Path], labels: list[str],
                 templates: Iterable[str] = ("{}",)) -> torch.Tensor:
        """[n, C] probabilities of each label for each image under the model's own head (`head`): cosine
        similarity / T (+ the bias), then softmax over the labels or each pair's sigmoid."""
        temperature, bias = self.model.temperature_and_bias()
        logits = self.encode_images(images) @ self.classifier(labels, templates).T
        return metrics.probabilities(logits / temperature + bias, self.head).float()


def load(path: str | Path, device: str = "auto") -> Model:
    """The model directory at `path` (openalign's own, AlignModel, VisionTextDualEncoderModel, CLIPModel or
    SiglipModel) on `device` (`auto`: the GPU when there is one), ready to encode."""
    model, tokenizer, cfg = load_for_inference(Path(path), device)
    return Model(model, tokenizer, cfg)
