"""What a run trains on, made ready before a model exists: `openalign.prepare.prepare(cfg)` builds it (the built-in
corpora, Karpathy shards, keep indexes, the tokenizer), the training loop (train/trainer.py) reads it. Training
imports neither the corpora, the pipeline nor the tokenizer trainer (tests/test_layering.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from openalign.config import Config

__all__ = ["Data"]


@dataclass(frozen=True)
class Data:
    cfg: Config  # the run's config, the text tower's vocabulary sized to the tokenizer
    train_shards: list[str]
    eval_shards: list[str]  # the held-out shards evaluated during and after training ([] for none)
    tokenizer: object  # a transformers tokenizer: data.tokenizer's, the run's own from an earlier try, or trained
    source_evals: dict[str, list[str]] = field(default_factory=dict)  # several corpora: each one's held-out shards
    keep: str = ""  # the keep index the training samples are read through (data.keep, data.dedup_heldout)
