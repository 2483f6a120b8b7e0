"""Every command line in README.md and docs/*.md parses: `openalign ...` (also under torchrun, `-m openalign.cli`)
and `python -m experiments....`, in code blocks and inline code. The command and its flags exist, each value has
its flag's type and choices, and the `key=value` overrides name real keys with values of the right type; nothing
runs. A renamed flag breaks this test, not the reader."""

import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from openalign import presets
from openalign import config as config_lib
from openalign.cli import COMMANDS as CLI_COMMANDS
from openalign.cli import build_parser
from openalign.cli.common import filter_config, fitted
from openalign.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATORS = {"&&", "||", "|", ";", "&"}


def _logical_lines(text: str) -> list[str]:
    """The lines of a code block, a trailing backslash joining a line to the next."""
    return text.replace("\\\n", " ").splitlines()


def _pieces(doc: Path):
    """(line number, text, inline) of each code line and inline code span in `doc` (Python blocks are
    docs/api.md's examples, run by tests/test_api_docs.py)."""
    text = doc.read_text(encoding="utf-8")
    fenced = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
    for block in fenced.finditer(text):
        if block.group(1) in ("python", "py", "json", "text"):
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        for offset, line in enumerate(_logical_lines(block.group(2))):
            yield first + offset, line, False
    prose = fenced.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in re.finditer(r"`([^`\n]+)`", prose):
        yield text.count("\n", 0, span.start()) + 1, span.group(1), True


def placeholder(word: str) -> bool:
    """A word the docs write for a value the reader fills in: SHARDS, MODEL, T."""
    return re.fullmatch(r"[A-Z][A-Z0-9_]*", word) is not None


def _commands(line: str) -> list[list[str]]:
    """The openalign and experiments commands on one shell line, each as its argv after the program. A synopsis's
    brackets and parentheses (`[--images MORE]`) are read as the flags they hold."""
    line = re.sub(r"[\[\]()]", " ", line)
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split, lexer.commenters = True, "#"
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: prose, not a command
        return []
    segments, current = [], []
    for token in tokens:
        if token in SEPARATORS:
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    found = []
    for tokens in segments:
        tokens = [t for i, t in enumerate(tokens) if t not in "<>" and (i == 0 or tokens[i - 1] not in "<>")]
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):  # OMP_NUM_THREADS=1 openalign ...
            tokens = tokens[1:]
        if tokens[:1] == ["$"]:
            tokens = tokens[1:]
        if tokens[:1] == ["openalign"] and len(tokens) > 1:
            found.append(["openalign", *tokens[1:]])
        elif "openalign.cli" in tokens and tokens[tokens.index("openalign.cli") - 1] == "-m":
            found.append(["openalign", *tokens[tokens.index("openalign.cli") + 1:]])
        elif any(a == "-m" and b.startswith("experiments.") for a, b in zip(tokens, tokens[1:])):
            found.append(tokens[[a == "-m" and b.startswith("experiments.") for a, b in zip(tokens, tokens[1:])]
                                .index(True) + 1:])  # python -m experiments.X, torchrun ... -m experiments.X
    return found


def documented() -> list[tuple[str, list[str], bool]]:
    """(where, argv, inline) of every documented command; a command whose words hold `...` is an elision, left
    out. An inline one may name a command without its required arguments (`openalign serve` in a sentence)."""
    out = []
    for doc in DOCS:
        for number, line, inline in _pieces(doc):
            for argv in _commands(line):
                if not any("..." in word or "…" in word for word in argv) \
                        and not placeholder(argv[0].rpartition(".")[2]):  # python -m experiments.NAME
                    out.append((f"{doc.relative_to(ROOT)}:{number}", argv, inline))
    return out


class Parsed(Exception):
    """Raised in place of running the command: its flags parsed."""


def _parse(parser: argparse.ArgumentParser, argv: list[str], real=argparse.ArgumentParser.parse_known_args):
    """parse_known_args, with argparse's exit (it prints and exits on a bad flag) as a ConfigError. A placeholder
    (T, NAME) where a number or a choice goes stands for a right value: the first choice, or 1."""
    argv = list(argv)
    for _ in range(len(argv) + 1):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return real(parser, argv)
        except SystemExit as exit_:
            if exit_.code == 0:  # --help, --version
                return None
            message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(exit_)
        bad = re.search(r"invalid (?:\w+ value|(choice)): '([^']*)'(?: \(choose from '([^']*)')?", message)
        if not (bad and placeholder(bad.group(2)) and bad.group(2) in argv):
            raise ConfigError(message)
        argv[argv.index(bad.group(2))] = bad.group(3) if bad.group(1) else "1"
    raise ConfigError(message)


def _overrides_with_placeholders_filled(cfg, overrides: list[str]) -> list[str]:
    """`seed=S`: the key is checked, the placeholder value stands for the key's own value."""
    values = config_lib.flat(cfg)
    return [f"{key}={values[key]}" if placeholder(value) and key in values else f"{key}={value}"
            for key, _, value in (item.partition("=") for item in overrides)]


def _relax(parser: argparse.ArgumentParser) -> None:
    """A mention (inline code) of a command may leave out its required flags and positional arguments."""
    for action in parser._actions:
        action.required = False
        if action.nargs in (None, "+") and not action.option_strings:
            action.nargs = "?" if action.nargs is None else "*"


