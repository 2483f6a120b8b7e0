"""The training loop: one straight function, `train(cfg)`, in one process or under torchrun.

Per step: lr from the schedule (a pure function of the step), forward both towers, the contrastive
loss over the global batch, LAMB step (train/step.py: direct or gradient-cached). Around it: progress
bar, JSONL metrics, periodic evaluation, atomic checkpoints and an exact `--resume` (model, optimizer,
every rank's RNG and data-stream position are checkpointed). Under torchrun each rank reads its own
share of the shards and encodes data.batch_size / world pairs; rank 0 logs, evaluates and writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from openalign import config as config_lib
from openalign import distributed
from openalign.config import Config, ConfigError
from openalign.data import shards as shard_lib
from openalign.data.corpora import resolve_data
from openalign.data.loader import Position, StreamSpec, epoch_plan, train_loader
from openalign.data.sharding import build_keep_index
from openalign.eval.tasks import HELD_OUT_TASKS, EvalOptions, run_tasks
from openalign.model import hub
from openalign.model.dual_encoder import DualEncoder
from openalign.tokenizer import check_tokenizer_dir, load_tokenizer, train_tokenizer
from openalign.train import fsdp, report
from openalign.train.optim import build_optimizer, full_state_dict, set_lr
from openalign.schedule import lr_at
from openalign.train.step import forward_backward

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


@dataclass
class TrainResult:
    out: Path
    step: int
    metrics: dict  # final evaluation (empty without eval data)
    model_dir: Path


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(f"cuda:{local_rank}") if name == "cuda" else torch.device(name)


def autocast(device: torch.device, precision: str):
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    # bf16 is emulated on CPU (~100x slower): auto means fp32 there.
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def prepare_tokenizer(cfg: Config, train_shards: list[str], out: Path):
    saved = out / "tokenizer"
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    if (saved / "tokenizer.json").is_file():
        return load_tokenizer(saved)
    counter: dict = {}
    texts = shard_lib.all_texts(train_shards, cfg.data.fraction, counter, keep=_keep(cfg))
    tokenizer = train_tokenizer(texts, cfg.model.text.vocab_size, cfg.model.text.max_length)
    tokenizer.save_pretrained(saved)
    if counter.get("skipped"):
        print(f"tokenizer: skipped {shard_lib.skip_summary(counter)} unusable training samples")
    return tokenizer


def save_checkpoint(path: Path, model, optimizer, step: int, position: Position, cfg: Config,
                    layout: distributed.Dist = distributed.Dist()) -> None:
    """Every rank's stream position and RNG state, written by rank 0 (all ranks must call)."""
    distributed.average_batchnorm_statistics(model, layout)
    ranks = distributed.all_objects({"position": dataclasses.asdict(position), "rng": torch.get_rng_state()}, layout)
    sharded = fsdp.is_sharded(model)
    model_state = fsdp.model_state(model) if sharded else model.state_dict()
    optimizer_state = fsdp.optimizer_state(model, optimizer) if sharded else full_state_dict(optimizer, layout.main)
    if layout.main:
        state = {"step": step, "model": model_state, "optimizer": optimizer_state, "fsdp": sharded,
                 "position": ranks[0]["position"], "rng": ranks[0]["rng"], "ranks": ranks,
                 "config": config_lib.to_dict(cfg)}
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact
    distributed.barrier(layout)


def truncate_log(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint we resume from, so the log reads as one run; a line cut
    short by a crash (not JSON) is dropped too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


def check_before_work(cfg: Config, resume: bool) -> None:
    """Everything a run needs that can be checked before any work (building a corpus, training a tokenizer)."""
    world = distributed.from_env().world
    config_lib.validate(cfg, world=world)
    unknown = [t for t in cfg.eval.tasks if t not in HELD_OUT_TASKS]
    if unknown:
        raise ConfigError(f"eval.tasks: {unknown[0]!r} is not a held-out task; choose from {', '.join(HELD_OUT_TASKS)} "
                          "(the others run on a saved model: `openalign eval`)")
    for option in ("shard_optimizer", "fsdp"):
        if getattr(cfg.train, option) and world == 1:
            raise ConfigError(f"train.{option}=true shards over torchrun processes; launch with torchrun")
    if cfg.train.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={cfg.train.device} but this machine has no CUDA device PyTorch can use; "
                          "use train.device=auto or cpu")
    if cfg.data.tokenizer:
        check_tokenizer_dir(cfg.data.tokenizer)
    if resume:
        load_checkpoint(Path(cfg.out) / CHECKPOINT, check_only=True)


