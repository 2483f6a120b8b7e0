"""Built-in corpora by name, and resolving the training/evaluation shards a config points at."""

from __future__ import annotations

import difflib
import inspect
import re
import typing
from pathlib import Path
from typing import Callable

from openalign.config import ConfigError, DataConfig
from openalign.corpora import emoji
from openalign.corpora import openclipart
from openalign.corpora import shapes
from openalign.pipeline.shard import karpathy_shards
from openalign.data.tars import MANIFEST, list_shards

CORPORA: dict[str, Callable[..., dict]] = {"emoji": emoji.build, "openclipart": openclipart.build,
                                           "shapes": shapes.build}


def _shards(spec: str, data: DataConfig, split: str, progress: bool) -> list[str]:
    """Shards as given, or those of a Karpathy-split JSON's `split`, sharded once into data_dir/karpathy/."""
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        out = Path(data.data_dir) / "karpathy" / path.stem / split.replace(",", "-")
        manifest = karpathy_shards(path, Path(data.images) if data.images else path.parent, split, out, progress)
        if not manifest["n_samples"]:
            raise ConfigError(f"no readable images of split {split} of {path} under {data.images or path.parent}; "
                              "pass --images DIR (the image root)")
        return list_shards(str(out))
    return list_shards(spec)


def resolve_data(data: DataConfig, progress: bool = True) -> tuple[list[str], list[str]]:
    """(train shards, eval shards); builds the configured built-in corpus into data_dir when absent."""
    if data.train:
        train = _shards(data.train, data, ",".join(data.train_splits), progress)
        return train, _shards(data.eval, data, data.eval_split, progress) if data.eval else []
    if not data.corpus:
        raise ConfigError("no training data: pass --data SHARDS (a directory of .tar shards) or data.corpus=emoji")
    if data.corpus not in CORPORA:
        raise ConfigError(f"unknown built-in corpus {data.corpus!r}; choose from {', '.join(CORPORA)}")
    options = corpus_options(data.corpus, data.corpus_options)
    root = Path(data.data_dir) / corpus_dir(data.corpus, data.corpus_options)
    if not ((root / "train" / MANIFEST).is_file() and (root / "eval" / MANIFEST).is_file()):
        if progress:
            print(f"building the built-in {data.corpus} corpus in {root} (once)")
        takes_progress = "progress" in inspect.signature(CORPORA[data.corpus]).parameters
        CORPORA[data.corpus](root, **options, **({"progress": progress} if takes_progress else {}))
    return list_shards(str(root / "train")), list_shards(data.eval or str(root / "eval"))


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
