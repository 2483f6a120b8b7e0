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
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by default: a local path never falls through to a hub

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
    cfg = _with_data(cfg, args)
    if args.init:
        cfg = _from_model(cfg, Path(args.init))
    elif cfg.preset in presets.NEEDS_INIT and not cfg.model.init_from:
        raise ConfigError(f"preset {cfg.preset} fine-tunes a trained model: pass --init MODEL_DIR (e.g. runs/demo/model)")
    return config_lib.override(cfg, args.overrides)


def _with_data(cfg: config_lib.Config, args) -> config_lib.Config:
    """--data / --eval-data (and --images, their image root), where given, as the config's training and
    held-out data."""
    if args.data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=args.data))
    if args.eval_data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=args.eval_data))
    if args.images:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, images=args.images))
    return cfg


def _from_model(cfg: config_lib.Config, path: Path) -> config_lib.Config:
    """Start from a trained model: its towers (architecture and weights), loss settings and tokenizer."""
    from openalign.model import hub

    source = hub.load_config(path)
    data = dataclasses.replace(cfg.data, tokenizer=str(path)) if hub.has_tokenizer(path) else cfg.data
    return dataclasses.replace(cfg, model=dataclasses.replace(source.model, init_from=str(path)), loss=source.loss,
                               data=data)


def cmd_train(args) -> int:
    cfg = _train_config(args)
    if args.show_config:
        print(json.dumps(config_lib.to_dict(cfg), indent=2))
        return 0
    from openalign.train import report
    from openalign.train.trainer import train

    start = time.perf_counter()
    result = train(cfg, resume=args.resume, progress=not args.quiet)
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 reports
        return 0
    minutes = (time.perf_counter() - start) / 60
    print(f"\ntrained {result.step} steps in {minutes:.1f} min -> {result.out}")
    if result.metrics:
        print("held-out evaluation (R@K: fraction of queries whose match ranks in the top K):")
        print("\n".join(report.summary_lines(result.metrics)))
    print(f"model: {result.model_dir} (a Hugging Face AlignModel directory)")
    print(f"report: {result.out / 'report.md'}, plot: {result.out / 'training.png'}")
    return 0


def cmd_study(args) -> int:
    from openalign.study import QUICK, STUDIES, run_study
    from openalign.study import report as study_report

    if args.name not in STUDIES:
        raise ConfigError(f"unknown study {args.name!r}; choose from {', '.join(STUDIES)}")
    study = STUDIES[args.name]
    cfg = _with_data(presets.get(args.preset), args)
    cfg = config_lib.override(cfg, ([*QUICK, *study.quick] if args.quick else []) + list(args.overrides))
    variants = study.variants(cfg)
    if args.only:
        variants = [v for v in variants if v.baseline or v.group in args.only or v.name in args.only]
    out = Path(args.out)
    start = time.perf_counter()
    results = run_study(args.name, cfg, variants, args.seeds, out, progress=not args.quiet)
    if os.environ.get("RANK", "0") != "0":  # under torchrun every rank trained; rank 0 reports
        return 0
    report = study_report.write(args.name, study, results, args.seeds, out, study.headline(cfg))
    if study.extra_report:
        report.write_text(report.read_text() + "\n".join(study.extra_report(results, out)) + "\n")
    runs = sum(len(r["runs"]) for r in results.values())
    print(f"{len(results)} variants x {args.seeds} seed(s) ({runs} runs) in {(time.perf_counter() - start) / 60:.1f} "
          f"min -> {report}, {out / 'study.png'}, {out / 'results.json'}")
    key, metric = study.headline(cfg)
    for name, row in results.items():
        mean, std = row["mean"].get(key, float("nan")), row["std"].get(key, 0.0)
        print(f"  {row['label']:<40} {metric} {mean:.3f} ± {std:.3f}")
    return 0


