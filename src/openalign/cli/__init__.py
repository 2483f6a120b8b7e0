"""`openalign` command line: one entry point, one module per group of commands (cli/main.py lists them), each
command a thin mapping from its flags to options, one public call, and a summary.

User mistakes (bad path, unknown key, missing system package) end in one sentence, never a traceback. `--help` of
any command imports only options classes (torch-free modules), never what the command runs.
"""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we fork data workers after tokenizing
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by default: a local path never falls through to a hub
# transformers' load reports and per-file progress bars, set once at process start (read when transformers is
# imported); set these variables to see them
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from openalign.cli.main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
