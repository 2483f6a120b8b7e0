"""`openalign study noise-vs-scale`: does more noisy data beat less clean data? (the paper's Table 10)

The built-in emoji corpus with its alt-text noise (wrong captions, file names, boilerplate, partial
keywords) off, against the same sources with noise at `NOISE` at 1x, 2x and 4x the clean size (each
emoji also as augmented views with independently noised texts: `data.corpus_options=copies=N`). Same
model and the same number of steps for every run; the held-out split (whole emoji families) is clean
and the same for all.
"""

from __future__ import annotations

from openalign.config import Config, ConfigError
from openalign.study.runner import Variant

NOISE = 0.5  # the noisy corpora's rate: half the alt-texts replaced by one of the four kinds of noise
SIZES = (1, 2, 4)
INTRO = (f"Clean alt-texts at 1x against {NOISE:.0%} noisy alt-texts at 1x, 2x and 4x the size (the paper's "
         "Table 10: noisy data at 4x the size of CC-3M beat it), at an equal training budget.")


def variants(base: Config) -> list[Variant]:
    if base.data.corpus != "emoji" or base.data.train:
        raise ConfigError("the noise-vs-scale study varies the built-in emoji corpus: use a preset with "
                          "data.corpus=emoji and no --data")
    plan = [Variant("clean_x1", "baseline", ("data.corpus_options=noise=0.0",), "clean, 1x", baseline=True)]
    plan += [Variant(f"noisy_x{n}", "corpus size", (f"data.corpus_options=noise={NOISE},copies={n}",),
                     f"{NOISE:.0%} noise, {n}x") for n in SIZES]
    return plan
