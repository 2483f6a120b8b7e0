"""ALIGN's dual encoder built from transformers' towers, with an EfficientNet or a ViT image tower.

model.vision.kind=efficientnet (the paper):
  image: EfficientNet (AlignVisionModel) -> global average pool of the last block (no top 1x1 conv)
         [-> linear layer to embed_dim when the tower's pooled width differs] -> L2 normalize
  text:  BERT (AlignTextModel, no pooler) -> [CLS] -> linear projection to embed_dim -> L2 normalize
  The towers, the text projection and the temperature live in a `transformers.AlignModel` (`self.align`).
model.vision.kind=vit (CLIP's towers' layout):
  image: ViT (CLIPVisionModel) -> post-norm CLS token (or the mean of the patch tokens, model.vision.pool)
         -> linear projection (no bias) -> L2 normalize
  text:  BERT (BertModel with its pooler) -> pooled [CLS] -> linear projection (no bias) -> L2 normalize
  The towers and projections live in a `transformers.VisionTextDualEncoderModel` (`self.dual`), so
  plain transformers' get_image_features / get_text_features give the same embeddings (cls pooling).
Both have one learned temperature T shared by both directions, learned as the loss kind says
(loss.temperature.parameterization): raw, T itself (the paper's divisor: AlignModel's own `temperature`, or the ViT's
`vit_temperature` beside its HF model), or log, `logit_scale` = log(1/T) beside the HF model (CLIP's and SigLIP's).
Before saving, T is written where transformers reads it: AlignModel's `temperature`, VisionTextDualEncoderModel's
logit_scale = log(1/T) (hub.py).
The two are the kinds EfficientNetDualEncoder and ViTDualEncoder of DualEncoder: a new kind of image tower is
one more class here (and its config in presets.py).
model.family=clip with model.init_from (`train --init` a CLIPModel directory): CLIPDualEncoder
  CLIP's towers as the checkpoint has them (its ViT, its causal text transformer pooled at the end-of-text token, both
  projections), fine-tuned with openalign's losses; its logit_scale holds the learned temperature when saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (AlignConfig, AlignModel, AlignTextConfig, AlignVisionConfig, BertConfig, CLIPModel,
                          CLIPVisionConfig, VisionTextDualEncoderConfig, VisionTextDualEncoderModel)

from openalign import loss as loss_lib
from openalign.config import ConfigError, LossConfig, ModelConfig, VisionConfig
from openalign.model.cls_only import cls_only, use_cls_only_last_layer
from openalign.model.depthwise import use_fast_depthwise


@dataclass
class Encoding:
    embeds: torch.Tensor  # [B, D] L2-normalized joint-space embeddings
    features: torch.Tensor  # [B, D_tower] tower output before projection and normalization
    # late interaction (with `tokens=True`): one L2-normalized joint-space vector per image patch (ViT) or last
    # feature-map cell (EfficientNet), or per text token, [B, N, D]; and which of them are real, [B, N] bool
    tokens: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    token_norms: torch.Tensor | None = None  # [B, N] each token vector's norm before normalization (salience)


def _text_kwargs(cfg: ModelConfig, pad_token_id: int) -> dict:
    t = cfg.text
    return dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size, num_hidden_layers=t.num_layers,
                num_attention_heads=t.num_heads, intermediate_size=t.intermediate_size, hidden_dropout_prob=t.dropout,
                attention_probs_dropout_prob=t.dropout, max_position_embeddings=max(t.max_length, 64),
                pad_token_id=pad_token_id)


def hf_vit_config(cfg: ModelConfig, pad_token_id: int = 0, temperature_init: float = 1.0
                  ) -> VisionTextDualEncoderConfig:
    """The VisionTextDualEncoderConfig of a kind=vit model: CLIP's vision transformer and BERT."""
    v = cfg.vision
    vision = CLIPVisionConfig(hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                              num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads,
                              image_size=v.image_size, patch_size=v.patch_size, projection_dim=cfg.embed_dim)
    return VisionTextDualEncoderConfig.from_vision_text_configs(
        vision, BertConfig(**_text_kwargs(cfg, pad_token_id)), projection_dim=cfg.embed_dim,
        logit_scale_init_value=math.log(1.0 / temperature_init))


