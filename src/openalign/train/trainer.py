"""The training loop: one straight function, `train(data)`, in one process or under torchrun, on the data
`openalign.prepare.prepare(cfg)` made ready (the corpora, the keep index, the tokenizer).

Per step: lr from the schedule (a pure function of the step), forward both towers, the contrastive
loss over the global batch, LAMB step (train/step.py: direct or gradient-cached). Around it: progress
bar, JSONL metrics, periodic evaluation, atomic checkpoints and an exact `--resume` (model, optimizer,
every rank's RNG and data-stream position are checkpointed). Under torchrun each rank reads its own
share of the shards and encodes data.global_batch / world pairs; rank 0 logs, evaluates and writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from openalign import config as config_lib
from openalign import distributed, host
from openalign.config import Config, ConfigError
from openalign.data import tars
from openalign.data.loader import Position, StreamSpec, epoch_plan, train_loader
from openalign.eval.options import EvalOptions
from openalign.eval.tasks import configure, run_tasks
from openalign.model import hub
from openalign.outputs import owned, staged, writing
from openalign.model.dual_encoder import DualEncoder
from openalign.train import fsdp, report
from openalign.train.dashboards import Dashboards
from openalign.schedule import lr_at
from openalign.train.optim import build_optimizer, full_state_dict, set_lr
from openalign.train.prepared import Data
from openalign.train.step import forward_backward

__all__ = ["CHECKPOINT", "METRICS", "TrainResult", "train"]

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


@dataclass
class TrainResult:
    """What a run left: its directory, the saved model, its last log row and its held-out evaluation."""

    out: Path  # the run directory: config.json, metrics.jsonl, report.md, training.png, checkpoints
    step: int  # the steps trained
    metrics: dict  # the final held-out evaluation, as `openalign eval` names the metrics (empty without eval data)
    model_dir: Path  # the saved model (a Hugging Face AlignModel or VisionTextDualEncoderModel directory)
    last: dict = dataclasses.field(default_factory=dict)  # the last training log row: step, loss, temperature, lr, ...
    train_data: list[str] = dataclasses.field(default_factory=list)  # the shards it trained on
    eval_data: list[str] = dataclasses.field(default_factory=list)  # the held-out shards it was evaluated on


@dataclass
class Run:
    """A run once its config is resolved: where it writes, on which device and processes, with what data."""

    cfg: Config
    out: Path
    device: torch.device
    layout: distributed.Dist
    progress: bool
    train_shards: list[str]
    eval_shards: list[str]
    tokenizer: object
    source_evals: dict = dataclasses.field(default_factory=dict)  # several corpora: each one's held-out shards
    keep: str = ""  # the keep index the training samples are read through (data.keep, data.dedup_heldout)


def autocast(device: torch.device, precision: str):
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    # bf16 is emulated on CPU (~100x slower): auto means fp32 there.
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def start(data: Data, progress: bool) -> Run:
    """The device and process group, threads and seed, and the prepared config saved as RUN/config.json (the data,
    the tokenizer and the run directory's fresh start are `prepare`'s: openalign/prepare.py)."""
    cfg, out = data.cfg, Path(data.cfg.out)
    device = distributed.resolve_device(cfg.train.device, distributed.from_env().local_rank)
    layout = distributed.init(device.type)
    host.set_threads(cfg.train.threads or max(1, (os.cpu_count() or 1) // max(1, layout.local_world)))
    if device.type == "cpu":
        host.reuse_freed_memory()  # the step's activations reuse last step's pages: ~15% of a CPU step (host.py)
    torch.manual_seed(cfg.seed)
    if layout.main:
        out.mkdir(parents=True, exist_ok=True)
        config_lib.save(cfg, out / "config.json")
    return Run(cfg, out, device, layout, progress and layout.main, data.train_shards, data.eval_shards,
               data.tokenizer, data.source_evals, data.keep)


def build_model(run: Run) -> tuple[DualEncoder, torch.optim.Optimizer]:
    cfg = run.cfg
    model = DualEncoder(cfg.model, cfg.loss)
    if cfg.model.init_from:
        hub.init_towers(model, Path(cfg.model.init_from))
    if cfg.train.grad_checkpointing:
        model.text_tower.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.to(run.device).train()
    if cfg.train.fsdp:
        fsdp.wrap(model)
    return model, build_optimizer(model, cfg.optim, shard_optimizer=cfg.train.shard_optimizer, fsdp=cfg.train.fsdp,
                                  temperature_lr_scale=cfg.loss.temperature.lr_scale)


def data_parallel(run: Run, model: DualEncoder) -> torch.nn.Module:
    """What the step runs: DDP around the model under torchrun (FSDP shards the model itself)."""
    if not run.layout.active or run.cfg.train.fsdp:
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[run.device.index] if run.device.type == "cuda" else None, broadcast_buffers=False)


def save_checkpoint(path: Path, model, optimizer, step: int, position: Position, cfg: Config,
                    layout: distributed.Dist = distributed.Dist()) -> None:
    """Every rank's stream position and RNG state, written by rank 0 (all ranks must call)."""
    distributed.average_batchnorm_statistics(model, layout)
    ranks = distributed.all_objects({"position": dataclasses.asdict(position), "rng": torch.get_rng_state()}, layout)
    sharded = fsdp.is_wrapped(model)
    model_state = fsdp.model_state(model) if sharded else model.state_dict()
    optimizer_state = fsdp.optimizer_state(model, optimizer) if sharded else full_state_dict(optimizer, layout.main)
    if layout.main:
        state = {"step": step, "model": model_state, "optimizer": optimizer_state, "fsdp": sharded,
                 "position": ranks[0]["position"], "rng": ranks[0]["rng"], "ranks": ranks,
                 "config": config_lib.to_dict(cfg)}
        # atomic: a crash leaves the previous checkpoint intact; a full disk: one sentence, and no half-written .tmp
        with staged(path, tmp=path.with_suffix(".tmp")) as tmp, writing(tmp):
            torch.save(state, tmp)
    distributed.barrier(layout)


