"""Flags generated from options dataclasses (flags.py): type, default and help written once, in the dataclass."""

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from openalign import cli
from openalign.flags import add_options, field_comments, given, options_from


@dataclass(frozen=True)
class Example:
    size: int = 3  # how many
    # (a comment above a field belongs to no field)
    mode: Literal["fast", "exact"] = "fast"  # fast: approximate;
        # exact: brute force
    ratio: float = 0.5
    names: tuple[str, ...] = ()  # repeatable
    loud: bool = False  # print more
    limit: int | None = None  # none: no limit


def parse(argv, **kwargs):
    parser = argparse.ArgumentParser()
    add_options(parser, Example, **kwargs)
    return parser, parser.parse_args(argv)


def test_types_defaults_and_help_come_from_the_dataclass():
    assert field_comments(Example) == {"size": "how many", "mode": "fast: approximate; exact: brute force",
                                       "names": "repeatable", "loud": "print more", "limit": "none: no limit"}
    parser, args = parse([])
    assert options_from(args, Example) == Example()
    _, args = parse(["--size", "7", "--mode", "exact", "--names", "a", "--names", "b", "--loud", "--limit", "9"])
    assert options_from(args, Example) == Example(size=7, mode="exact", names=("a", "b"), loud=True, limit=9)
    assert "how many (default: 3)" in parser.format_help() and "{fast,exact}" in parser.format_help()
    with pytest.raises(SystemExit):
        parse(["--mode", "slow"])


def test_none_defaults_leave_unset_flags_to_the_dataclass_and_seen_flags_are_added_once():
    seen: set = set()
    parser = argparse.ArgumentParser()
    add_options(parser, Example, unset=True, seen=seen, only=("size", "ratio"), where={"size": "a, b: "})
    add_options(parser, Example, unset=True, seen=seen, rename={"ratio": "--share"})  # ratio already added
    args = parser.parse_args(["--size", "4"])
    assert given(args, ("size", "ratio", "mode")) == {"size": 4}
    assert options_from(args, Example) == Example(size=4)
    assert "a, b: how many (default: 3)" in parser.format_help() and "--share" not in parser.format_help()


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_subcommand_builds_its_flags_and_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("usage: openalign " + command)


def test_a_bad_size_is_one_line_naming_the_flag(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["index", str(tmp_path), "--out", str(tmp_path / "i"), "--memory", "four"])
    err = capsys.readouterr().err
    assert "argument --memory: 'four' is not a size" in err
