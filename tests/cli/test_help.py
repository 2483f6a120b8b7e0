"""Every command's --help: built without importing what the command runs, and every flag's help one sentence."""

import json
import re
import subprocess
import sys

import pytest

from openalign import cli

# what a command imports when it runs, never to show its flags
HEAVY = ("torch", "transformers", "tokenizers", "faiss", "scipy", "sklearn", "pyspark", "duckdb", "fastapi", "uvicorn",
         "matplotlib", "aiohttp", "pandas")
# a sentence does not end on these (a preposition may: "the model the index was embedded with")
DANGLING = {"a", "an", "the", "and", "or", "nor", "but", "is", "are", "its", "their", "than", "then", "when", "where",
            "which", "whose", "that", "per", "e.g.", "i.e."}


def problem(text: str | None) -> str:
    """What keeps `text` from being one complete sentence ('' when nothing does)."""
    body = re.sub(r"\s*\(default: [^()]*(\([^()]*\)[^()]*)*\)$", "", (text or "").strip())
    if not body:
        return "no help"
    if body.count("(") != body.count(")") or body.count("[") != body.count("]") or body.count("`") % 2:
        return "unbalanced brackets or quotes"
    last = body.split()[-1].lower()
    if body[-1] in ",;:-&+" or last in DANGLING or last.endswith("'s"):
        return f"ends mid-sentence ({last!r})"
    if re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)[.!?] [A-Z]", body):
        return "more than one sentence"
    return ""


def test_the_sentence_check_catches_what_it_should():
    assert problem("re-rank each query's top K by late interaction") == ""
    assert problem("e.g. 4G (the local engine, DuckDB, spills to disk beyond it) (default: 0)") == ""
    # eval's --resize before it had a sentence of its own: half of one split over two fields
    assert "mid-sentence" in problem("evaluate at these image sizes (resize, then center crop) instead of the "
                                     "model's; a ViT's")
    assert "mid-sentence" in problem("position embeddings are then interpolated to the")
    assert problem("the shards whose texts the vocabulary is trained on") == ""
    assert problem("") == "no help" and problem(None) == "no help"
    assert "unbalanced" in problem("the metrics JSON (a .md table")
    assert "more than one" in problem("the index. It is rebuilt")


def _subparser(command: str):
    parser = cli.build_parser(command)
    return next(a for a in parser._actions if a.dest == "command").choices[command]


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_flag_of_every_command_has_one_complete_sentence_of_help(command):
    wrong = {}
    for action in _subparser(command)._actions:
        if action.dest == "help" or action.help == "==SUPPRESS==":
            continue
        name = "/".join(action.option_strings) or action.dest
        if problem(action.help):
            wrong[name] = f"{problem(action.help)}: {action.help!r}"
    assert not wrong, f"openalign {command}: " + "; ".join(f"{k} {v}" for k, v in wrong.items())


def test_help_of_every_command_imports_nothing_the_command_runs():
    code = f"""
import contextlib, io, json, sys
from openalign import cli
found = {{}}
for command in cli.COMMANDS:
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        try:
            cli.main([command, "--help"])
        except SystemExit:
            pass
    assert shown.getvalue().startswith("usage: openalign " + command), shown.getvalue()[:200]
    found[command] = [m for m in {HEAVY!r} if m in sys.modules]
print(json.dumps(found))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {command: modules for command, modules in json.loads(done.stdout.splitlines()[-1]).items() if modules}
    assert not imported, f"--help imported {imported}"
