"""Built-in corpora by name (corpora/__init__.py): several corpora together, each option naming its corpus."""

import pytest

from openalign import presets
from openalign.config import ConfigError, override
from openalign.corpora import resolve_data


def test_several_corpora_options_name_their_corpus(tmp_path):
    cfg = override(presets.get("tiny"), ["data.corpus=emoji+shapes", "data.corpus_options=noise=0.5"])
    with pytest.raises(ConfigError, match="each option names its corpus, as emoji.noise=0.5"):
        resolve_data(cfg.data, progress=False)
    with pytest.raises(ConfigError, match="unknown built-in corpus 'shape'.*did you mean shapes"):
        resolve_data(override(cfg, ["data.corpus=emoji+shape"]).data, progress=False)
