"""Command-line flags generated from options dataclasses: each option's type, default and help line are
written once, in its dataclass (the help is the comment after the field, continued on comment lines right
below it that are indented deeper than the field).

    add_options(parser, ShardOptions)                       --image-size N --samples-per-shard N ...
    add_options(parser, KnnOptions, unset=True, seen=s)     flags whose value None means "not given"
    options_from(args, ShardOptions)                        ShardOptions(image_size=..., ...)

A field typed `bool` becomes --flag/--no-flag, a `Literal[...]` a choice, a `tuple[...]` a repeatable flag;
other types need a `convert` (a nested dataclass is set by dotted overrides instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import tokenize
import typing
from functools import cache


@cache
def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment after it, with the comment-only lines right below it}, from the class's source."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names = {f.name for f in dataclasses.fields(klass)}
        current, line_of = None, {}
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            row = token.start[0]
            if token.type == tokenize.NAME and token.string in names and token.start[1] == 4:
                current, line_of[token.string] = token.string, row
            elif token.type == tokenize.COMMENT and current:
                # the comment after the field, or a comment-only line right below, indented deeper than the field
                follows = row == line_of[current] or (comments.get(current) and row == line_of[current] + 1
                                                      and token.start[1] > 4)
                if follows:
                    text = token.string.lstrip("#").strip()
                    comments[current] = f"{comments[current]} {text}" if current in comments else text
                    line_of[current] = row
            elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
                                    tokenize.DEDENT) and token.start[1] == 4:
                current = None
    return comments


def _optional(kind):
    """`X | None` -> X (the flag is simply not given for None)."""
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return kind


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def add_options(parser, cls: type, *, only: tuple[str, ...] = (), skip: tuple[str, ...] = (),
                rename: dict | None = None, convert: dict | None = None, unset: bool = False, seen: set | None = None,
                where: str | dict = "", deprecated: dict | None = None) -> None:
    """One flag per field of `cls` (those in `only`, if given; none in `skip`, nor in `seen`, which collects
    the names added). `rename`: {field: flag}; `convert`: {field: callable(text)}. The field's default is the
    flag's, or with `unset` the flag is None when not given (the dataclass keeps its default; the help names it).
    `where` prefixes the help ({field: prefix}, or one prefix for all: which tasks a shared flag serves).
    `deprecated`: {an old flag: its field}: the old spelling still sets the field, hidden from --help, and says
    once on stderr which flag to use instead."""
    old_flags = {field: old for old, field in (deprecated or {}).items()}
    hints, comments = typing.get_type_hints(cls), field_comments(cls)
    for f in dataclasses.fields(cls):
        if (only and f.name not in only) or f.name in skip or (seen is not None and f.name in seen):
            continue
        kind, default, convert_one = _optional(hints[f.name]), _default(f), (convert or {}).get(f.name)
        kwargs: dict = {"dest": f.name}
        if convert_one is not None:
            kwargs["type"] = convert_one
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            kwargs["choices"] = typing.get_args(kind)
        elif typing.get_origin(kind) is tuple:
            kwargs |= {"action": "append", "type": typing.get_args(kind)[0]}
        elif kind in (int, float, str):
            kwargs["type"] = kind
        else:
            continue  # a nested dataclass: dotted overrides
        repeatable = kwargs.get("action") == "append"
        kwargs["default"] = None if unset or repeatable else default
        shown = "" if default in ("", (), None) else f" (default: {default})"
        prefix = where.get(f.name, "") if isinstance(where, dict) else where
        kwargs["help"] = (prefix + comments.get(f.name, "")).strip() + shown
        flag = (rename or {}).get(f.name, "--" + f.name.replace("_", "-"))
        if f.name in (rename or {}) and "choices" not in kwargs and kwargs.get("action") is None:
            kwargs["metavar"] = (flag if isinstance(flag, str) else flag[0]).lstrip("-").replace("-", "_").upper()
        parser.add_argument(*([flag] if isinstance(flag, str) else flag), **kwargs)
        if f.name in old_flags:
            instead = flag if isinstance(flag, str) else flag[0]
            parser.add_argument(old_flags[f.name], **(kwargs | {"help": argparse.SUPPRESS, "default": argparse.SUPPRESS,
                                                                 "action": _renamed(instead, kwargs.get("action"))}))
        if seen is not None:
            seen.add(f.name)


def _renamed(instead: str, action) -> type[argparse.Action]:
    """The action of a deprecated flag: what `action` does (store, unless given), after a note naming `instead`."""
    base = {None: argparse._StoreAction, "append": argparse._AppendAction}.get(action, action)
    if not isinstance(base, type):
        raise ValueError(f"a deprecated spelling of {instead} cannot take the action {action!r}")

    class Renamed(base):  # type: ignore[valid-type, misc]
        def __call__(self, parser, namespace, values, option_string=None):
            import sys

            print(f"note: {option_string} is deprecated and will be removed; use {instead} (the same values)",
                  file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)

    return Renamed


def options_from(args, cls: type, **given):
    """`cls` from the parsed flags of its fields (a flag left None keeps the field's default), plus `given`."""
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if value is not None:
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**(values | given))


def given(args, names) -> dict:
    """{name: value} of the flags among `names` that were given (not None)."""
    return {n: (tuple(v) if isinstance(v, list) else v) for n in names if (v := getattr(args, n, None)) is not None}