def cmd_eval(args) -> int:
    import torch

    from openalign.eval.datasets import load_templates
    from openalign.eval.features import EvalOptions, files_fingerprint
    from openalign.eval.finetune import parse_options
    from openalign.eval.report import metric_lines, write_report
    from openalign.eval.tasks import configure, run_tasks
    from openalign.model.hub import load_pretrained

    model, tokenizer, cfg = load_pretrained(Path(args.model))
    if tokenizer is None:
        raise ConfigError(f"{args.model} has no tokenizer (tokenizer.json); save the model with its tokenizer")
    torch.set_num_threads(os.cpu_count() or 1)
    common = EvalOptions(batch_size=args.batch_size, max_length=cfg.model.text.max_length, images=args.images or "",
                         split=args.split, resize=cfg.model.vision.resize_size, crop=cfg.model.vision.image_size,
                         cache=args.cache or "", model_id=files_fingerprint(args.model) if args.cache else "")
    names = args.task or []
    options = configure(names or ["retrieval", "zeroshot"], args.overrides,
                        templates=load_templates(args.templates) if args.templates else None,
                        classnames=args.classnames, class_subset=args.class_subset, train_data=args.train_data,
                        k=args.k, dir=args.cxc, positive_score=args.positive_score, captions=args.captions,
                        seed=args.seed, recipe=parse_options(args.ft or []), sweep=tuple(args.sweep or ()),
                        runs=args.runs)
    metrics, figures = run_tasks(model, tokenizer, args.data, names, common, options)
    written = write_report(metrics, Path(args.out), figures)
    print("\n".join(metric_lines(metrics)))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def cmd_corpus(args) -> int:
    from openalign.data.corpora import CORPORA

    if args.name == "emoji-eval":
        from openalign.data import emoji_eval

        corpus = Path(args.source)
        if not (corpus / "eval").is_dir():
            print(f"building the built-in emoji corpus in {corpus} (once)")
            CORPORA["emoji"](corpus)
        print(json.dumps(emoji_eval.export(corpus, Path(args.out), cldr=args.cldr, seed=args.seed,
                                           progress=not args.quiet), indent=2))
        return 0
    if args.name == "emoji":
        options = {"languages": tuple(args.languages.split(",")), "noise": args.noise, "seed": args.seed,
                   "heldout": 0.1 if args.heldout is None else args.heldout, "font_path": args.font,
                   "cldr_path": args.cldr, "eval_languages": tuple(filter(None, args.eval_languages.split(",")))}
    elif args.name == "shapes":
        options = {"noise": args.noise, "seed": args.seed}
    else:
        options = {"root": args.root, "heldout": 0.1 if args.heldout is None else args.heldout, "seed": args.seed,
                   "image_size": args.image_size, "engine": args.engine,
                   "filter_cfg": _filter_config(args.overrides), "progress": not args.quiet}
    summary = CORPORA[args.name](Path(args.out), **options)
    print(json.dumps(summary, indent=2))
    return 0


def _filter_config(overrides: list[str]) -> config_lib.FilterConfig:
    cfg = config_lib.override(config_lib.FilterConfig(), overrides,
                              help_hint="the filter keys are " + ", ".join(config_lib.leaf_keys(config_lib.FilterConfig)))
    config_lib.validate(cfg)
    return cfg


def cmd_ingest(args) -> int:
    from openalign.data.ingest import IngestOptions, ingest

    options = IngestOptions(image_column=args.image_column, text_column=args.text_column,
                            max_pixels=args.max_pixels, workers=args.workers, files_per_task=args.files_per_task)
    manifest = ingest(args.sources, Path(args.out), options, progress=not args.quiet, engine=_engine(args))
    rejected = ", ".join(f"{k} {v:,}" for k, v in manifest["rejected"].items()) or "none"
    converted = ", ".join(f"{k} {v:,}" for k, v in manifest["conversions"].items()) or "none"
    print(f"{manifest['pairs']:,} pairs ({manifest['images']:,} images) -> {args.out} in {manifest['seconds']:.1f} s")
    print(f"rejected: {rejected} (listed in {manifest['rejects']})")
    print(f"kept with conversion: {converted}")
    return 0


