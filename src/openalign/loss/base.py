"""What every loss kind shares: the `Loss` class each kind subclasses and registers, and the math two kinds use
(fp32 logits, the label-smoothed cross-entropy, the row-block gradients of the chunked forms).

A kind (one module in this package) is a `Loss` subclass decorated with `@register`: its `name` (the value of
`loss.kind`), the learned scalars it reads (`scalars`: the model creates them, with `initial_scalars`), whether it
reads token vectors (`tokens`), the LossConfig options it reads (`options`; any other is refused unless neutral), its
config rules (`rules`, asked by `config.check` through `config.LOSS_KINDS`), and `__call__`: its single-process,
chunked and gathered forms, chosen by the configured implementation and the world size.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from openalign import config as config_lib
from openalign.config import Config, LossConfig, TemperatureConfig

CHUNK_BYTES = 32 * 2**20  # chunked loss: bytes of one [rows, B] block of logits (a few are alive at once)
AUTO_CHUNKED_FROM = 4_096  # `implementation="auto"`: batches at least this large use the chunked loss

DIRECTIONS = {"both": (True, True), "image_to_text": (True, False), "text_to_image": (False, True)}

# LossConfig options a kind may not read: (the value that changes nothing, what the option does)
OPTIONS = {
    "label_smoothing": (0.0, "smooths the softmax's targets"),
    "negatives_fraction": (1.0, "drops in-batch negatives from the softmax (the Table 8 ablation)"),
    "direction": ("both", "keeps one of the softmax's two terms"),
    "exchange": ("auto", "chooses how the sigmoid loss's texts reach every rank"),
}


class Loss:
    """One loss kind, built for a LossConfig and a number of processes (`create`). Called with the two towers'
    encodings (anything with `.embeds`, [B, D] unit vectors; `.tokens` and `.mask` too when `tokens`) and the model's
    learned scalars by name (`scales`), it returns this process's share of the loss of the whole batch: the mean of
    the shares over processes is the single-process loss of the global batch."""

    name: ClassVar[str] = ""
    scalars: ClassVar[tuple[str, ...]] = ("temperature",)  # the learned scalars it reads (model parameters, saved)
    temperature_init: ClassVar[float] = 1.0  # T at the start when loss.temperature.init is 0 (the paper's 1.0)
    parameterization: ClassVar[str] = "raw"  # how T is learned when loss.temperature.parameterization is auto
    tokens: ClassVar[bool] = False  # reads token vectors (late interaction); gradient caching keeps pooled ones only
    options: ClassVar[frozenset[str]] = frozenset()  # the OPTIONS it reads

    def __init__(self, cfg: LossConfig, world: int = 1):
        self.cfg, self.world = cfg, world

    @classmethod
    def initial_scalars(cls, cfg: LossConfig) -> dict[str, float]:
        """How its learned scalars start: the temperature T (whichever way it is learned) and the logit bias."""
        start = {"temperature": cfg.temperature.init or cls.temperature_init, "bias": cfg.temperature.sigmoid_bias_init}
        return {name: start[name] for name in cls.scalars}

    @classmethod
    def learned_as(cls, cfg: LossConfig) -> str:
        """How the temperature is learned (loss.temperature.parameterization, auto: the kind's own): raw (T) or log
        (log(1/T))."""
        chosen = cfg.temperature.parameterization
        return cls.parameterization if chosen == "auto" else chosen

    @classmethod
    def fitted(cls, cfg: Config, given: set[str]) -> tuple[Config, list[str]]:
        """`cfg` with each option this kind does not read set to its neutral value where the user did not give it
        (`given`: the dotted keys the user set; a default or a preset's value is not given), and a line for each:
        `loss.kind=sigmoid` alone must not trip over the softmax's default label smoothing. An option the user gave
        is left for `rules` to refuse."""
        import dataclasses

        changes, notes = {}, []
        for option, (neutral, what) in OPTIONS.items():
            value = getattr(cfg.loss, option)
            if option in cls.options or value == neutral or f"loss.{option}" in given:
                continue
            changes[option] = neutral
            notes.append(f"loss.kind={cls.name} does not read loss.{option} ({what}): using {neutral}, not the "
                         f"default {value}")
        if not changes:
            return cfg, []
        return dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, **changes)), notes

    @classmethod
    def rules(cls, cfg: Config, world: int) -> list[str]:
        """What this kind refuses in a config, as `key=value ...` phrases (config.check joins them)."""
        problems = []
        for option, (neutral, what) in OPTIONS.items():
            value = getattr(cfg.loss, option)
            if option not in cls.options and value != neutral:
                problems.append(f"loss.{option}={value} {what}, which loss.kind={cls.name} does not use: set "
                                f"loss.{option}={neutral}")
        if "bias" in cls.scalars and cfg.model.family == "clip":
            problems.append(f"loss.kind={cls.name} learns a logit bias, which a CLIPModel has no place to save; "
                            "fine-tune a CLIPModel with a loss without one (loss.kind=softmax or filip)")
        if cls.tokens and cfg.train.micro_batch:
            problems.append(f"loss.kind={cls.name} does not run with train.micro_batch (gradient caching keeps pooled "
                            "embeddings, not token vectors); set train.micro_batch=0")
        return problems

    def temperature(self, scales: dict[str, torch.Tensor]) -> torch.Tensor:
        """T from the model's learned parameter `scales["temperature"]` (`temperature_of`)."""
        return temperature_of(scales["temperature"], self.learned_as(self.cfg), self.cfg.temperature)

    def __call__(self, img, txt, scales: dict[str, torch.Tensor], generator: torch.Generator | None = None
                 ) -> torch.Tensor:
        raise NotImplementedError


def register(kind: type[Loss]) -> type[Loss]:
    """Class decorator: make `kind` the loss of `loss.kind=<kind.name>` (config.LOSS_KINDS, which config.check asks
    for its rules and the factory for the class)."""
    if not kind.name:
        raise ValueError(f"{kind.__name__} has no name: set its class attribute `name` (the value of loss.kind)")
    config_lib.LOSS_KINDS[kind.name] = kind
    return kind


def create(cfg: LossConfig, world: int = 1) -> Loss:
    """The configured loss for `world` processes (config.check has accepted the kind)."""
    return kind_of(cfg)(cfg, world)


def kind_of(cfg: LossConfig) -> type[Loss]:
    """The class of `cfg.kind`; a kind nobody registered (a model saved by a run with a loss of its own) is one
    sentence."""
    kind = config_lib.LOSS_KINDS.get(cfg.kind)
    if kind is None:
        known = ", ".join(config_lib.LOSS_KINDS)
        raise config_lib.ConfigError(f"loss.kind={cfg.kind} is not a registered loss kind ({known}); import the module "
                                     "that registers it (openalign.loss.register) first")
    return kind


def temperature_of(parameter: torch.Tensor, learned_as: str, settings: TemperatureConfig) -> torch.Tensor:
    """The temperature T from its learned parameter: T itself (raw, the paper's divisor) or log(1/T) (log, CLIP's and
    SigLIP's log scale), floored at loss.temperature.min and at 1 / max_scale (CLIP's cap of 100 on the scale):
    the logits stay finite whatever the optimizer does, and past the floor T's gradient is 0."""
    temperature = parameter if learned_as == "raw" else torch.exp(-parameter)
    return temperature.clamp(min=max(settings.min, 1.0 / settings.max_scale if settings.max_scale else 0.0))


def parameter_of(temperature: float, learned_as: str) -> float:
    """The learned parameter that gives `temperature` (the inverse of `temperature_of` above the floor)."""
    return temperature if learned_as == "raw" else -math.log(temperature)


def chunked(implementation: str, rows: int) -> bool:
    """Whether the loss streams its logits (loss.implementation: chunked; auto from AUTO_CHUNKED_FROM rows on)."""
    return implementation == "chunked" or (implementation == "auto" and rows >= AUTO_CHUNKED_FROM)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    # Logits and the loss stay in fp32 under bf16 autocast; fp64 inputs stay fp64 (oracle tests).
    return x.to(torch.promote_types(x.dtype, torch.float32))


def smoothed_cross_entropy(logits: torch.Tensor, label_smoothing: float, mask: torch.Tensor | None = None,
                           offset: int = 0) -> torch.Tensor:
    """Mean over rows of the label-smoothed cross-entropy, row i's positive at column offset + i (the diagonal in
    one process; this rank's slice of the gathered columns under torchrun). Label smoothing follows torch's
    convention: (1 - s) on the positive plus s / K spread over all K candidates of the row.

    `mask` ([n, m] bool, optional) removes candidates; smoothing spreads over the kept ones only.
    """
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    logp = at_least_fp32(logits).log_softmax(dim=1)  # [n, m], log-sum-exp: stable for any temperature
    positive = logp.diagonal(offset)  # [n]
    if label_smoothing == 0.0:
        return -positive.mean()
    if mask is None:
        uniform = logp.mean(dim=1)  # [n] mean over all m candidates
    else:
        uniform = logp.masked_fill(~mask, 0.0).sum(dim=1) / mask.sum(dim=1)
    return -((1.0 - label_smoothing) * positive + label_smoothing * uniform).mean()


def chunk_rows(columns: int, itemsize: int, chunk: int | None = None) -> int:
    """Rows per block of a chunked loss: `chunk`, or as many as fit a [rows, columns] block in CHUNK_BYTES."""
    return chunk or max(1, CHUNK_BYTES // (itemsize * max(columns, 1)))


def block_gradients(d: torch.Tensor, b: torch.Tensor, scaled: torch.Tensor, t: torch.Tensor, grad_a, grad_b,
                    grad_t: torch.Tensor, rows: slice, need_a: bool, need_t: bool) -> None:
    """Accumulate one row block's gradients, given d = d loss / d Z of the block Z = scaled @ b.T (scaled = a / t):
    grad_a[rows] = d @ b / t, grad_b += d.T @ scaled, grad_t -= sum(scaled * (d @ b)) / t (no [c, m] product
    needed for the temperature: sum_ij d_ij Z_ij = sum(scaled * (d @ b)))."""
    if need_a or need_t:
        g_b = d @ b  # [c, d]
        if need_t:
            grad_t -= (scaled * g_b).sum() / t
        if need_a:
            torch.div(g_b, t, out=grad_a[rows])
    if grad_b is not None:
        torch.addmm(grad_b, d.T, scaled, out=grad_b)  # (not addmm_: FLOP counters miss it)