def load_checkpoint(run: Run, model: DualEncoder, optimizer) -> tuple[int, Position]:
    """The inverse of `save_checkpoint`: model and optimizer state, this rank's stream position and RNG;
    the log is cut back to the checkpoint's step. Returns (step, position)."""
    cfg, layout = run.cfg, run.layout
    state = read_checkpoint(run.out / CHECKPOINT, map_location="cpu" if cfg.train.fsdp else run.device)
    if state.get("fsdp", False) != cfg.train.fsdp:
        raise ConfigError(f"{run.out} was trained with train.fsdp={str(state.get('fsdp', False)).lower()}; "
                          f"resume it with the same setting")
    if cfg.train.fsdp:
        fsdp.load_state(model, optimizer, state["model"], state["optimizer"])
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    ranks = state.get("ranks") or [{"position": state["position"], "rng": state["rng"]}]
    if len(ranks) != layout.world:
        raise ConfigError(f"{run.out} was trained by {len(ranks)} processes; resume it with as many")
    torch.set_rng_state(ranks[layout.rank]["rng"])
    if layout.main:
        truncate_log(run.out / METRICS, state["step"])
    return state["step"], Position(**ranks[layout.rank]["position"])


def read_checkpoint(path: Path, map_location="cpu", check_only: bool = False) -> dict | None:
    """The checkpoint at `path`, or one sentence saying why it cannot be resumed from."""
    if not path.is_file():
        raise ConfigError(f"nothing to resume: no {CHECKPOINT} in {path.parent}")
    try:  # tensors and plain Python values only: a pickled object in a checkpoint would run code when loaded
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=check_only)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" not in str(err):  # a damaged pickle stream, not a refused object
            raise ConfigError(f"{path} is corrupt and cannot be resumed from "
                              f"(UnpicklingError){_earlier(path)}") from None
        raise ConfigError(f"{path} holds Python objects besides tensors and plain values, which loading would run as "
                          "code; openalign does not load it (an openalign checkpoint never holds them): train again "
                          "without --resume, into a new --out") from None
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file: pickle, zip and torch errors alike
        raise ConfigError(f"{path} is corrupt and cannot be resumed from ({type(err).__name__}){_earlier(path)}"
                          ) from None
    if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= set(state):
        raise ConfigError(f"{path} is not an openalign checkpoint (no step, model and optimizer state)")
    return None if check_only else state


