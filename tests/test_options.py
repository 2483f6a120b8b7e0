"""Every public options class checks its fields' types at construction, in one mechanism (config.Options): a value
of the wrong type is one sentence naming the field, never an AttributeError or TypeError from deep inside, and
never a silent run (a str taken for a tuple of str would be read one character at a time)."""

import dataclasses
import types
import typing
from pathlib import Path

import pytest

import openalign
from openalign.config import ConfigError, Options, expect, listed, type_problem

PUBLIC = sorted(n for n in openalign.__all__ if n.endswith("Options") or n == "FilterConfig")


def wrong_values(kind) -> list:
    """Values of another type than the annotation `kind` allows."""
    base = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
    args, optional = typing.get_args(base), False
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        base, optional = next(a for a in args if a is not type(None)), type(None) in args
    if typing.get_origin(base) is typing.Literal:
        return [object(), 3.5]
    if typing.get_origin(base) is tuple:
        return ["noai", 5, ("ok", 5) if typing.get_args(base)[0] is str else ("x",)]
    found = {bool: ["yes", 1, None], int: ["3", 2.5, True, None], float: ["0.5", None, True], str: [5, None, b"x"],
             Path: [5, None]}.get(base, [object()])
    return [v for v in found if not (optional and v is None)]


def valid(cls) -> dict:
    """Values for the fields a class requires (no default)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found = {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            found[f.name] = "x" if type_problem("x", hints[f.name]) is None else 1
    return found


@pytest.mark.parametrize("name", PUBLIC)
def test_every_field_of_every_public_options_class_refuses_a_value_of_the_wrong_type(name):
    # Before: FetchOptions(opt_out="noai") read four one-letter directives and stopped honouring `noai`;
    # ScoreOptions(keep_fraction="0.5") and IngestOptions(workers="2") ran on, to fail deep inside or not at all.
    cls = getattr(openalign, name)
    assert issubclass(cls, Options), f"{name} does not check its fields (config.Options)"
    base = valid(cls)
    cls(**base)  # the defaults and the required values are right
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        also = tuple(t for rule in getattr(hints[f.name], "__metadata__", ()) for t in getattr(rule, "also", ()))
        for value in wrong_values(hints[f.name]):
            if also and isinstance(value, also) and not isinstance(value, bool):
                continue  # a type its rule takes too (a size: a number of bytes)
            with pytest.raises(ConfigError) as caught:
                cls(**base | {f.name: value})
            sentence = str(caught.value)
            assert cls.spell(cls(**base), f.name) in sentence and "\n" not in sentence, (name, f.name, value)


def test_a_str_is_never_a_tuple_of_str_and_a_list_is_the_tuple_it_means():
    from openalign import FetchOptions

    with pytest.raises(ConfigError, match=r"--opt-out='noai' must be a tuple of strings, not one string \(write "
                                          r"\('noai',\)\)"):
        FetchOptions(opt_out="noai")
    assert FetchOptions(opt_out=["noai"]).opt_out == ("noai",)
    assert FetchOptions(timeout=30).timeout == 30  # an int is a number


def test_an_options_argument_of_another_type_is_one_sentence(tmp_path):
    from openalign import ExtractOptions, FetchOptions, extract, fetch

    table = tmp_path / "urls.csv"
    table.write_text("url,caption\nhttp://a.example/x.jpg,a cat\n")
    for bad in ({"per_host": 2}, None, 3, FetchOptions):
        with pytest.raises(ConfigError, match=r"^options must be a FetchOptions \(e\.g\. FetchOptions\(\.\.\.\)"):
            fetch(table, tmp_path / "out", bad)
    with pytest.raises(ConfigError, match="^engine must be an Engine"):
        extract([str(table)], tmp_path / "x", ExtractOptions(), engine="spark")
    # one path where a list is expected is that one path, not its characters
    assert extract(str(table), tmp_path / "one", ExtractOptions(language=False), progress=False).files == 1
    assert listed(Path("a"), "sources") == [Path("a")] and listed(("a", "b"), "x") == ["a", "b"]
    with pytest.raises(ConfigError, match="sources must be a list of paths"):
        listed(5, "sources")
    assert expect(FetchOptions(), FetchOptions) == FetchOptions()


def test_the_checker_checks_itself():
    assert type_problem(3, int) is None and type_problem(True, int) == "an integer"
    assert type_problem(2, float) is None and type_problem("2", float) == "a number"
    assert type_problem(None, int | None) is None and type_problem("a", int | None) == "an integer"
    assert type_problem(("a", 1), tuple[str, ...]) == "a tuple of strings (1 is not one)"
