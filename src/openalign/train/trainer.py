"""The training loop: one straight function, `train(cfg)`.

Per step: lr from the schedule (a pure function of the step), forward both towers, the contrastive
loss, LAMB step. Around it: progress bar, JSONL metrics, periodic evaluation, atomic checkpoints and
an exact `--resume` (model, optimizer, RNG and the data stream's position are all checkpointed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from openalign import config as config_lib
from openalign import loss as loss_lib
from openalign.config import Config, ConfigError, LossConfig
from openalign.data import shards as shard_lib
from openalign.data.corpora import resolve_data
from openalign.data.loader import Position, StreamSpec, batches_per_role, train_loader
from openalign.eval.tasks import EvalOptions, run_tasks
from openalign.model import hub
from openalign.model.dual_encoder import DualEncoder
from openalign.tokenizer import load_tokenizer, train_tokenizer
from openalign.train import report
from openalign.train.optim import build_optimizer, set_lr
from openalign.train.schedule import lr_at

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


@dataclass
class TrainResult:
    out: Path
    step: int
    metrics: dict  # final evaluation (empty without eval data)
    model_dir: Path


def compute_loss(model: DualEncoder, img: torch.Tensor, txt: torch.Tensor, cfg: LossConfig,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    temperature = loss_lib.clamp_temperature(model.temperature, cfg.temperature_min)
    if cfg.kind == "sigmoid":
        return loss_lib.sigmoid_loss(img, txt, temperature, model.logit_bias)
    negatives = loss_lib.negatives_mask(len(img), cfg.negatives_fraction, generator, img.device)
    return loss_lib.softmax_loss(img, txt, temperature, cfg.label_smoothing, negatives)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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
    tokenizer = train_tokenizer(shard_lib.all_texts(train_shards), cfg.model.text.vocab_size, cfg.model.text.max_length)
    tokenizer.save_pretrained(saved)
    return tokenizer


def save_checkpoint(path: Path, model, optimizer, step: int, position: Position, cfg: Config) -> None:
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "position": dataclasses.asdict(position), "rng": torch.get_rng_state(), "config": config_lib.to_dict(cfg)}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a crash leaves the previous checkpoint intact


def truncate_log(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint we resume from, so the log reads as one run."""
    if path.is_file():
        lines = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln).get("step", 0) <= step]
        path.write_text("".join(ln + "\n" for ln in lines))


def train(cfg: Config, resume: bool = False, progress: bool = True) -> TrainResult:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.train.threads or os.cpu_count() or 1)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.train.device)
    train_shards, eval_shards = resolve_data(cfg.data, progress)
    tokenizer = prepare_tokenizer(cfg, train_shards, out)
    # The trained vocabulary may be smaller than asked for (small corpora): size the embedding to it.
    # A model we start from keeps its own embedding table (it may be padded beyond its tokenizer).
    if not cfg.model.init_from:
        text = dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, text=text))
    config_lib.save(cfg, out / "config.json")

    model = DualEncoder(cfg.model, cfg.loss)
    if cfg.model.init_from:
        hub.init_towers(model, Path(cfg.model.init_from))
    model.to(device).train()
    optimizer = build_optimizer(model, cfg.optim)
    step, position = 0, Position()
    if resume:
        if not (out / CHECKPOINT).is_file():
            raise ConfigError(f"nothing to resume: no {CHECKPOINT} in {out}")
        state = torch.load(out / CHECKPOINT, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, position = state["step"], Position(**state["position"])
        torch.set_rng_state(state["rng"])
        truncate_log(out / METRICS, step)

    spec = StreamSpec.for_config(cfg, train_shards)
    counts = {s: shard_lib.count_samples(s) for s in train_shards}
    eval_options = EvalOptions(batch_size=cfg.eval.batch_size, max_length=cfg.model.text.max_length,
                               templates=cfg.eval.templates)

    def evaluate() -> dict:
        return run_tasks(model, tokenizer, eval_shards, ["retrieval", "zeroshot"], eval_options,
                         cfg.model.vision.resize_size, cfg.model.vision.image_size, progress=False)

    log = open(out / METRICS, "a")
    bar = tqdm(total=cfg.train.steps, initial=step, desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    pairs, skipped, data_time, tick = 0, 0, 0.0, time.perf_counter()
    try:
        while step < cfg.train.steps:
            n_batches = batches_per_role(spec, position.epoch, counts)
            fetch_start = time.perf_counter()
            for batch in train_loader(spec, tokenizer, position.epoch, n_batches, position):
                data_time += time.perf_counter() - fetch_start
                lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, cfg.train.steps)
                set_lr(optimizer, lr)
                with autocast(device, cfg.train.precision):
                    img, txt = model(batch["pixel_values"].to(device), batch["input_ids"].to(device),
                                     batch["attention_mask"].to(device))
                negatives_rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # a function of the step
                loss = compute_loss(model, img.embeds, txt.embeds, cfg.loss, negatives_rng)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.optim.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                optimizer.step()
                step += 1
                position.advance(batch)
                pairs += len(batch["keys"])
                skipped += batch["skipped"]
                bar.update(1)
                if step % cfg.train.log_every == 0 or step == cfg.train.steps:
                    elapsed = time.perf_counter() - tick
                    row = {"step": step, "loss": loss.item(), "temperature": model.temperature.item(), "lr": lr,
                           "pairs_per_s": pairs / elapsed, "data_frac": data_time / elapsed, "skipped": skipped,
                           "epoch": position.epoch}
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    bar.set_postfix(loss=f"{row['loss']:.3f}", temp=f"{row['temperature']:.4f}", lr=f"{lr:.2e}",
                                    pairs_s=f"{row['pairs_per_s']:.0f}")
                    pairs, data_time, tick = 0, 0.0, time.perf_counter()
                if eval_shards and cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                    log.write(json.dumps({"step": step, "eval": evaluate()}) + "\n")
                    log.flush()
                if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                    save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg)
                if step >= cfg.train.steps:
                    break
                fetch_start = time.perf_counter()
            else:
                position.next_epoch()
    except KeyboardInterrupt:
        bar.close()
        save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg)
        log.close()
        raise SystemExit(f"interrupted at step {step}; checkpoint saved, continue with "
                         f"`openalign train --out {out} --resume`")
    bar.close()
    save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg)
    model_dir = hub.save_pretrained(model, tokenizer, out / "model", cfg)
    metrics = evaluate() if eval_shards else {}
    log.write(json.dumps({"step": step, "eval": metrics, "final": True}) + "\n")
    log.close()
    report.write(out, cfg, metrics, hub.describe(model))
    return TrainResult(out=out, step=step, metrics=metrics, model_dir=model_dir)
