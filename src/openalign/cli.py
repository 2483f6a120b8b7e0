"""`openalign` command line: one entry point, subcommands, each calling one importable function.

User mistakes (bad path, unknown key, missing system package) end in one sentence, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we fork data workers after tokenizing

from openalign import config as config_lib  # noqa: E402
from openalign import presets  # noqa: E402
from openalign.config import ConfigError  # noqa: E402


def _train_config(args) -> config_lib.Config:
    saved = Path(args.out) / "config.json" if args.out else None
    if args.resume and saved and saved.is_file():
        cfg = config_lib.load(saved)  # the resolved config of the run being resumed
    else:
        cfg = presets.get(args.preset)
    if args.out:
        cfg = dataclasses.replace(cfg, out=args.out)
    if args.data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=args.data))
    if args.eval_data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=args.eval_data))
    return config_lib.override(cfg, args.overrides)


def cmd_train(args) -> int:
    cfg = _train_config(args)
    if args.show_config:
        print(json.dumps(config_lib.to_dict(cfg), indent=2))
        return 0
    from openalign.train import report
    from openalign.train.trainer import train

    start = time.perf_counter()
    result = train(cfg, resume=args.resume, progress=not args.quiet)
    minutes = (time.perf_counter() - start) / 60
    print(f"\ntrained {result.step} steps in {minutes:.1f} min -> {result.out}")
    if result.metrics:
        print("held-out evaluation (R@K: fraction of queries whose match ranks in the top K):")
        print("\n".join(report.summary_lines(result.metrics)))
    print(f"model: {result.model_dir} (a Hugging Face AlignModel directory)")
    print(f"report: {result.out / 'report.md'}, plot: {result.out / 'training.png'}")
    return 0


def cmd_eval(args) -> int:
    import torch

    from openalign.eval.tasks import DEFAULT_TEMPLATES, EvalOptions, run_tasks, write_report
    from openalign.model.hub import load_pretrained
    from openalign.train import report

    model, tokenizer, cfg = load_pretrained(Path(args.model))
    if tokenizer is None:
        raise ConfigError(f"{args.model} has no tokenizer (tokenizer.json); save the model with its tokenizer")
    torch.set_num_threads(os.cpu_count() or 1)
    templates = DEFAULT_TEMPLATES
    if args.templates:
        templates = tuple(t for t in Path(args.templates).read_text().splitlines() if t.strip())
        if not all("{}" in t for t in templates):
            raise ConfigError(f"every line of {args.templates} must contain {{}} where the class name goes")
    options = EvalOptions(batch_size=args.batch_size, max_length=cfg.model.text.max_length, templates=templates)
    metrics = run_tasks(model, tokenizer, args.data, args.task or ["retrieval", "zeroshot"], options,
                        cfg.model.vision.resize_size, cfg.model.vision.image_size)
    write_report(metrics, Path(args.out))
    print("\n".join(report.summary_lines(metrics)))
    print(f"metrics: {args.out}, table: {Path(args.out).with_suffix('.md')}")
    return 0


def cmd_corpus(args) -> int:
    from openalign.data.corpora import CORPORA

    options = {"languages": tuple(args.languages.split(",")), "noise": args.noise, "heldout": args.heldout,
               "seed": args.seed, "font_path": args.font, "cldr_path": args.cldr}
    summary = CORPORA[args.name](Path(args.out), **options)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_tokenizer(args) -> int:
    from openalign.data import shards as shard_lib
    from openalign.tokenizer import train_tokenizer

    texts = shard_lib.all_texts(shard_lib.list_shards(args.data))
    tokenizer = train_tokenizer(texts, args.vocab_size, args.max_length)
    tokenizer.save_pretrained(args.out)
    print(f"WordPiece vocabulary of {len(tokenizer)} tokens -> {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openalign", description="ALIGN: image/text dual encoders from noisy data")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a dual encoder (no arguments: the CPU demo on built-in emoji)")
    p.add_argument("--preset", default="demo", help=f"one of: {', '.join(presets.PRESETS)}")
    p.add_argument("--data", help="training shards: a directory of .tar, a brace pattern or a list file")
    p.add_argument("--eval-data", help="held-out shards for evaluation")
    p.add_argument("--out", help="run directory (default: the preset's)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=5e-4")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a saved model on held-out shards")
    p.add_argument("model", help="a model directory (RUN/model)")
    p.add_argument("--data", required=True, help="evaluation shards")
    p.add_argument("--task", action="append", help="retrieval and/or zeroshot (default: both)")
    p.add_argument("--templates", help="prompt templates file, one per line with {} for the class name")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", default="metrics.json")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("corpus", help="build a built-in corpus as webdataset shards")
    p.add_argument("name", choices=["emoji"])
    p.add_argument("--out", required=True)
    p.add_argument("--languages", default="en", help="comma-separated CLDR languages, e.g. en,de,fr,ja")
    p.add_argument("--noise", type=float, default=0.2, help="fraction of alt-texts replaced by web-like noise")
    p.add_argument("--heldout", type=float, default=0.1, help="fraction of emoji families held out for evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--font", default="/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
    p.add_argument("--cldr", default="/usr/share/unicode/cldr/common")
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("tokenizer", help="train a WordPiece vocabulary on the texts of some shards")
    p.add_argument("--data", required=True)
    p.add_argument("--vocab-size", type=int, default=100_000)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_tokenizer)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"openalign: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