def load_checkpoint(path: Path, map_location="cpu", check_only: bool = False) -> dict | None:
    """The checkpoint at `path`, or one sentence saying why it cannot be resumed from."""
    if not path.is_file():
        raise ConfigError(f"nothing to resume: no {CHECKPOINT} in {path.parent}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False, mmap=check_only)
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file: pickle, zip and torch errors alike
        earlier = path.with_suffix(".tmp")
        hint = (f"; {earlier} is a checkpoint that was being written: it may be usable (move it to {path.name})"
                if earlier.is_file() else "; no earlier checkpoint is kept: train again without --resume")
        raise ConfigError(f"{path} is corrupt and cannot be resumed from ({type(err).__name__}){hint}") from None
    if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= set(state):
        raise ConfigError(f"{path} is not an openalign checkpoint (no step, model and optimizer state)")
    return None if check_only else state


def stop_if_diverged(loss: float, step: int, out: Path, bar) -> None:
    """One sentence instead of training on NaN: `loss` is the mean over ranks, so every rank stops together."""
    if math.isfinite(loss):
        return
    bar.close()
    raise ConfigError(f"training diverged: the loss is {loss} at step {step}; the last checkpoint in {out} is from "
                      "before it (rerun with a lower optim.lr or optim.grad_clip, then --resume, or start over)")


def _keep(cfg: Config) -> str:
    """The keep index of data.keep ('' without keep-lists); built once into data.data_dir, then reused."""
    if not cfg.data.keep:
        return ""
    return build_keep_index(list(cfg.data.keep), Path(cfg.data.data_dir))


def _too_few_kept(cfg: Config, kept: int, total: int) -> str:
    batch = cfg.data.batch_size
    if cfg.data.keep:
        return (f"data.keep keeps {kept:,} of the {total:,} samples in data.train, fewer than one batch of {batch}; "
                "data.train must be the shards that were ingested into the pair table the keep-lists come from")
    return (f"data.fraction={cfg.data.fraction:g} keeps {kept:,} of {total:,} training samples, fewer than one batch "
            f"of {batch}; raise data.fraction or lower data.batch_size")


def train(cfg: Config, resume: bool = False, progress: bool = True) -> TrainResult:
    check_before_work(cfg, resume)
    out = Path(cfg.out)
    device = resolve_device(cfg.train.device, distributed.from_env().local_rank)
    layout = distributed.init(device.type)
    progress = progress and layout.main
    if layout.main:
        out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.train.threads or max(1, (os.cpu_count() or 1) // max(1, _local_world())))
    torch.manual_seed(cfg.seed)
    train_shards, eval_shards = _resolve_data(cfg, progress, layout)
    tokenizer = _prepare_tokenizer(cfg, train_shards, out, layout)
    # The trained vocabulary may be smaller than asked for (small corpora): size the embedding to it.
    # A model we start from keeps its own embedding table (it may be padded beyond its tokenizer).
    if not cfg.model.init_from:
        text = dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, text=text))
    if layout.main:
        config_lib.save(cfg, out / "config.json")

    model = DualEncoder(cfg.model, cfg.loss)
    if cfg.model.init_from:
        hub.init_towers(model, Path(cfg.model.init_from))
    if cfg.train.grad_checkpointing:
        model.align.text_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device).train()
    if cfg.train.fsdp:
        fsdp.shard(model)
    optimizer = build_optimizer(model, cfg.optim, shard=cfg.train.shard_optimizer, fsdp=cfg.train.fsdp)
    step, position = 0, Position()
    if resume:
        state = load_checkpoint(out / CHECKPOINT, map_location="cpu" if cfg.train.fsdp else device)
        if state.get("fsdp", False) != cfg.train.fsdp:
            raise ConfigError(f"{out} was trained with train.fsdp={str(state.get('fsdp', False)).lower()}; "
                              f"resume it with the same setting")
        if cfg.train.fsdp:
            fsdp.load_state(model, optimizer, state["model"], state["optimizer"])
        else:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        ranks = state.get("ranks") or [{"position": state["position"], "rng": state["rng"]}]
        if len(ranks) != layout.world:
            raise ConfigError(f"{out} was trained by {len(ranks)} processes; resume it with as many")
        step, position = state["step"], Position(**ranks[layout.rank]["position"])
        torch.set_rng_state(ranks[layout.rank]["rng"])
        if layout.main:
            truncate_log(out / METRICS, step)
    elif layout.active:  # the same initial weights on every rank (DDP checks), then per-rank dropout
        torch.manual_seed(cfg.seed * 1_000_003 + layout.rank)
    runner = model
    if layout.active and not cfg.train.fsdp:
        runner = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)

    spec = StreamSpec.for_config(cfg, train_shards, batch_size=cfg.data.batch_size // layout.world,
                                 rank=layout.rank, world_size=layout.world, keep=_keep(cfg))
    counts = {s: shard_lib.count_samples(s, cfg.data.fraction, keep=spec.keep) for s in train_shards}
    if cfg.data.keep or cfg.data.fraction < 1.0:  # training on a subset of the shards: at least one batch of it
        kept, total = sum(counts.values()), sum(shard_lib.count_samples(s) for s in train_shards)
        if kept < cfg.data.batch_size:
            raise ConfigError(_too_few_kept(cfg, kept, total))
        if progress:
            name = "data.keep" if cfg.data.keep else f"data.fraction={cfg.data.fraction:g}"
            print(f"{name}: training on {kept:,} of {total:,} samples")
    eval_options = EvalOptions(batch_size=cfg.eval.batch_size, max_length=cfg.model.text.max_length,
                               templates=cfg.eval.templates)

    def whole() -> DualEncoder | None:
        """The model with whole parameters on rank 0 (every rank must call); None on the others."""
        distributed.average_batchnorm_statistics(model, layout)
        if cfg.train.fsdp:
            copy = fsdp.whole_copy(model, cfg.loss)
            return copy.to(device) if copy is not None else None
        return model if layout.main else None

    def evaluate(core: DualEncoder | None) -> dict:
        metrics = run_tasks(core, tokenizer, eval_shards, list(cfg.eval.tasks), eval_options,
                            cfg.model.vision.resize_size, cfg.model.vision.image_size, progress=False) \
            if layout.main else {}
        distributed.barrier(layout)
        return metrics

    def towers_autocast():
        return autocast(device, cfg.train.precision)

    log = open(out / METRICS, "a") if layout.main else None
    bar = tqdm(total=cfg.train.steps, initial=step, desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    pairs, skipped, data_time, tick = 0, 0, 0.0, time.perf_counter()
    try:
        while step < cfg.train.steps:  # one loader for the whole run: its workers start once
            plan = epoch_plan(spec, counts, position, cfg.train.steps - step)
            fetch_start = time.perf_counter()
            for batch in train_loader(spec, tokenizer, plan, position):
                data_time += time.perf_counter() - fetch_start
                lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, cfg.train.steps)
                set_lr(optimizer, lr)
                negatives_rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # a function of the step
                optimizer.zero_grad(set_to_none=True)
                loss = forward_backward(runner, model, batch, cfg.loss, cfg.train.micro_batch, layout, device,
                                        towers_autocast, negatives_rng)
                if cfg.optim.grad_clip > 0 and cfg.train.fsdp:
                    fsdp.clip_grad_norm_(model, cfg.optim.grad_clip)
                elif cfg.optim.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                optimizer.step()
                step += 1
                position.advance(batch)
                pairs += len(batch["keys"]) * layout.world
                skipped += batch["skipped"]
                bar.update(1)
                if step % cfg.train.log_every == 0 or step == cfg.train.steps:
                    elapsed = time.perf_counter() - tick
                    row = {"step": step, "loss": distributed.mean_over_ranks(loss.item(), layout),
                           "temperature": model.temperature.item(), "lr": lr, "pairs_per_s": pairs / elapsed,
                           "data_frac": data_time / elapsed, "skipped": skipped, "epoch": position.epoch}
                    if log:
                        log.write(json.dumps(row) + "\n")
                        log.flush()
                    stop_if_diverged(row["loss"], step, out, bar)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", temp=f"{row['temperature']:.4f}", lr=f"{lr:.2e}",
                                    pairs_s=f"{row['pairs_per_s']:.0f}")
                    pairs, data_time, tick = 0, 0.0, time.perf_counter()
                if eval_shards and cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                    metrics = evaluate(whole())
                    if log:
                        log.write(json.dumps({"step": step, "eval": metrics}) + "\n")
                        log.flush()
                if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                    stop_if_diverged(distributed.mean_over_ranks(loss.item(), layout), step, out, bar)  # never save NaN
                    save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg, layout)
                if step >= cfg.train.steps:
                    break
                fetch_start = time.perf_counter()
    except KeyboardInterrupt:
        bar.close()
        if layout.active:  # the other ranks may be gone: no collective; resume from the last checkpoint
            raise SystemExit(f"interrupted at step {step}; continue from the last checkpoint with "
                             f"`torchrun ... openalign train --out {out} --resume`") from None
        save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg)
        log.close()
        raise SystemExit(f"interrupted at step {step}; checkpoint saved, continue with "
                         f"`openalign train --out {out} --resume`")
    bar.close()
    save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg, layout)
    core = whole()
    model_dir = hub.save_pretrained(core, tokenizer, out / "model", cfg) if layout.main else out / "model"
    metrics = evaluate(core) if eval_shards else {}
    if log:
        log.write(json.dumps({"step": step, "eval": metrics, "final": True}) + "\n")
        log.close()
        report.write(out, cfg, metrics, hub.describe(core))
    distributed.barrier(layout)
    return TrainResult(out=out, step=step, metrics=metrics, model_dir=model_dir)


def _local_world() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def _resolve_data(cfg: Config, progress: bool, layout: distributed.Dist):
    """Rank 0 builds what is missing (a built-in corpus, Karpathy shards); the others then read it."""
    return distributed.main_first(layout, lambda main: resolve_data(cfg.data, progress and main))


def _prepare_tokenizer(cfg: Config, train_shards: list[str], out: Path, layout: distributed.Dist):
    """Rank 0 trains and saves the tokenizer (training again could number tokens differently); the others load it."""
    return distributed.main_first(layout, lambda main: prepare_tokenizer(cfg, train_shards, out))