def _overrides(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """The `key=value` overrides, those argparse left after the flags included (as the commands read them)."""
    if extra and not (hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra)):
        raise ConfigError(f"unrecognized arguments: {' '.join(extra)}")
    return [*getattr(args, "overrides", []), *extra]


def check_openalign(argv: list[str], mention: bool = False) -> None:
    """`openalign ARGV` parses; a `mention` (inline code) may leave out required arguments."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or placeholder(command):  # `openalign SUBCOMMAND`: the synopsis of every command
        return
    parser = build_parser(command)
    if mention and command in CLI_COMMANDS:
        _relax(parser._subparsers._group_actions[0].choices[command])
    parsed = _parse(parser, argv)
    if parsed is None:
        return
    args, extra = parsed
    overrides = _overrides(args, extra)
    if args.command == "train" or (args.command == "web" and getattr(args, "action", None) == "demo"):
        cfg = presets.get(args.preset)
        overrides = _overrides_with_placeholders_filled(cfg, overrides)
        fitted(config_lib.override(cfg, overrides), overrides)
    elif args.command in ("filter", "corpus") and overrides:
        filter_config(overrides)
    elif args.command == "eval":
        from openalign.eval.tasks import configure

        recipe = [f"{task}.recipe.{item}" for task in (args.task or []) if task in ("finetune", "vtab")
                  for item in (args.ft or [])]
        configure(args.task or ["retrieval", "zeroshot"], recipe + overrides)


def check_experiment(argv: list[str], monkeypatch, mention: bool = False) -> None:
    """`python -m ARGV` parses (its `main` stopped once its flags are parsed); a `mention` may leave out --out."""
    module = importlib.import_module(argv[0])  # a study package (failure_modes) has its main in __init__
    real = argparse.ArgumentParser.parse_known_args

    def parse_then_stop(self, args=None, namespace=None):
        if self.prog.startswith("python -m experiments"):
            if mention:
                _relax(self)
            raise Parsed(_parse(self, list(args or []), real))
        return real(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_then_stop)
    try:
        module.main(argv[1:])
    except Parsed as done:
        args, extra = done.args[0]
        if extra and not all("=" in e and not e.startswith("-") for e in extra):
            raise ConfigError(f"unrecognized arguments: {' '.join(extra)}") from None
        overrides = [*getattr(args, "overrides", []), *extra]
        if overrides and hasattr(args, "preset"):
            cfg = presets.get(args.preset)
            config_lib.override(cfg, _overrides_with_placeholders_filled(cfg, overrides))
        return
    raise AssertionError(f"{argv[0]}.main never parsed its flags")


COMMANDS = documented()


def test_the_docs_hold_the_commands_of_every_group():
    names = {argv[1] if argv[0] == "openalign" else argv[0] for _, argv, _ in COMMANDS}
    assert len(COMMANDS) > 150
    assert set(CLI_COMMANDS) <= names, set(CLI_COMMANDS) - names  # every command is documented somewhere
    assert {"experiments.ablation", "experiments.reproduce"} <= names


@pytest.mark.parametrize("where,argv,inline", COMMANDS, ids=[f"{w} {' '.join(a)[:60]}" for w, a, _ in COMMANDS])
def test_a_documented_command_parses(where, argv, inline, monkeypatch):
    try:
        if argv[0] == "openalign":
            check_openalign(argv[1:], mention=inline)
        else:
            check_experiment(argv, monkeypatch, mention=inline)
    except ConfigError as err:
        pytest.fail(f"{where}: `{shlex.join(argv)}` does not parse: {err}")


@pytest.mark.parametrize("line,problem", [
    ("openalign train --preset demo --stepz 5", "unrecognized arguments: --stepz"),
    ("openalign train --preset demo train.stepz=5", "train.stepz"),
    ("openalign train --preset demo train.steps=many", "train.steps"),
    ("openalign index EMB --out I --kind ivvf", "invalid choice"),
    ("openalign eval M --data D --task knn knn.kk=5", "kk"),
    ("openalign filter p.parquet --out f/ min_word_countt=2", "min_word_countt"),
    ("python -m experiments.ablation --out x --quickk", "unrecognized arguments"),
    ("openalign trian --preset demo", "invalid choice"),
])
def test_a_wrong_command_is_caught(line, problem, monkeypatch):
    [argv] = _commands(line)
    with pytest.raises(ConfigError, match=re.escape(problem)):
        if argv[0] == "openalign":
            check_openalign(argv[1:])
        else:
            check_experiment(argv, monkeypatch)


def test_command_lines_are_found_in_blocks_continuations_and_inline_code(tmp_path):
    assert _commands("OMP_NUM_THREADS=1 openalign train --out x  # a comment") == [["openalign", "train", "--out", "x"]]
    assert _commands("torchrun --nproc_per_node 2 -m openalign.cli train --out x") == [["openalign", "train", "--out",
                                                                                        "x"]]
    assert _commands("openalign corpus emoji --out d && python -m experiments.pmi --out p > log.txt") == [
        ["openalign", "corpus", "emoji", "--out", "d"], ["experiments.pmi", "--out", "p"]]
    assert _logical_lines("openalign eval M \\\n  --data D\n") == ["openalign eval M    --data D"]
    assert _commands("the openalign way") == []
