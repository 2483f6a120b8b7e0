"""The lab: the paper's arguments and the teaching's failure modes rerun in miniature, outside the package users
install (experiments/README.md lists the commands; docs/results.md has the readings).

Each study is a module run from the repository's root, `python -m experiments.NAME --out DIR [--quick]`, and
imports only openalign's public names (those in its modules' `__all__`; experiments/tests/test_imports.py).
"""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the data workers fork after tokenizing
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model path never falls through to a hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no load reports or per-file bars between the study's own
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
