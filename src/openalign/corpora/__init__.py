"""Built-in corpora by name, and resolving the training/evaluation shards a config points at."""

from __future__ import annotations

import difflib
import inspect
import json
import re
import typing
from pathlib import Path
from collections.abc import Callable

from openalign.config import ConfigError, DataConfig
from openalign.corpora import catalog
from openalign.corpora import emoji
from openalign.corpora import gcompris
from openalign.corpora import heldout
from openalign.corpora import icons
from openalign.corpora import letters
from openalign.corpora import openclipart
from openalign.corpora import shapes
from openalign.corpora import symbola
from openalign.corpora import symbols
from openalign.corpora import tuxpaint
from openalign.pipeline.shard import karpathy_shards
from openalign.data.tars import MANIFEST, list_shards

__all__ = ["CORPORA", "corpus_dir", "corpus_options", "heldout_keep", "resolve_data", "source_eval_shards",
           "source_options", "sources"]

CORPORA: dict[str, Callable[..., dict]] = {"emoji": emoji.build, "openclipart": openclipart.build,
                                           "shapes": shapes.build, "tuxpaint": tuxpaint.build, "icons": icons.build,
                                           "symbols": symbols.build, "letters": letters.build,
                                           "symbola": symbola.build, "gcompris": gcompris.build}
# built by corpora/catalog.py, which versions its builds
CATALOGUED = {"openclipart", "tuxpaint", "icons", "symbols", "letters", "symbola", "gcompris"}


def _shards(spec: str, data: DataConfig, split: str, progress: bool) -> list[str]:
    """Shards as given, or those of a Karpathy-split JSON's `split`, sharded once into data_dir/karpathy/."""
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        out = Path(data.data_dir) / "karpathy" / path.stem / split.replace(",", "-")
        manifest = karpathy_shards(path, Path(data.images) if data.images else path.parent, split, out, progress)
        if not manifest.samples:
            raise ConfigError(f"no readable images of split {split} of {path} under {data.images or path.parent}; "
                              "pass --images DIR (the image root)")
        return list_shards(str(out))
    return list_shards(spec)


def sources(corpus: str) -> list[str]:
    """The built-in corpora `data.corpus` names: one, or several joined by `+` (`emoji+openclipart+shapes`)."""
    names = [n.strip() for n in corpus.split("+") if n.strip()]
    for name in names:
        if name not in CORPORA:
            close = difflib.get_close_matches(name, list(CORPORA), n=1)
            raise ConfigError(f"unknown built-in corpus {name!r}; choose from {', '.join(CORPORA)}"
                              + (f" (did you mean {close[0]}?)" if close else ""))
    if len(set(names)) != len(names):
        raise ConfigError(f"data.corpus={corpus} names a corpus twice")
    return names


def source_options(data: DataConfig) -> dict[str, tuple[str, ...]]:
    """Each built-in corpus's own options, for those data.corpus and data.eval_corpus name. With one corpus,
    `key=value`; with several, `NAME.key=value` (an option of the corpus NAME), so that emoji's noise and shapes'
    noise can differ."""
    names = list(dict.fromkeys(sources(data.corpus) + (sources(data.eval_corpus) if data.eval_corpus else [])))
    if len(names) == 1:
        return {names[0]: tuple(data.corpus_options)}
    split: dict[str, list[str]] = {name: [] for name in names}
    for item in data.corpus_options:
        name, dot, rest = item.partition(".")
        if not dot or name not in split or "=" not in rest:
            raise ConfigError(f"data.corpus_options: {item!r}: with several corpora each option names its corpus, "
                              f"as {names[0]}.noise=0.5 (corpora: {', '.join(names)})")
        split[name].append(rest)
    return {name: tuple(items) for name, items in split.items()}


def _outdated(name: str, root: Path) -> bool:
    """Whether the corpus at `root` was built by an older version of its builder (the catalog's: CATALOGUED)."""
    if name not in CATALOGUED:
        return False
    try:
        return json.loads((root / "train" / MANIFEST).read_text()).get("version") != catalog.VERSION
    except (OSError, ValueError):
        return True


def _built(name: str, options: tuple[str, ...], data: DataConfig, progress: bool) -> Path:
    """A built-in corpus's directory, built into data_dir once."""
    kwargs = corpus_options(name, options)
    root = Path(data.data_dir) / corpus_dir(name, options)
    if not ((root / "train" / MANIFEST).is_file() and (root / "eval" / MANIFEST).is_file()) or _outdated(name, root):
        if progress:
            print(f"building the built-in {name} corpus in {root} (once)")
        takes_progress = "progress" in inspect.signature(CORPORA[name]).parameters
        CORPORA[name](root, **kwargs, **({"progress": progress} if takes_progress else {}))
    return root


