"""Real launches in subprocesses: SIGKILL then --resume, and two processes under torchrun."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import free_port, read_jsonl

CLI = [sys.executable, "-m", "openalign.cli"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]


def train_argv(shapes, out: Path, *overrides: str) -> list[str]:
    return ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(out), "--quiet",
            "train.log_every=1", *overrides]



def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r}


def env() -> dict:
    return os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def cpu_hog(seconds: float = 300):
    """A busy loop on every core while the block runs (each one also stops by itself after `seconds`)."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc. torchrun starts each worker in a session of its own, so
    killing torchrun's process group would leave its workers running (and writing checkpoints)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_after_first_checkpoint(cmd: list[str], run: Path, timeout: float = 120) -> int:
    """Start `cmd`; as soon as a checkpoint exists, SIGKILL it and every process it started (a crashed
    node: all at once); the checkpoint's step."""
    log = run.parent / f"{run.name}.stderr"  # a file, not a pipe: a full pipe would block the run
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, start_new_session=True, env=env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            while not (run / "checkpoint.pt").is_file():
                assert proc.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "no checkpoint appeared"
                time.sleep(0.02)
        finally:
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):  # (already gone if it failed)
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    return torch.load(run / "checkpoint.pt", weights_only=False)["step"]


# `busy`: the killed and the resumed run beside a busy loop on every core. One process runs on two intra-op threads,
# where load once made about one run in 15 drift: MKL's vector math, first called on both threads at once, ran a
# low-accuracy square root on one thread's half of a tensor (issue 83; host.settle_vector_math, docs/scale.md
# "Resumable"). `make stress` runs this case 20 times in a row. Under torchrun each process has one thread.
@pytest.mark.parametrize("launcher,sharding,busy", [
    pytest.param("single", "", True, id="single-beside-a-busy-loop"),
    pytest.param("torchrun", "shard_optimizer", False, id="torchrun-shard_optimizer"),
    pytest.param("torchrun", "fsdp", False, id="torchrun-fsdp")])
def test_sigkill_then_resume_continues_exactly(shapes, tmp_path, launcher, sharding, busy):
    # 24 steps: killed after the first checkpoint (4), 20 resumed steps compared, across the shapes' first epoch
    # boundary (step 13 starts the second)
    steps = ("train.steps=24", "train.checkpoint_every=4", "data.global_batch=8")
    if sharding:  # LAMB's state sharded over the two processes (ZeRO-1), or the whole model (FSDP)
        steps += (f"train.{sharding}=true",)

    def launcher_argv() -> list[str]:  # a fresh rendezvous port for every torchrun launch
        return CLI if launcher == "single" else TORCHRUN + ["--master_port", str(free_port()), "-m", "openalign.cli"]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(launcher_argv() + train_argv(shapes, straight, *steps), env=env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # beside a busy loop on every core: the killed and the resumed run; the straight run on an idle machine (load
    # should change the time each step takes, never a number it computes)
    with cpu_hog() if busy else contextlib.nullcontext():
        at = kill_after_first_checkpoint(launcher_argv() + train_argv(shapes, killed, *steps), killed)
        assert 4 <= at < 24  # killed mid-run, not after the end
        done = subprocess.run(launcher_argv() + ["train", "--out", str(killed), "--resume", "--quiet"], env=env(),
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = losses(straight), losses(killed)
    assert sorted(b) == list(range(1, 25))  # the log reads as one run: lines past the checkpoint were dropped
    differ = [step for step in a if a[step] != b.get(step)]
    assert b == a, f"killed at step {at}'s checkpoint; steps {differ} differ from the run that was never killed"
    if launcher == "torchrun":
        state = torch.load(killed / "checkpoint.pt", weights_only=False)
        assert len(state["ranks"]) == 2 and state["ranks"][0]["position"] != state["ranks"][1]["position"]
        assert json.loads((killed / "config.json").read_text())["data"]["global_batch"] == 8
    # the saved model is the checkpoint's (gathered whole from the shards under FSDP)
    from openalign.model import hub

    model, _, _ = hub.load_pretrained(killed / "model")
    state = torch.load(killed / "checkpoint.pt", weights_only=False)
    assert state["fsdp"] == (sharding == "fsdp")
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, state["model"][name], msg=name)


def test_the_sigmoid_loss_under_torchrun_equals_one_process_on_the_whole_batch(shapes, tmp_path, monkeypatch):
    # Before: `loss.kind=sigmoid` was refused under torchrun ("runs in one process"). Now each rank scores its
    # images against every rank's texts, passed around a ring (loss/sigmoid.py; the loss's own equality with one
    # process in fp64: tests/test_distributed.py). Here the whole command: 2 processes against one process that
    # reads both ranks' batches as one (BatchNorm per rank on both sides: gradient caching over the two halves).
    from openalign import cli
    from openalign.data import tars
    from openalign.data.loader import Position, epoch_plan, train_loader
    from openalign.train import trainer

    # no loss.label_smoothing: the softmax's default 0.1 is not given by the user, so the sigmoid's own 0.0 is used
    overrides = ("loss.kind=sigmoid", "loss.implementation=chunked", "train.steps=5",
                 "train.eval_every=0", "train.checkpoint_every=0", "model.text.dropout=0")  # dropout: per rank
    run = tmp_path / "run"
    done = subprocess.run(TORCHRUN + ["--master_port", str(free_port()), "-m", "openalign.cli",
                                      *train_argv(shapes, run, *overrides)], env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(torch.load(run / "checkpoint.pt", weights_only=False)["ranks"]) == 2
    assert done.stderr.count("loss.kind=sigmoid does not read loss.label_smoothing") == 1  # rank 0 says it once

    def both_ranks_as_one(spec, tokenizer, plan, position):
        counts = {s: tars.count_samples(s) for s in spec.shards}
        ranks = [dataclasses.replace(spec, rank=r, world_size=2, rank_batch=spec.rank_batch // 2) for r in (0, 1)]
        streams = [train_loader(r, tokenizer, epoch_plan(r, counts, Position(), 5)) for r in ranks]
        for halves in zip(*streams):
            width = max(h["input_ids"].shape[1] for h in halves)  # each half is padded to its own longest text
            batch = {k: torch.cat([torch.nn.functional.pad(h[k], (0, width - h[k].shape[1])) if k != "pixel_values"
                                   else h[k] for h in halves]) for k in ("pixel_values", "input_ids", "attention_mask")}
            yield halves[0] | batch | {"keys": halves[0]["keys"] + halves[1]["keys"]}

    monkeypatch.setattr(trainer, "train_loader", both_ranks_as_one)
    one = tmp_path / "one"
    assert cli.main(train_argv(shapes, one, *overrides, "train.micro_batch=4")) == 0
    together, alone = losses(run), losses(one)
    assert sorted(together) == [1, 2, 3, 4, 5] and sorted(alone) == [1, 2, 3, 4, 5]
    assert max(abs(together[s] - alone[s]) for s in together) <= 1e-5, (together, alone)
    assert len(set(round(v, 4) for v in together.values())) > 1  # it trained: the loss moved
