"""Public dual encoders in transformers' format, behind the encoding interface of openalign's own `DualEncoder`.

    family    transformers class   image feature                         text feature
    clip      CLIPModel            visual_projection(post-norm CLS)      text_projection(the end-of-text token)
    siglip    SiglipModel          the attention-pooling head's output   head(the last position), texts padded to 64
    siglip2   Siglip2Model         the same, of NaFlex patches            the same

Each adapter answers what every stage asks of a model (model/encode.py): `encode_image(pixels, tokens=False)`
and `encode_text(ids, mask, tokens=False)` -> `Encoding`, `cfg` (a ModelConfig: `embed_dim`, the preprocessing
its processor files describe, `family`), `temperature` (1 / exp(logit_scale)) and `logit_bias` (SigLIP's). The
embeddings are transformers' own `get_image_features` / `get_text_features`, L2-normalized, on the pixels the
directory's image processor makes (its PIL twin, `CLIPImageProcessorPil` / `SiglipImageProcessorPil`, is the
reference: tests/model/test_families.py) and the token ids its tokenizer makes with the family's padding.
Nothing else branches on the family.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from openalign.config import ModelConfig, TextConfig, VisionConfig
from openalign.model.dual_encoder import Encoding, TwoTowers, tower_pixels

def unpack_naflex(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, max_patches, 3p^2 + 3] (data/transforms.py `naflex_transform`: the patches, then each row's mask and the
    grid's height and width) -> Siglip2Model's pixel_values [B, N, 3p^2] (in [-1, 1]), pixel_attention_mask [B, N]
    and spatial_shapes [B, 2]."""
    return packed[..., :-3], packed[..., -3].long(), packed[:, 0, -2:].long()


FAMILIES = {"clip": "CLIPModel", "siglip": "SiglipModel", "siglip2": "Siglip2Model"}  # model_type -> its class


class PublicDualEncoder(TwoTowers):
    """A CLIPModel or SiglipModel (`hf`) as openalign encodes with it (evaluation, embed, search, serve)."""

    def __init__(self, cfg: ModelConfig, hf: nn.Module):
        super().__init__()
        self.cfg, self.hf = cfg, hf
        self.keep_tokens = False

    @property
    def temperature(self) -> torch.Tensor:
        """The divisor of the cosine similarities in the model's own logits: 1 / exp(logit_scale)."""
        return torch.exp(-self.hf.logit_scale.detach().float().reshape(()))

    @property
    def image_features_dim(self) -> int:
        """Width of `encode_image(...).features`: the image embedding `get_image_features` returns (what a
        fine-tuning head reads, as OpenCLIP's fine-tuning reads `encode_image`)."""
        return self.cfg.embed_dim

    @property
    def logit_bias(self) -> torch.Tensor | None:
        bias = getattr(self.hf, "logit_bias", None)
        return None if bias is None else bias.detach().float().reshape(())

    def encode_image(self, pixel_values: torch.Tensor, tokens: bool = False) -> Encoding:
        """pixel_values [B, 3, H, W] in [-1, 1] (data/transforms.py), mapped to the processor's rescale and
        normalization; `tokens`: also the patch vectors in the joint space (CLIP: projected after the post-norm;
        SigLIP: its last hidden states, which the pooling head reads)."""
        if pixel_values.ndim == 3:  # NaFlex (Siglip2): patches, their mask and grid in one tensor (data/transforms.py)
            patches, mask, shapes = unpack_naflex(pixel_values)
            b, n, d = patches.shape  # each patch's pixels channels last: normalized per channel as [..., 3]
            patches = tower_pixels(self.cfg.vision, patches.reshape(b, n, d // 3, 3), channel_dim=-1).reshape(b, n, d)
            out = self.hf.get_image_features(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)
        else:
            mask = None
            out = self.hf.get_image_features(pixel_values=tower_pixels(self.cfg.vision, pixel_values))
        encoding = Encoding(embeds=F.normalize(out.pooler_output, dim=-1), features=out.pooler_output)
        if tokens:
            if self.cfg.family == "clip":
                cells = self.hf.visual_projection(self.hf.vision_model.post_layernorm(out.last_hidden_state[:, 1:]))
            else:
                cells = out.last_hidden_state
            encoding.tokens = F.normalize(cells, dim=-1)
            encoding.mask = mask.bool() if mask is not None else \
                torch.ones(cells.shape[:2], dtype=torch.bool, device=cells.device)
            encoding.token_norms = cells.norm(dim=-1)
        return encoding

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: bool = False) -> Encoding:
        out = self.hf.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        encoding = Encoding(embeds=F.normalize(out.pooler_output, dim=-1), features=out.pooler_output)
        if tokens:
            hidden = out.last_hidden_state
            cells = self.hf.text_projection(hidden) if self.cfg.family == "clip" else self.hf.text_model.head(hidden)
            encoding.tokens = F.normalize(cells, dim=-1)
            encoding.mask = attention_mask.bool()
        return encoding


def model_config(hf_config, family: str) -> ModelConfig:
    """The ModelConfig of a CLIPModel / SiglipModel checkpoint: its embedding width and text length, ViT sizes for
    the record; the preprocessing comes from its processor files (hub.vision_from_processor)."""
    v, t = hf_config.vision_config, hf_config.text_config
    embed_dim = hf_config.projection_dim if family == "clip" else getattr(t, "projection_size", None) or t.hidden_size
    # a NaFlex tower (Siglip2) has no fixed size: its nominal one is the square grid of its num_patches
    size = getattr(v, "image_size", None) or math.isqrt(v.num_patches) * v.patch_size
    return ModelConfig(
        vision=VisionConfig(kind="vit", patch_size=v.patch_size, hidden_size=v.hidden_size,
                            num_layers=v.num_hidden_layers, num_heads=v.num_attention_heads,
                            intermediate_size=v.intermediate_size, image_size=size, resize_size=size,
                            resample="bicubic", alpha="drop"),
        text=TextConfig(hidden_size=t.hidden_size, num_layers=t.num_hidden_layers, num_heads=t.num_attention_heads,
                        intermediate_size=t.intermediate_size, vocab_size=t.vocab_size, dropout=0.0,
                        max_length=t.max_position_embeddings,
                        padding="longest" if family == "clip" else "max_length"),
        embed_dim=embed_dim, channels_last=False, family=family)