def _earlier(path: Path) -> str:
    earlier = path.with_suffix(".tmp")
    return (f"; {earlier} is a checkpoint that was being written: it may be usable (move it to {path.name})"
            if earlier.is_file() else "; no earlier checkpoint is kept: train again without --resume")


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


RUN_FILES = (CHECKPOINT, "checkpoint.tmp", METRICS, "tokenizer", "model", "report.md", "training.png", "config.json",
             "tensorboard", "wandb", "wandb_id")


def training_stream(run: Run) -> tuple[StreamSpec, dict[str, int]]:
    """This rank's share of the stream, and the samples per shard (of the data.fraction / data.keep subset,
    which must hold at least one batch)."""
    cfg, layout = run.cfg, run.layout
    spec = StreamSpec.for_config(cfg, run.train_shards, rank=layout.rank, world_size=layout.world, keep=run.keep)
    counts = {s: tars.count_samples(s, cfg.data.fraction, keep=spec.keep) for s in run.train_shards}
    if run.keep or cfg.data.fraction < 1.0:
        kept, total = sum(counts.values()), sum(tars.count_samples(s) for s in run.train_shards)
        name = ", ".join(n for n, on in (("data.keep", cfg.data.keep), ("data.dedup_heldout", cfg.data.dedup_heldout),
                                         (f"data.fraction={cfg.data.fraction:g}", cfg.data.fraction < 1.0)) if on)
        if kept < cfg.data.global_batch:
            raise ConfigError(f"data.keep keeps {kept:,} of the {total:,} samples in data.train, fewer than one batch "
                              f"of {cfg.data.global_batch}; data.train must be the shards that were ingested into the "
                              "pair table the keep-lists come from" if cfg.data.keep else
                              f"{name} keeps {kept:,} of {total:,} training samples, fewer than one batch of "
                              f"{cfg.data.global_batch}; " + ("raise data.fraction or " if cfg.data.fraction < 1.0
                                                                     else "") + "lower data.global_batch")
        if run.progress:
            print(f"{name}: training on {kept:,} of {total:,} samples")
    return spec, counts


def optimizer_step(run: Run, runner: torch.nn.Module, model: DualEncoder, optimizer, batch: dict, step: int
                   ) -> tuple[torch.Tensor, float]:
    """One step at `step`: the scheduled lr, forward and backward, clipping, the update. Returns (loss, lr)."""
    cfg = run.cfg
    lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, cfg.train.steps)
    set_lr(optimizer, lr)
    negatives_rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # a function of the step
    optimizer.zero_grad(set_to_none=True)
    try:
        loss = forward_backward(runner, model, batch, cfg.loss, cfg.train.micro_batch, run.layout, run.device,
                                lambda: autocast(run.device, cfg.train.precision), negatives_rng)
    except RuntimeError as err:  # an operator with no deterministic kernel on this device: PyTorch's message names it
        if not (cfg.train.deterministic and "deterministic" in str(err)):
            raise
        raise ConfigError(f"train.deterministic=true, but {str(err).splitlines()[0].rstrip('.')} on "
                          f"{run.device.type}; train without train.deterministic") from None
    if cfg.optim.grad_clip > 0 and cfg.train.fsdp:
        fsdp.clip_grad_norm_(model, cfg.optim.grad_clip)
    elif cfg.optim.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    optimizer.step()
    return loss, lr


def whole_model(run: Run, model: DualEncoder) -> DualEncoder | None:
    """The model with whole parameters on rank 0 (every rank must call); None on the others."""
    distributed.average_batchnorm_statistics(model, run.layout)
    if run.cfg.train.fsdp:
        copy = fsdp.whole_copy(model, run.cfg.loss)
        return copy.to(run.device) if copy is not None else None
    return model if run.layout.main else None