def hf_config(cfg: ModelConfig, pad_token_id: int = 0, temperature_init: float = 1.0) -> AlignConfig:
    v = cfg.vision
    if v.kind == "vit":
        raise ValueError("hf_config describes EfficientNet models; kind=vit models use hf_vit_config")
    vision = AlignVisionConfig(
        width_coefficient=v.width_coefficient,
        depth_coefficient=v.depth_coefficient,
        in_channels=list(v.in_channels),
        out_channels=list(v.out_channels),
        num_block_repeats=list(v.num_block_repeats),
        kernel_sizes=list(v.kernel_sizes),
        strides=list(v.strides),
        expand_ratios=list(v.expand_ratios),
        drop_connect_rate=v.drop_connect_rate,
        batch_norm_momentum=v.batch_norm_momentum,
        batch_norm_eps=v.batch_norm_eps,
        image_size=v.image_size,
    )
    text = AlignTextConfig(**_text_kwargs(cfg, pad_token_id))
    return AlignConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        projection_dim=cfg.embed_dim,
        temperature_init_value=temperature_init,
    )


def vision_pooled_dim(align: AlignModel) -> int:
    return align.vision_model.encoder.blocks[-1].projection.project_conv.out_channels


class TwoTowers(nn.Module):
    """What every stage asks of a model (model/encode.py, eval, index, serve): `cfg` (a ModelConfig),
    `encode_image(pixels, tokens=False)` and `encode_text(ids, mask, tokens=False)` -> `Encoding`, the scoring
    head's `temperature` and `logit_bias` (None: a softmax head), and the towers of its transformers model `hf`.
    openalign's DualEncoder and the public families (model/families.py) are its kinds."""

    @property
    def vision_tower(self) -> nn.Module:
        return self.hf.vision_model

    @property
    def text_tower(self) -> nn.Module:
        return self.hf.text_model

    @property
    def head(self) -> str:
        """How similarities become probabilities: `softmax` over the candidates (CLIP, ALIGN), or `sigmoid`, each
        (image, text) pair on its own (SigLIP, sigmoid-trained models: those with a logit bias)."""
        return "softmax" if self.logit_bias is None else "sigmoid"

    def temperature_and_bias(self) -> tuple[float, float]:
        """(temperature, bias) of the head's logits, cosine / temperature + bias (bias 0 for a softmax head)."""
        bias = 0.0 if self.logit_bias is None else float(self.logit_bias.detach())
        return float(self.temperature.detach().clamp(min=1e-6)), bias


def tower_pixels(v: VisionConfig, unit: torch.Tensor, channel_dim: int = -3) -> torch.Tensor:
    """[-1, 1] pixels -> the tower's own input (VisionConfig.pixel_*): identity for openalign's models.
    `channel_dim`: where the colour channels are (-3: [..., 3, H, W]; -1: channels last, as NaFlex patches)."""
    if v.pixel_scale == 1 / 127.5 and v.pixel_offset == -1.0 and not v.pixel_mean:
        return unit
    x = (unit + 1.0) * 127.5 * v.pixel_scale + v.pixel_offset  # back to 0..255, then the checkpoint's rescale
    if v.pixel_mean:
        shape = (3,) + (1,) * (-channel_dim - 1)
        mean = torch.tensor(v.pixel_mean, dtype=x.dtype, device=x.device).reshape(shape)
        std = torch.tensor(v.pixel_std, dtype=x.dtype, device=x.device).reshape(shape)
        x = (x - mean) / std
    return x


