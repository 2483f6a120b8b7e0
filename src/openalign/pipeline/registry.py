"""The corpus stages over a pair table that openalign knows (the keep-list stages and card): one row each, its
command's help line and where its `Stage` is declared.

The command line builds each row's command from its declaration (cli/stages.py), importing the stage's module
only when that command runs: `openalign --help` imports none of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "STAGES", "declaration"]


@dataclass(frozen=True)
class Row:
    stage: Any  # "openalign.pipeline.NAME:Class" (imported when the command runs), or the Stage class itself
    help: str  # the line `openalign --help` shows


STAGES: dict[str, Row] = {
    "filter": Row("openalign.pipeline.curation.filter:Filter",
                  "ALIGN's frequency filters -> keep-list + filter_report.json/.png"),
    "dedup": Row("openalign.pipeline.curation.dedup:Dedup",
                 "drop training images that are near-duplicates of evaluation images"),
    "screen": Row("openalign.pipeline.curation.screen:Screen",
                  "drop images an image classifier flags (the paper's unsafe-image filter)"),
    "score": Row("openalign.pipeline.curation.score:Score",
                 "keep the pairs a model scores highest (image-text cosine; DataComp's CLIP score filter)"),
    "semdedup": Row("openalign.pipeline.curation.semdedup:SemDedup",
                    "drop semantic near-duplicates within the corpus (SemDeDup: k-means cells of image embeddings)"),
    "balance": Row("openalign.pipeline.curation.balance:Balance",
                   "balance the corpus over concepts (MetaCLIP: match alt-texts to metadata entries, cap each at t "
                   "pairs)"),
    "card": Row("openalign.pipeline.curation.card:Card",
                "a corpus's data card: what each stage removed, per language, host and concept, with examples"),
}


def declaration(name: str):
    """The Stage class of the registered stage `name`."""
    stage = STAGES[name].stage
    if isinstance(stage, str):
        module, _, attribute = stage.partition(":")
        stage = getattr(importlib.import_module(module), attribute)
    return stage