def evaluate(run: Run, core: DualEncoder | None) -> dict:
    """The held-out tasks of `core` (whole_model's: the model on rank 0, None elsewhere); every rank calls."""
    cfg = run.cfg
    common = EvalOptions(encode_batch=cfg.eval.encode_batch, max_length=cfg.model.text.max_length,
                         resize=cfg.model.vision.resize_size, crop=cfg.model.vision.image_size)
    options = configure(list(cfg.eval.tasks), templates=cfg.eval.templates)
    metrics = run_tasks(core, run.tokenizer, run.eval_shards, list(cfg.eval.tasks), common, options,
                        progress=False)[0] if run.layout.main else {}
    for name, shards in run.source_evals.items() if run.layout.main else ():  # several corpora: each one's own
        own = run_tasks(core, run.tokenizer, shards, list(cfg.eval.tasks), common, options, progress=False)[0]
        metrics |= {f"{name}/{key}": value for key, value in own.items() if isinstance(value, (int, float))}
    distributed.barrier(run.layout)
    return metrics


class Log:
    """metrics.jsonl and the dashboards (rank 0), the progress bar, and the throughput since the last row; stops on
    NaN."""

    def __init__(self, run: Run, step: int):
        self.run, self.last = run, {}
        self.file = open(run.out / METRICS, "a") if run.layout.main else None
        self.dashboards = Dashboards(run.cfg, run.out, step) if run.layout.main and run.cfg.train.report_to else None
        self.bar = tqdm(total=run.cfg.train.steps, initial=step, desc="train", unit="step", disable=not run.progress,
                        dynamic_ncols=True)
        self.pairs, self.skipped, self.data_time, self.tick = 0, 0, 0.0, time.perf_counter()

    def timed(self, batches):
        """The batches, counting the time spent waiting for them."""
        batches = iter(batches)
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            self.data_time += time.perf_counter() - start
            if batch is None:
                return
            yield batch

    def step(self, step: int, loss: torch.Tensor, lr: float, model: DualEncoder, batch: dict, position: Position):
        cfg, layout = self.run.cfg, self.run.layout
        self.pairs += len(batch["keys"]) * layout.world
        self.skipped += batch["skipped"]
        self.bar.update(1)
        if step % cfg.train.log_every and step != cfg.train.steps:
            return
        elapsed = time.perf_counter() - self.tick
        row = {"step": step, "loss": distributed.mean_over_ranks(loss.item(), layout),
               "temperature": model.temperature.item(), "lr": lr, "pairs_per_s": self.pairs / elapsed,
               "data_frac": self.data_time / elapsed, "skipped": self.skipped, "epoch": position.epoch}
        self.write(row)
        self.stop_if_diverged(row["loss"], step)
        self.bar.set_postfix(loss=f"{row['loss']:.3f}", temp=f"{row['temperature']:.4f}", lr=f"{lr:.2e}",
                             pairs_s=f"{row['pairs_per_s']:.0f}")
        self.last = row
        self.pairs, self.data_time, self.tick = 0, 0.0, time.perf_counter()

    def write(self, row: dict) -> None:
        if self.file:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        if self.dashboards:
            self.dashboards.log(row)
        if row.get("eval") and self.run.progress:  # an evaluation, also as one short line
            self.bar.write(report.eval_line(row["step"], row["eval"]))

    def figure(self, name: str, path: Path, step: int) -> None:
        """A plot drawn for the run, on the dashboards too."""
        if self.dashboards:
            self.dashboards.image(name, path, step)

    def stop_if_diverged(self, loss: float, step: int) -> None:
        """One sentence instead of training on NaN: `loss` is the mean over ranks, so every rank stops together."""
        if math.isfinite(loss):
            return
        self.bar.close()
        raise ConfigError(f"training diverged: the loss is {loss} at step {step}; the last checkpoint in "
                          f"{self.run.out} is from before it (rerun with a lower optim.lr or optim.grad_clip, then "
                          "--resume, or start over)")

    def close(self) -> None:
        self.bar.close()
        if self.file:
            self.file.close()
        if self.dashboards:
            self.dashboards.close()