class DualEncoder(TwoTowers):
    """openalign's dual encoder. `DualEncoder(cfg)` builds the kind of image tower `cfg.vision.kind` names,
    EfficientNetDualEncoder or ViTDualEncoder (as `pathlib.Path(...)` is a PosixPath): each holds its
    transformers model and says how its towers pool and which blocks they repeat; nothing here asks which
    kind it is."""

    def __new__(cls, cfg: ModelConfig | None = None, *args, **kwargs):
        if cls is DualEncoder and cfg is not None:
            cls = PUBLIC_TOWERS.get(cfg.family) or IMAGE_TOWERS[cfg.vision.kind]
        return super().__new__(cls)

    def __init__(self, cfg: ModelConfig, loss: LossConfig | None = None,
                 hf: AlignModel | VisionTextDualEncoderModel | None = None):
        """`hf`: an already built (loaded) transformers model of the configured kind, else a new one."""
        super().__init__()
        loss = loss or LossConfig()
        self.cfg = cfg
        kind = loss_lib.kind_of(loss)
        self.keep_tokens = kind.tokens  # forward() returns token vectors too (a late-interaction loss)
        self.image_projection = None
        start = kind.initial_scalars(loss)
        self.build(hf, start["temperature"])
        self.temperature_settings, self.learned_as = loss.temperature, kind.learned_as(loss)
        if self.learned_as == "log":  # log(1/T) is learned beside the tower's raw T, written into it when saved
            self.raw_temperature.requires_grad_(False)
            self.logit_scale = nn.Parameter(-torch.log(self.raw_temperature.detach().float()).clone())
        if loss.temperature.fixed > 0:
            self.set_temperature(loss.temperature.fixed)
            self.temperature_parameter.requires_grad_(False)
        # a logit bias (SigLIP's), where the loss kind learns one
        self.logit_bias = nn.Parameter(torch.tensor(float(start["bias"]))) if "bias" in start else None
        self.speed_up()

    # ------------------------------------------------------------------ what each kind of image tower says

    def build(self, hf, temperature_init: float) -> None:
        """The transformers model holding the towers (`hf` when given, else one whose temperature starts at
        `temperature_init`), and the parameters it lacks."""
        raise NotImplementedError

    def speed_up(self) -> None:
        """Faster kernels for this tower's layers, where there are some (the weights are unchanged)."""

    @property
    def hf(self) -> AlignModel | VisionTextDualEncoderModel:
        """The transformers model holding the towers (what hub.py saves)."""
        raise NotImplementedError

    @property
    def image_features_dim(self) -> int:
        """Width of `encode_image(...).features`: the pooled tower output, before any projection."""
        raise NotImplementedError

    def vision_blocks(self) -> list[nn.Module]:
        """The image tower's repeated blocks."""
        raise NotImplementedError

    def text_blocks(self) -> list[nn.Module]:
        """The text tower's repeated blocks (BERT's layers)."""
        return list(self.text_tower.encoder.layer)

    def image_features(self, pixel_values: torch.Tensor, tokens: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor | None]:
        """(pooled features, joint-space vectors before normalization, per-cell vectors or None)."""
        raise NotImplementedError

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, H] the text tower's pooled feature (what the text projection maps)."""
        raise NotImplementedError

    def pooled_text(self, out) -> torch.Tensor:
        """The pooled feature from a full text-tower output (the late-interaction path)."""
        raise NotImplementedError

    @property
    def raw_temperature(self) -> nn.Parameter:
        """The tower's own raw T parameter (learned when loss.temperature.parameterization is raw)."""
        raise NotImplementedError

    def store_hf_temperature(self) -> None:
        """Write `raw_temperature` where the transformers model keeps it, if elsewhere (before saving)."""

    # ------------------------------------------------------------------ shared

    def tower_blocks(self) -> list[nn.Module]:
        """The towers' repeated blocks (FSDP's units; memory bench)."""
        return [*self.vision_blocks(), *self.text_blocks()]

    @property
    def temperature_parameter(self) -> nn.Parameter:
        """What is learned for T: the raw T (`raw_temperature`) or log(1/T) (`logit_scale`)."""
        return self.logit_scale if self.learned_as == "log" else self.raw_temperature

    @property
    def temperature(self) -> torch.Tensor:
        """T as the loss uses it (floored: loss.temperature.min and max_scale), with its gradient."""
        return loss_lib.temperature_of(self.temperature_parameter, self.learned_as, self.temperature_settings)

    def set_temperature(self, value: float) -> None:
        """Make T `value` (loss.temperature.fixed; a starting checkpoint's T), whichever way it is learned."""
        with torch.no_grad():
            self.temperature_parameter.fill_(loss_lib.parameter_of(float(value), self.learned_as))

    def store_temperature(self) -> None:
        """Write the learned T where the transformers model keeps it, before saving (hub.py): AlignModel's
        `temperature`, VisionTextDualEncoderModel's logit_scale = log(1/T)."""
        if self.learned_as == "log":
            with torch.no_grad():
                self.raw_temperature.copy_(self.temperature.detach())
        self.store_hf_temperature()

    def logit_scalars(self) -> dict[str, torch.Tensor]:
        """The scalars of the logits the loss reads, by name (its `scalars`): the temperature, and the logit bias
        when the loss kind learns one."""
        found = {"temperature": self.temperature_parameter, "bias": self.logit_bias}
        return {name: p for name, p in found.items() if p is not None}

    def learned_scalars(self) -> dict[str, nn.Parameter]:
        """Those of `logit_scalars()` that are learned (not loss.temperature.fixed). The optimizer gives them their own
        group."""
        return {name: p for name, p in self.logit_scalars().items() if p.requires_grad}

    def encode_image(self, pixel_values: torch.Tensor, tokens: bool = False) -> Encoding:
        """pixel_values [B, 3, H, W] in [-1, 1] (data/transforms.py), mapped to what the tower was trained on;
        `tokens`: also the patch / cell vectors (late interaction)."""
        features, embeds, cells = self.image_features(self.tower_pixels(pixel_values), tokens)
        encoding = Encoding(embeds=F.normalize(embeds, dim=-1), features=features)
        if tokens:
            encoding.tokens = F.normalize(cells, dim=-1)
            encoding.mask = torch.ones(cells.shape[:2], dtype=torch.bool, device=cells.device)
            encoding.token_norms = cells.norm(dim=-1)
        return encoding

    def tower_pixels(self, unit: torch.Tensor) -> torch.Tensor:
        return tower_pixels(self.cfg.vision, unit)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: bool = False) -> Encoding:
        """`tokens`: also every token's vector (text_projection of its last hidden state), padding masked."""
        if tokens:
            out = self.text_tower(input_ids=input_ids, attention_mask=attention_mask)
            features = self.pooled_text(out)
            projection = self.hf.text_projection
            return Encoding(embeds=F.normalize(projection(features), dim=-1), features=features,
                            tokens=F.normalize(projection(out.last_hidden_state), dim=-1), mask=attention_mask.bool())
        buckets = min(self.cfg.text.length_buckets, input_ids.shape[0])
        right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
        if buckets > 1 and right_padded:
            features = self._cls_by_length(input_ids, attention_mask, buckets)
        else:
            features = self.text_features(input_ids, attention_mask)
        embeds = self.hf.text_projection(features)  # [B, D]
        return Encoding(embeds=F.normalize(embeds, dim=-1), features=features)

    def _cls_by_length(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, buckets: int) -> torch.Tensor:
        """[CLS] features with the batch sorted by length and encoded in `buckets` groups, each trimmed
        to its own longest text, then put back in the original order."""
        lengths = attention_mask.sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        parts = []
        for chunk in torch.tensor_split(order, buckets):
            if chunk.numel() == 0:
                continue
            width = int(lengths[chunk].max())
            parts.append(self.text_features(input_ids[chunk, :width], attention_mask[chunk, :width]))
        features = torch.cat(parts)
        return features[torch.argsort(order)]  # undo the sort

    def forward(self, pixel_values, input_ids, attention_mask) -> tuple[Encoding, Encoding]:
        """Training's forward: token vectors too when the loss is late interaction (loss.kind=filip)."""
        return (self.encode_image(pixel_values, self.keep_tokens),
                self.encode_text(input_ids, attention_mask, self.keep_tokens))