def resolve_data(data: DataConfig, progress: bool = True) -> tuple[list[str], list[str]]:
    """(train shards, eval shards); builds the configured built-in corpora into data_dir when absent. Several
    corpora (`data.corpus=emoji+openclipart`): every source's training shards, and the union of their held-out
    splits (each source's alone: `source_eval_shards`)."""
    if data.train and data.eval_corpus:
        raise ConfigError("data.eval_corpus evaluates a run on built-in corpora; with --data give --eval-data")
    if data.dedup_heldout and (data.train or data.eval or data.keep):
        given = "--data" if data.train else "--eval-data" if data.eval else "data.keep"
        raise ConfigError(f"data.dedup_heldout compares the built-in corpora's training and held-out splits; with "
                          f"{given} run `openalign dedup PAIRS --against HELDOUT` and pass its output as data.keep")
    if data.train:
        train = _shards(data.train, data, ",".join(data.train_splits), progress)
        return train, _shards(data.eval, data, data.eval_split, progress) if data.eval else []
    if not data.corpus:
        raise ConfigError("no training data: pass --data SHARDS (a directory of .tar shards) or data.corpus=emoji")
    options = source_options(data)
    roots = {name: _built(name, own, data, progress) for name, own in options.items()}
    train = [shard for name in sources(data.corpus) for shard in list_shards(str(roots[name] / "train"))]
    if data.eval:
        return train, list_shards(data.eval)
    evaluated = sources(data.eval_corpus or data.corpus)
    return train, [shard for name in evaluated for shard in list_shards(str(roots[name] / "eval"))]


def heldout_keep(data: DataConfig, progress: bool = True) -> str:
    """data.dedup_heldout: the keep index of the training samples of data.corpus that are no near-duplicate of a
    held-out image of data.eval_corpus (or data.corpus), built once (corpora/heldout.py); '' when not asked for.
    The corpora must be built (resolve_data)."""
    if not data.dedup_heldout:
        return ""
    options = source_options(data)
    root = {name: Path(data.data_dir) / corpus_dir(name, own) for name, own in options.items()}
    train = {name: list_shards(str(root[name] / "train")) for name in sources(data.corpus)}
    held = {name: list_shards(str(root[name] / "eval")) for name in sources(data.eval_corpus or data.corpus)}
    return heldout.build_heldout_keep_index(train, held, Path(data.data_dir), progress=progress)


def source_eval_shards(data: DataConfig) -> dict[str, list[str]]:
    """Each corpus's held-out shards when the run is evaluated on several (data.eval_corpus, or data.corpus);
    built by resolve_data; {} otherwise."""
    if data.train or not data.corpus or data.eval:
        return {}
    evaluated = sources(data.eval_corpus or data.corpus)
    if len(evaluated) < 2:
        return {}
    options = source_options(data)
    return {name: list_shards(str(Path(data.data_dir) / corpus_dir(name, options[name]) / "eval"))
            for name in evaluated}


def corpus_dir(corpus: str, options: tuple[str, ...]) -> str:
    """`emoji`, or `emoji-languagesen.de-noise0.5` for a corpus built with options."""
    slug = "-".join(re.sub(r"[^A-Za-z0-9.]+", "", re.sub(r"[+,]", ".", o)) for o in sorted(options))
    return f"{corpus}-{slug}" if slug else corpus


def corpus_options(corpus: str, options: tuple[str, ...]) -> dict:
    """`key=value` options as typed keyword arguments of the corpus's builder; list values are joined
    with `+` (`languages=en+de+fr`: commas separate the options themselves in a dotted override)."""
    builder = CORPORA[corpus]
    hints = typing.get_type_hints(builder)
    allowed = [n for n in inspect.signature(builder).parameters if n not in ("out", "progress")]
    out = {}
    for item in options:
        key, sep, text = item.partition("=")
        if not sep or key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]}?" if close else f"options: {', '.join(allowed)}"
            raise ConfigError(f"data.corpus_options: {item!r} is not an option of the {corpus} corpus; {hint}")
        kind = hints.get(key, str)
        try:
            if typing.get_origin(kind) is tuple:
                out[key] = tuple(t.strip() for t in re.split(r"[+,]", text) if t.strip())
            elif kind in (int, float):
                out[key] = kind(text)
            else:
                out[key] = text
        except ValueError:
            raise ConfigError(f"data.corpus_options: {item!r}: {text!r} is not a valid {kind.__name__}") from None
    return out