def train(data: Data, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train on `data` (openalign/prepare.py made it from the config) into its cfg.out (rank 0 owns it for the run: a
    second run there refuses in one sentence)."""
    with run_lock(data.cfg.out), deterministic_kernels(data.cfg.train.deterministic):
        return _train(data, resume, progress)


def run_lock(out: str | Path):
    """The run directory's lock (outputs.owned), held by rank 0 (prepare and the command take it too: the thread
    that holds it may take it again)."""
    return owned(Path(out)) if distributed.from_env().rank == 0 else nullcontext()


@contextmanager
def deterministic_kernels(on: bool):
    """`train.deterministic`: only kernels that give the same bits every run, for the run's length (the setting is
    the process's: restored after, so a notebook's or a test's later work keeps its own). The CPU step is
    deterministic either way; on GPUs this is what makes a resumed run continue with an uninterrupted run's numbers
    (docs/scale.md "Resumable")."""
    if not on:
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts, before any CUDA matmul
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _train(data: Data, resume: bool, progress: bool) -> TrainResult:
    run = start(data, progress)
    cfg, out, layout = run.cfg, run.out, run.layout
    model, optimizer = build_model(run)
    step, position = load_checkpoint(run, model, optimizer) if resume else (0, Position())
    if not resume and layout.active:  # the same initial weights on every rank (DDP checks), then per-rank dropout
        torch.manual_seed(cfg.seed * 1_000_003 + layout.rank)
    runner = data_parallel(run, model)
    spec, counts = training_stream(run)
    log = Log(run, step)
    try:
        while step < cfg.train.steps:  # one loader for the whole run: its workers start once
            plan = epoch_plan(spec, counts, position, cfg.train.steps - step)
            for batch in log.timed(train_loader(spec, run.tokenizer, plan, position)):
                loss, lr = optimizer_step(run, runner, model, optimizer, batch, step)
                step += 1
                position.advance(batch)
                log.step(step, loss, lr, model, batch, position)
                if run.eval_shards and cfg.train.eval_every and step % cfg.train.eval_every == 0 \
                        and step < cfg.train.steps:
                    log.write({"step": step, "eval": evaluate(run, whole_model(run, model))})
                if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                    log.stop_if_diverged(distributed.mean_over_ranks(loss.item(), layout), step)  # never save NaN
                    save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg, layout)
                if step >= cfg.train.steps:
                    break
    except KeyboardInterrupt:
        log.bar.close()
        if layout.active:  # the other ranks may be gone: no collective; resume from the last checkpoint
            raise SystemExit(f"interrupted at step {step}; continue from the last checkpoint with "
                             f"`torchrun ... openalign train --out {out} --resume`") from None
        save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg)
        log.close()
        raise SystemExit(f"interrupted at step {step}; checkpoint saved, continue with "
                         f"`openalign train --out {out} --resume`") from None
    log.bar.close()
    save_checkpoint(out / CHECKPOINT, model, optimizer, step, position, cfg, layout)
    return finish(run, model, step, log)


def finish(run: Run, model: DualEncoder, step: int, log: Log) -> TrainResult:
    """Save the model (a Hugging Face directory), evaluate it, write the report."""
    core = whole_model(run, model)
    model_dir = run.out / "model"
    if run.layout.main:
        hub.save_pretrained(core, run.tokenizer, model_dir, run.cfg)
    metrics = evaluate(run, core) if run.eval_shards else {}  # the same whole model: gathered once
    log.write({"step": step, "eval": metrics, "final": True})
    if run.layout.main:
        report.write(run.out, run.cfg, metrics, hub.describe(core))
        log.figure("training", run.out / "training.png", step)
    log.close()
    distributed.barrier(run.layout)
    return TrainResult(out=run.out, step=step, metrics=metrics, model_dir=model_dir, last=log.last or last_row(run.out),
                       train_data=list(run.train_shards), eval_data=list(run.eval_shards))


def last_row(out: Path) -> dict:
    """The last training row of RUN/metrics.jsonl ({} without one): a run resumed after its last step logs none."""
    if not (out / METRICS).is_file():
        return {}
    rows = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    return next((r for r in reversed(rows) if "loss" in r), {})