class EfficientNetDualEncoder(DualEncoder):
    """The paper's: EfficientNet and BERT in a `transformers.AlignModel` (`self.align`), the image feature the
    mean of the last block's cells, the text feature BERT's raw [CLS] (no pooler)."""

    def build(self, hf, temperature_init: float) -> None:
        self.align = hf if hf is not None else AlignModel(hf_config(self.cfg, temperature_init=temperature_init))
        # [CLS] is used directly: the pooler would be a parameter without gradient (breaks DDP).
        self.align.text_model.pooler = None
        pooled = vision_pooled_dim(self.align)
        # Only towers whose pooled width differs from embed_dim (e.g. B5: 512 -> 640) get this layer.
        self.image_projection = nn.Linear(pooled, self.cfg.embed_dim) if pooled != self.cfg.embed_dim else None

    def speed_up(self) -> None:
        if self.cfg.channels_last:
            self.align.vision_model.to(memory_format=torch.channels_last)
        # oneDNN's weight gradient on 2x2 and 4x4 maps is most of the step (model/depthwise.py)
        use_fast_depthwise(self.align.vision_model)
        use_cls_only_last_layer(self.align.text_model)  # under cls_only(): [CLS]'s row only (model/cls_only.py)

    @property
    def hf(self) -> AlignModel:
        return self.align

    @property
    def raw_temperature(self) -> nn.Parameter:
        return self.align.temperature

    @property
    def image_features_dim(self) -> int:
        return vision_pooled_dim(self.align)

    def vision_blocks(self) -> list[nn.Module]:
        return list(self.align.vision_model.encoder.blocks)

    def image_features(self, pixel_values, tokens):
        if self.cfg.channels_last:
            pixel_values = pixel_values.contiguous(memory_format=torch.channels_last)
        out = self.align.vision_model(pixel_values=pixel_values)
        features = out.pooler_output  # [B, C_last]: the mean of the last feature map's cells
        project = self.image_projection or nn.Identity()
        cells = project(out.last_hidden_state.flatten(2).transpose(1, 2)) if tokens else None  # [B, h*w, D]
        return features, project(features), cells

    def text_features(self, input_ids, attention_mask):
        with cls_only():  # ALIGN's last layer: only the [CLS] row, [B, 1, H]
            out = self.text_tower(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state[:, 0, :]  # [B, H] the [CLS] token

    def pooled_text(self, out):
        return out.last_hidden_state[:, 0, :]


class ViTDualEncoder(DualEncoder):
    """CLIP's towers' layout: a ViT and BERT in a `transformers.VisionTextDualEncoderModel` (`self.dual`), so
    plain transformers' get_image_features / get_text_features give the same embeddings (CLS pooling). The
    temperature is a raw divisor like the EfficientNet model's, kept beside the transformers model and written
    into its logit_scale = log(1/T) when saved."""

    def build(self, hf, temperature_init: float) -> None:
        self.dual = hf if hf is not None else VisionTextDualEncoderModel(
            hf_vit_config(self.cfg, temperature_init=temperature_init))
        self.dual.logit_scale.requires_grad_(False)  # where the temperature is saved, not where it is learned
        self.vit_temperature = nn.Parameter(torch.exp(-self.dual.logit_scale.detach().float()).clone())

    @property
    def hf(self) -> VisionTextDualEncoderModel:
        return self.dual

    @property
    def raw_temperature(self) -> nn.Parameter:
        return self.vit_temperature

    @property
    def image_features_dim(self) -> int:
        return self.cfg.vision.hidden_size

    def vision_blocks(self) -> list[nn.Module]:
        return list(self.dual.vision_model.encoder.layers)

    def image_features(self, pixel_values, tokens):
        other_size = tuple(pixel_values.shape[-2:]) != (self.cfg.vision.image_size,) * 2
        # another resolution than the trained one: position embeddings interpolated (bicubic) to its grid
        vision = self.dual.vision_model
        out = vision(pixel_values=pixel_values, interpolate_pos_encoding=other_size)
        if self.cfg.vision.pool == "cls":
            features = out.pooler_output  # post_layernorm(last_hidden_state[:, 0])
        else:
            features = vision.post_layernorm(out.last_hidden_state[:, 1:].mean(dim=1))
        cells = self.dual.visual_projection(vision.post_layernorm(out.last_hidden_state[:, 1:])) if tokens else None
        return features, self.dual.visual_projection(features), cells

    def text_features(self, input_ids, attention_mask):
        # BERT's pooled [CLS] (what VisionTextDualEncoderModel projects)
        return self.text_tower(input_ids=input_ids, attention_mask=attention_mask).pooler_output

    def pooled_text(self, out):
        return out.pooler_output

    def store_hf_temperature(self) -> None:  # its logits_per_image are openalign's too
        with torch.no_grad():
            self.dual.logit_scale.copy_(-torch.log(self.vit_temperature.detach().to(self.dual.logit_scale.dtype)))


class CLIPDualEncoder(ViTDualEncoder):
    """A CLIPModel fine-tuned (`train --init` a CLIPModel directory): its ViT pools and projects as the ViT kind's,
    its text transformer pools at the end-of-text token (its pooler_output) before `text_projection`, so
    `get_image_features` / `get_text_features` of the saved CLIPModel give its embeddings. The temperature is a raw
    divisor started at the checkpoint's 1 / exp(logit_scale) and written back into logit_scale when saved, as the
    ViT kind's is. The architecture is the starting checkpoint's (`model.init_from`'s config.json)."""

    def build(self, hf, temperature_init: float) -> None:
        if hf is None:
            if not self.cfg.init_from:
                raise ConfigError("model.family=clip trains from a CLIPModel directory: pass --init DIR")
            hf = CLIPModel.from_pretrained(self.cfg.init_from, local_files_only=True)
        super().build(hf, temperature_init)

    def text_blocks(self) -> list[nn.Module]:
        return list(self.text_tower.encoder.layers)


IMAGE_TOWERS = {"efficientnet": EfficientNetDualEncoder, "vit": ViTDualEncoder}
PUBLIC_TOWERS = {"clip": CLIPDualEncoder}  # model.family -> the kind that trains its checkpoints
