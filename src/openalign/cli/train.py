"""`openalign train` and `openalign tokenizer`."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from openalign import config as config_lib
from openalign import presets
from openalign.cli.common import fitted, run_flags, with_data
from openalign.config import ConfigError
from openalign.flags import add_options


def train_flags(p) -> None:
    run_flags(p, "the config")
    p.add_argument("--init", help="start from this model directory (openalign's AlignModel or ViT model, or a "
                                  "CLIPModel): its towers, weights and tokenizer (required by the finetune-flickr30k "
                                  "and finetune-coco presets)")
    p.add_argument("--out", help="the run directory (default: the preset's)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start again in an --out that holds a run (its "
                                                             "checkpoint, log, tokenizer and model are replaced)")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")


def train_config(args) -> config_lib.Config:
    """The run's config: the preset (or, resuming, the run's own), the data flags, --init, the overrides."""
    saved = Path(args.out) / "config.json" if args.out else None
    if args.resume and saved and saved.is_file():
        cfg = config_lib.load(saved)  # the resolved config of the run being resumed
    else:
        cfg = presets.get(args.preset)
    if args.out:
        cfg = dataclasses.replace(cfg, out=args.out)
    cfg = with_data(cfg, args)
    if args.init:
        cfg = from_model(cfg, Path(args.init))
    elif cfg.preset in presets.NEEDS_INIT and not cfg.model.init_from:
        raise ConfigError(f"preset {cfg.preset} fine-tunes a trained model: pass --init MODEL_DIR (e.g. "
                          "runs/demo/model)")
    return fitted(config_lib.override(cfg, args.overrides), args.overrides)


def from_model(cfg: config_lib.Config, path: Path) -> config_lib.Config:
    """Start from a trained model: its towers (architecture and weights), loss settings and tokenizer."""
    from openalign.model import hub

    source = hub.load_config(path)
    data = dataclasses.replace(cfg.data, tokenizer=str(path)) if hub.has_tokenizer(path) else cfg.data
    return dataclasses.replace(cfg, model=dataclasses.replace(source.model, init_from=str(path)), loss=source.loss,
                               data=data)


def run_train(args) -> int:
    cfg = train_config(args)
    if args.show_config:
        print(json.dumps(config_lib.to_dict(cfg), indent=2))
        return 0
    from openalign import distributed
    from openalign.prepare import prepare
    from openalign.train import report
    from openalign.train.trainer import run_lock, train

    start = time.perf_counter()
    with run_lock(cfg.out):  # the data first (corpora, keep index, tokenizer), then the training on it
        data = prepare(cfg, resume=args.resume, progress=not args.quiet, overwrite=args.overwrite)
        result = train(data, resume=args.resume, progress=not args.quiet)
    if not distributed.from_env().main:  # under torchrun, rank 0 reports
        return 0
    minutes = (time.perf_counter() - start) / 60
    print(f"\ntrained {result.step} steps in {minutes:.1f} min -> {result.out}")
    if result.metrics:
        print("held-out evaluation (R@K: fraction of queries whose match ranks in the top K):")
        print("\n".join(report.summary_lines(result.metrics, report.trained_sources(cfg))))
    kind = "VisionTextDualEncoderModel" if cfg.model.vision.kind == "vit" else "AlignModel"
    print(f"model: {result.model_dir} (a Hugging Face {kind} directory)")
    print(f"report: {result.out / 'report.md'}, plot: {result.out / 'training.png'}")
    return 0


def tokenizer_flags(p) -> None:
    p.add_argument("--data", required=True, help="the shards whose texts the vocabulary is trained on")
    p.add_argument("--out", required=True, help="the directory the tokenizer is saved to")
    add_options(p, config_lib.TextConfig, only=("vocab_size", "max_length"))


def run_tokenizer(args) -> int:
    from openalign.data import tars
    from openalign.tokenizer import train_tokenizer

    counter: dict = {}
    texts = tars.all_texts(tars.list_shards(args.data), counter=counter)
    tokenizer = train_tokenizer(texts, args.vocab_size, args.max_length)
    tokenizer.save_pretrained(args.out)
    skipped = f"; skipped {tars.skip_summary(counter)} unusable samples" if counter.get("skipped") else ""
    print(f"WordPiece vocabulary of {len(tokenizer)} tokens -> {args.out}{skipped}")
    return 0