def _bytes(text: str, flag: str) -> int:
    """'4G', '512M', '1.5GiB', '1000000' -> bytes (powers of 1024); '' or 0 -> 0 (no limit)."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text or "0", re.IGNORECASE)
    if not match:
        raise ConfigError(f"{flag} {text!r} is not a size; write e.g. 4G, 512M or a number of bytes")
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))


def _engine(args):
    from openalign.data.distribute import Engine

    return Engine(args.engine, args.master, args.workers, args.retries, args.spark_memory)


def _engine_flags(p) -> None:
    """--engine local|spark and its settings, for the per-image data stages (data/distribute.py)."""
    p.add_argument("--engine", default="local", choices=["local", "spark"],
                   help="local: this machine's processes; spark: one Spark task per input tar, table or shard")
    p.add_argument("--master", default="", help="spark: local[N], spark://HOST:7077, yarn, k8s://... "
                                                "(default: spark-submit's master, else local[*])")
    p.add_argument("--retries", type=int, default=2, help="times a failed task is run again")
    p.add_argument("--spark-memory", default="", help="spark: driver memory, e.g. 4g")


def cmd_filter(args) -> int:
    from openalign.data import filters

    cfg = _filter_config(args.overrides)
    report = filters.run_filters(Path(args.pairs), Path(args.out), cfg, engine=args.engine, master=args.master,
                                 memory_limit=args.memory_limit, threads=args.threads, progress=not args.quiet)
    print("\n".join(filters.summary_lines(report)))
    print(f"keep-list: {report['keep']}, report: {Path(args.out) / 'filter_report.json'} (+ .png)")
    return 0


def cmd_dedup(args) -> int:
    from openalign.data.dedup import DedupOptions, dedup

    options = DedupOptions(mode=args.mode, max_distance=args.max_distance, threshold=args.threshold,
                           model=args.model or "", workers=args.workers, images_per_task=args.images_per_task)
    report = dedup(args.pairs, args.against, Path(args.out), options, progress=not args.quiet, engine=_engine(args))
    print(f"{report['removed_images']:,} of {report['train_images']:,} training images ({report['removed_pairs']:,} "
          f"pairs) are near-duplicates of the {report['eval_images']:,} evaluation images ({report['rule']})")
    print(f"keep-list: {report['keep']}, report: {Path(args.out) / 'dedup_report.json'}")
    return 0


def cmd_screen(args) -> int:
    from openalign.data.screen import ScreenOptions, screen

    options = ScreenOptions(classifier=args.classifier, threshold=args.threshold, batch_size=args.batch_size,
                            images_per_task=args.images_per_task)
    report = screen(args.pairs, Path(args.out), options, progress=not args.quiet, engine=_engine(args))
    print(f"{report['removed_images']:,} of {report['images']:,} images ({report['removed_pairs']:,} pairs) scored "
          f">= {args.threshold} by {args.classifier}; {report['unreadable_images']:,} unreadable")
    print(f"keep-list: {report['keep']}, report: {Path(args.out) / 'screen_report.json'}")
    return 0


def cmd_shard(args) -> int:
    from openalign.data.sharding import ShardOptions, shard

    options = ShardOptions(image_size=args.image_size, samples_per_shard=args.samples_per_shard,
                           prefix=args.prefix, workers=args.workers)
    manifest = shard(args.pairs, [Path(k) for k in args.keep], Path(args.out), options, progress=not args.quiet,
                     engine=_engine(args))
    skipped = ", ".join(f"{k} {v:,}" for k, v in manifest["skipped"].items()) or "none"
    print(f"{manifest['n_samples']:,} images in {len(manifest['shards'])} shards -> {args.out} "
          f"({manifest['resumed_shards']} already done; skipped: {skipped})")
    return 0


def cmd_tokenizer(args) -> int:
    from openalign.data import shards as shard_lib
    from openalign.tokenizer import train_tokenizer

    counter: dict = {}
    texts = shard_lib.all_texts(shard_lib.list_shards(args.data), counter=counter)
    tokenizer = train_tokenizer(texts, args.vocab_size, args.max_length)
    tokenizer.save_pretrained(args.out)
    skipped = f"; skipped {shard_lib.skip_summary(counter)} unusable samples" if counter.get("skipped") else ""
    print(f"WordPiece vocabulary of {len(tokenizer)} tokens -> {args.out}{skipped}")
    return 0


def cmd_embed(args) -> int:
    from openalign.index.embed import EmbedOptions, embed

    options = EmbedOptions(batch_size=args.batch_size, part_size=args.part_size, float16=args.float16,
                           images=args.image_root or "", texts=args.texts, device=args.device)
    manifest = embed(Path(args.model), args.images, Path(args.out), options, progress=not args.quiet)
    from openalign import distributed

    if distributed.from_env().main:
        texts = " and caption" if manifest["texts"] else ""
        print(f"{manifest['count']:,} image{texts} embeddings ({manifest['dim']}-d {manifest['dtype']}) -> {args.out}; "
              f"{manifest['skipped']:,} unreadable images skipped; {manifest['resumed_parts']} of "
              f"{len(manifest['parts'])} parts were already done")
    return 0


def cmd_index(args) -> int:
    from openalign.index.build import IndexOptions, build

    if args.nlist < 0 or args.train_per_cell < 39:
        raise ConfigError("--nlist must be 0 (automatic) or more, and --train-per-cell at least 39")
    options = IndexOptions(kind=args.kind, recall=args.recall, nlist=args.nlist, train_per_cell=args.train_per_cell,
                           codes=args.codes, vectors=args.vectors, memory=_bytes(args.memory, "--memory"),
                           block_rows=args.block_rows)
    info = build(Path(args.embeddings), Path(args.out), options, engine=_engine(args), progress=not args.quiet)
    params = ", ".join(f"{k} {v}" for k, v in info["params"].items()) or "exact"
    where = (f"; {len(info['shards'])} IVF shards on disk, searched together, tuned on the first"
             if info["storage"] == "shards" else "")
    print(f"{info['kind']} index of {info['count']:,} {info['vectors']} vectors ({params}; recall@10 "
          f"{info['recall_at_10']:.3f} against exact search{where}) -> {args.out}")
    return 0


def cmd_search(args) -> int:
    from openalign.index import build, search

    index = build.load(Path(args.index))
    model, tokenizer = search.load_model_for(index, args.model)
    if args.image and not Path(args.image).is_file():
        raise ConfigError(f"no image file {args.image}")
    image = Path(args.image).read_bytes() if args.image else None
    query = search.Query(text=args.text or "", image=image, image_id=args.image_id, plus=tuple(args.plus or ()),
                         minus=tuple(args.minus or ()), image_weight=args.image_weight, text_weight=args.text_weight)
    hits = search.search(index, search.query_vector(model, tokenizer, query, index), args.k)
    print(f"{'rank':>4}  {'score':>6}  {'id':>7}  path / caption")
    for hit in hits:
        caption = f"  \"{hit.meta.get('caption')}\"" if hit.meta.get("caption") else ""
        print(f"{hit.rank:>4}  {hit.score:6.3f}  {hit.id:>7}  {hit.meta.get('path') or hit.meta.get('key')}{caption}")
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from openalign.serve.app import Limits, create_app

    app = create_app(Path(args.index), args.model, Limits(max_upload_bytes=args.max_upload_mb * 2**20))
    print(f"openalign search on http://{args.host}:{args.port}/ (API docs at /docs); Ctrl-C stops it")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openalign")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openalign", description="ALIGN: image/text dual encoders from noisy data")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a dual encoder (no arguments: the CPU demo on built-in emoji)")
    p.add_argument("--preset", default="demo", help=f"one of: {', '.join(presets.PRESETS)}")
    p.add_argument("--data", help="training shards: a directory of .tar, a brace pattern or a list file")
    p.add_argument("--eval-data", help="held-out shards for evaluation")
    p.add_argument("--images", help="image root when --data / --eval-data is a Karpathy-split JSON")
    p.add_argument("--init", help="start from this model directory: its towers, weights and tokenizer "
                                  "(required by the finetune-flickr30k / finetune-coco presets)")
    p.add_argument("--out", help="run directory (default: the preset's)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=5e-4")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("study", help="rerun one of the paper's arguments in miniature (report, plots, JSON)")
    p.add_argument("name", help="ablation, noise-vs-scale, model-vs-data, multilingual, compositional or dynamics")
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="demo", help="the base config of every run")
    p.add_argument("--quick", action="store_true", help="short runs: minutes each on a CPU")
    p.add_argument("--seeds", type=int, default=1, help="runs per variant (mean ± std)")
    p.add_argument("--only", action="append", help="a group or variant to run (repeatable); the baseline always runs")
    p.add_argument("--data", help="training shards (default: the preset's corpus)")
    p.add_argument("--eval-data", help="held-out shards, or a Karpathy-split JSON")
    p.add_argument("--images", help="image root when --data / --eval-data is a Karpathy-split JSON")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of the base config")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("eval", help="evaluate a saved model: retrieval, zero-shot, transfer, similarity")
    p.add_argument("model", help="a model directory (RUN/model)")
    p.add_argument("--data", required=True,
                   help="evaluation shards, a Karpathy-split JSON (dataset_flickr30k.json) or a caption table")
    p.add_argument("--images", help="image root for a Karpathy JSON or caption table (default: beside the file)")
    p.add_argument("--split", default="test", help="Karpathy split (test: the 1K Flickr30K / 5K COCO protocol)")
    p.add_argument("--task", action="append",
                   help="retrieval, zeroshot, knn, linear-probe, cxc, multilingual, arithmetic, compositional "
                        "(default: retrieval + zeroshot with captions, zeroshot for a classification set); word-sim "
                        "or sts on a file of scored "
                        "text pairs; finetune (a labeled test split, with --train-data) or vtab (task directories)")
    p.add_argument("--templates", help="imagenet80 (CLIP's 80 prompts), generic, or a file with one template per "
                                       "line, {} for the class name (default: the preset's short set)")
    p.add_argument("--classnames", help="zero-shot: class names, `label,name` lines or one per sorted label")
    p.add_argument("--class-subset", help="zero-shot: file of labels; only these classes compete (ImageNet-R/A)")
    p.add_argument("--train-data", help="knn / linear-probe: the labeled training split (folders, table or shards)")
    p.add_argument("-k", type=int, default=1, help="knn: neighbours (1: the paper's ImageNet KNN R@1)")
    p.add_argument("--cxc", help="cxc: directory with Crisscrossed Captions' sts_/sis_/sits_<split>.csv")
    p.add_argument("--positive-score", type=float, default=3.0, help="cxc: human score (0-5) that makes a positive")
    p.add_argument("--captions", help="multilingual: directory of Multi30k caption files (default: beside --data)")
    p.add_argument("--ft", action="append", metavar="key=value",
                   help="finetune/vtab recipe, e.g. --ft steps=500 --ft lr=0.01 --ft freeze_bn=true (keys: steps, "
                        "batch_size, lr, head_lr_scale, momentum, weight_decay, warmup_fraction, freeze_bn)")
    p.add_argument("--sweep", action="append", metavar="key=v1,v2",
                   help="vtab: a sweep axis, e.g. --sweep lr=0.1,0.01 --sweep steps=2500,10000 (default: VTAB's)")
    p.add_argument("--runs", type=int, default=3, help="vtab: retrain runs (seeds) for mean and std")
    p.add_argument("--seed", type=int, default=0, help="finetune/vtab: the first seed")
    p.add_argument("--cache", help="a directory where image embeddings are kept and reused by later runs on the "
                                   "same model, data and image size (e.g. several probes of one large set)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", default="metrics.json")
    p.add_argument("overrides", nargs="*", metavar="task.key=value",
                   help="task options, e.g. knn.k=5 cxc.positive_score=4 finetune.recipe.lr=0.01")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("corpus", help="build a built-in corpus as webdataset shards")
    p.add_argument("name", choices=["emoji", "openclipart", "shapes", "emoji-eval"],
                   help="shapes: coloured shapes, some colour-shape pairs never in training (compositional zero-shot); "
                        "emoji-eval: the emoji corpus in every evaluation layout (Karpathy JSON, class folders, "
                        "Multi30k, CxC-style), for trying each `openalign eval` task offline")
    p.add_argument("--from", dest="source", default="data/emoji", help="emoji-eval: the emoji corpus directory")
    p.add_argument("--out", required=True)
    p.add_argument("--heldout", type=float, help="fraction held out for evaluation (emoji: of families; default 0.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--languages", default="en", help="emoji: comma-separated CLDR languages, e.g. en,de,fr,ja")
    p.add_argument("--eval-languages", default="", help="emoji: more languages whose texts only the held-out split "
                                                         "carries (for --task multilingual), e.g. sv,fi,ko")
    p.add_argument("--noise", type=float, default=0.2,
                   help="emoji, shapes: fraction of alt-texts replaced by web-like noise")
    p.add_argument("--font", default="/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf", help="emoji: the font")
    p.add_argument("--cldr", default="/usr/share/unicode/cldr/common", help="emoji: CLDR common/ directory")
    p.add_argument("--root", default="/usr/share/openclipart/png", help="openclipart: the PNG tree")
    p.add_argument("--image-size", type=int, default=346, help="openclipart: shorter side of the stored images")
    p.add_argument("--engine", default="duckdb", choices=["duckdb", "spark"], help="openclipart: filter engine")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="openclipart: filter thresholds (see filter)")
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("ingest", help="folders, tables (csv/tsv/jsonl/parquet) and webdataset tars -> a pair table")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--out", required=True, help="pairs.parquet (a .rejects.parquet and .manifest.json go beside it)")
    p.add_argument("--image-column", default="image", help="tables: the column with an image path or URL")
    p.add_argument("--text-column", default="text", help="tables: the column with the alt-text")
    p.add_argument("--max-pixels", type=int, default=89_478_485, help="larger images are rejected (decompression bombs)")
    p.add_argument("--workers", type=int, default=0, help="processes reading images (0: all cores)")
    p.add_argument("--files-per-task", type=int, default=1_000, help="spark: image files of a directory per task")
    _engine_flags(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("filter", help="ALIGN's frequency filters -> keep-list + filter_report.json/.png")
    p.add_argument("pairs", help="the pair table from `openalign ingest`")
    p.add_argument("--out", required=True)
    p.add_argument("--engine", default="duckdb", choices=["duckdb", "spark"])
    p.add_argument("--master", default="", help="spark: local[N], spark://HOST:7077, yarn, ... (default: "
                                                "spark-submit's master, else local[*])")
    p.add_argument("--memory-limit", default="", help="e.g. 4GB (duckdb spills to disk beyond it; spark driver memory)")
    p.add_argument("--threads", type=int, default=0, help="0: all cores")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="thresholds, e.g. min_short_side=200 max_images_per_text=10 vocab_size=100000000")
    p.set_defaults(func=cmd_filter)

    p = sub.add_parser("dedup", help="drop training images that are near-duplicates of evaluation images")
    p.add_argument("pairs")
    p.add_argument("--against", required=True, help="evaluation images: shards, an image folder or a pair table")
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="phash", choices=["phash", "embedding"])
    p.add_argument("--max-distance", type=int, default=4, help="phash: Hamming bits of 64 counted as a duplicate")
    p.add_argument("--threshold", type=float, default=0.975, help="embedding: cosine above which (paper 0.975)")
    p.add_argument("--model", help="embedding: an openalign model directory")
    p.add_argument("--workers", type=int, default=0, help="local engine: processes (0: all cores; embedding: 1)")
    p.add_argument("--images-per-task", type=int, default=2_000, help="the unit of distribution and resume")
    _engine_flags(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_dedup)

    p = sub.add_parser("screen", help="drop images an image classifier flags (the paper's unsafe-image filter)")
    p.add_argument("pairs")
    p.add_argument("--classifier", required=True,
                   help="module:function or file.py:function taking a list of RGB PIL images, returning scores")
    p.add_argument("--threshold", type=float, default=0.5, help="images scoring at or above it are dropped")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=1, help="local engine: processes, each with the classifier")
    p.add_argument("--images-per-task", type=int, default=2_000, help="the unit of distribution and resume")
    _engine_flags(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_screen)

    p = sub.add_parser("shard", help="kept pairs -> resized webdataset shards (reruns skip finished shards)")
    p.add_argument("pairs")
    p.add_argument("--keep", action="append", default=[],
                   help="a keep-list directory; repeat to intersect (none: every pair, for a clean collection)")
    p.add_argument("--out", required=True)
    p.add_argument("--image-size", type=int, default=346, help="shorter side (paper 346; never upscaled; 0: as is)")
    p.add_argument("--samples-per-shard", type=int, default=1000)
    p.add_argument("--prefix", default="shard")
    p.add_argument("--workers", type=int, default=0)
    _engine_flags(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_shard)

    p = sub.add_parser("embed", help="image embeddings of a collection (resumable parts + metadata)")
    p.add_argument("model", help="a model directory (RUN/model)")
    p.add_argument("--images", required=True, action="append",
                   help="an image directory, shards, or a Karpathy JSON / caption table (repeatable)")
    p.add_argument("--image-root", help="image root for a Karpathy JSON or caption table (default: beside it)")
    p.add_argument("--out", required=True)
    p.add_argument("--float16", action="store_true", help="store float16 embeddings (half the size)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--part-size", type=int, default=8_192,
                   help="images per part of a directory or table (a shard is one part): the unit of resuming")
    p.add_argument("--texts", action="store_true", help="also embed each image's caption (text->text search, "
                                                        "text indexes: `openalign index --vectors text`)")
    p.add_argument("--device", default="auto", help="auto: this rank's GPU if any, else cpu")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("index", help="a FAISS index over embeddings, tuned to a recall target")
    p.add_argument("embeddings", help="the output of `openalign embed`")
    p.add_argument("--out", required=True)
    p.add_argument("--kind", default="auto", choices=["auto", "flat", "ivf", "hnsw"],
                   help="auto: exact up to 200,000 vectors, IVF beyond")
    p.add_argument("--recall", type=float, default=0.95, help="recall@10 target of approximate indexes")
    p.add_argument("--nlist", type=int, default=0, help="ivf: k-means cells (default 4 sqrt(n))")
    p.add_argument("--codes", default="auto", choices=["auto", "flat", "sq8", "pq"],
                   help="ivf: how vectors are stored (auto: 8-bit codes, product quantization beyond 8 GiB)")
    p.add_argument("--train-per-cell", type=int, default=64,
                   help="ivf: k-means training vectors per cell (39 to 256; more is slower to build)")
    p.add_argument("--vectors", default="image", choices=["image", "text"],
                   help="text: the captions `openalign embed --texts` embedded (text->text search)")
    p.add_argument("--memory", default="", help="what the build may hold, e.g. 4G (vectors are streamed from the "
                                                "parts; ivf codes beyond half of it go to IVF shards on disk)")
    p.add_argument("--block-rows", type=int, default=0, help="ivf shards: vectors per shard / add task (0: from --memory)")
    p.add_argument("--workers", type=int, default=1, help="ivf shards, local engine: add tasks run at once")
    _engine_flags(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="search an index by text, image, or image +/- texts")
    p.add_argument("index")
    p.add_argument("--model", help="the model the index was embedded with (default: the one recorded)")
    p.add_argument("--text", help="a text query")
    p.add_argument("--image", help="an image file as the query")
    p.add_argument("--image-id", type=int, help="an image of the index, by id, as the query")
    p.add_argument("--plus", action="append", help="a text added to the image query (repeatable)")
    p.add_argument("--minus", action="append", help="a text subtracted from the image query (repeatable)")
    p.add_argument("--text-weight", type=float, default=2.0, help="weight of the texts in image+text (paper: 2)")
    p.add_argument("--image-weight", type=float, default=1.0, help="weight of the image (paper: 1)")
    p.add_argument("-k", type=int, default=10)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("serve", help="the search page and HTTP API over an index")
    p.add_argument("index")
    p.add_argument("--model", help="the model the index was embedded with (default: the one recorded)")
    p.add_argument("--host", default="127.0.0.1", help="127.0.0.1: this machine only; 0.0.0.0 to share it")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-upload-mb", type=int, default=10, help="largest query image accepted")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("tokenizer", help="train a WordPiece vocabulary on the texts of some shards")
    p.add_argument("--data", required=True)
    p.add_argument("--vocab-size", type=int, default=100_000)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_tokenizer)
    return parser


def _sentence(err: ConfigError) -> str:
    """The error's own sentence; a ConfigError raised in a DataLoader worker comes back wrapped in the worker's
    traceback ("Caught ConfigError in DataLoader worker process 0. Original Traceback ..."): its last line."""
    text = str(err).strip()
    if "Original Traceback" in text:
        text = text.splitlines()[-1].split("ConfigError: ", 1)[-1]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `filter PAIRS --out D key=value`: overrides after options land in `extra`; argparse cannot intermix them
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code = args.func(args)
    except ConfigError as err:
        print(f"openalign: error: {_sentence(err)}", file=sys.stderr)
        return 2
    if "torch.distributed" in sys.modules:  # under torchrun: every rank leaves the group together
        from openalign import distributed

        distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
