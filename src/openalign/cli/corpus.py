"""`openalign corpus`: the built-in corpora (corpora/), and the emoji corpus in every evaluation layout."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from openalign.cli.common import filter_config
from openalign.config import ConfigError
from openalign.flags import given


def corpus_parameters() -> dict[str, str]:
    """{parameter: the corpora that take it} of the built-in corpus builders (their flags)."""
    from openalign.corpora import CORPORA

    users: dict[str, list[str]] = {}
    for name, builder in CORPORA.items():
        for param in inspect.signature(builder).parameters.values():
            if param.name not in ("out", "progress", "filter_cfg") and param.kind == param.POSITIONAL_OR_KEYWORD:
                users.setdefault(param.name, []).append(name)
    return {k: ", ".join(v) for k, v in users.items()}


def corpus_flags(p) -> None:
    from openalign.corpora import CORPORA

    p.add_argument("name", choices=[*CORPORA, "emoji-eval"],
                   help="the corpus to build: emoji (CLDR names of Noto emoji), openclipart (Debian's clip art and "
                        "its titles), shapes (coloured shapes, some colour-shape pairs never in training: "
                        "compositional zero-shot), tuxpaint (Tux Paint's stamps and their descriptions), icons (an "
                        "icon theme's icons and their names), symbols (Unicode's symbols drawn by the Noto fonts, "
                        "with their Unicode and CLDR names), letters (Latin and Greek letters and digits, each in "
                        "eight Noto faces, with their Unicode names), symbola (the emoji as line art by the Symbola "
                        "font, with their CLDR names), gcompris (GCompris's photographs and drawings with the words "
                        "they teach), or "
                        "emoji-eval: the emoji corpus in every evaluation layout (Karpathy JSON, class folders, "
                        "Multi30k, CxC-style), for trying each `openalign eval` task offline")
    p.add_argument("--out", required=True, help="the corpus's folder (its train/ and eval/ shards)")
    p.add_argument("--from", dest="source", default="data/emoji", help="emoji-eval: the emoji corpus directory")
    for param, users in corpus_parameters().items():  # typed and checked by corpora.corpus_options
        flag = {"font_path": "--font", "cldr_path": "--cldr"}.get(param, "--" + param.replace("_", "-"))
        p.add_argument(flag, dest=param, help=f"{users}: the builder's {param} (lists: comma-separated; default: the "
                                                "builder's)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="openclipart: the filter's thresholds (see `openalign filter`)")


def run_corpus(args) -> int:
    from openalign.corpora import CORPORA, corpus_options

    if args.name == "emoji-eval":
        from openalign.corpora import emoji_eval

        corpus = Path(args.source)
        if not (corpus / "eval").is_dir():
            print(f"building the built-in emoji corpus in {corpus} (once)")
            CORPORA["emoji"](corpus)
        chosen = {"cldr": args.cldr_path, "seed": None if args.seed is None else int(args.seed)}
        print(json.dumps(emoji_eval.export(corpus, Path(args.out), **{k: v for k, v in chosen.items() if v is not None},
                                           progress=not args.quiet), indent=2))
        return 0
    builder = inspect.signature(CORPORA[args.name]).parameters
    options = corpus_options(args.name, tuple(f"{k}={v}" for k, v in given(args, corpus_parameters()).items()))
    if "filter_cfg" in builder:
        options["filter_cfg"] = filter_config(args.overrides)
    elif args.overrides:
        raise ConfigError(f"the {args.name} corpus takes no filter overrides ({' '.join(args.overrides)})")
    progress = {"progress": not args.quiet} if "progress" in builder else {}
    summary = CORPORA[args.name](Path(args.out), **options, **progress)
    print(json.dumps(summary, indent=2))
    return 0
