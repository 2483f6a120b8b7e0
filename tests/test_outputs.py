"""A stage's outputs: staged writes, and one owner per output directory (a second run refuses, a dead one's lock
is taken over)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from openalign import cli
from openalign.config import ConfigError
from openalign.outputs import lock_path, owned, staged

HOLD = """
import sys, time
from pathlib import Path
from openalign.outputs import owned
with owned(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_staged_writes_replace_only_on_success(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with staged(target) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with staged(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_second_owner_is_refused_with_the_first_ones_host_and_pid(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path / "shards"

    def second():
        with owned(out):
            pass

    with owned(out):
        assert lock_path(out) == out / ".openalign.lock"
        with pytest.raises(ConfigError, match=rf"is being written by another openalign run \(pid {os.getpid()} on "
                                              rf"{socket.gethostname()}, since "):
            with ThreadPoolExecutor(1) as pool:  # another thread (the same one may take it again)
                pool.submit(second).result()
    assert not out.exists()  # made for the lock alone, and left empty: removed
    with owned(tmp_path / "pairs.parquet"):
        assert (tmp_path / ".pairs.parquet.lock").is_file()
    assert not (tmp_path / ".pairs.parquet.lock").exists()


def test_a_stage_refuses_an_output_another_run_writes_and_takes_over_a_dead_runs(tmp_path, shapes, capsys):
    # Before: two concurrent `shard` runs into one --out: one crashed with a traceback, the other reported success
    # with 14 of its 16 tars holding the first run's images.
    [tar] = shapes["eval"].glob("*.tar")
    assert cli.main(["ingest", str(tar), "--out", str(tmp_path / "pairs.parquet"), "--quiet"]) == 0
    out = tmp_path / "shards"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        args = ["shard", str(tmp_path / "pairs.parquet"), "--out", str(out), "--quiet", "--workers", "1"]
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert f"is being written by another openalign run (pid {holder.pid} on {socket.gethostname()}" in err
        assert "Traceback" not in err and not list(out.glob("*.tar"))
        os.kill(holder.pid, signal.SIGKILL)  # the owner dies without releasing anything
        holder.wait(timeout=30)
        assert json.loads(lock_path(out).read_text())["pid"] == holder.pid  # its lock file is still there
        assert cli.main(args) == 0  # and is taken over
        import pyarrow.parquet as pq

        images = len(set(pq.read_table(tmp_path / "pairs.parquet").column("image_key").to_pylist()))
        assert json.loads((out / "manifest.json").read_text())["n_samples"] == images == 9
        assert not lock_path(out).exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_train_owns_its_run_directory(tmp_path, shapes, capsys):
    from conftest import held_elsewhere

    run = tmp_path / "run"
    with held_elsewhere(run):  # another run's (the thread that holds a lock may take it again)
        assert cli.main(["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(run), "--quiet",
                         "train.steps=1"]) == 2
    assert "is being written by another openalign run" in capsys.readouterr().err


def test_the_thread_that_owns_an_output_may_take_it_again_and_no_other_may(tmp_path):
    """The CLI's driver takes the lock and calls the stage's public function, which takes it too (so two API calls
    into one folder are refused); the inner block's end does not release the outer one's lock."""
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path / "out"

    def other():
        with owned(out):
            pass

    with owned(out):
        with owned(out):
            assert lock_path(out).is_file()
        assert lock_path(out).is_file()
        with ThreadPoolExecutor(1) as pool, pytest.raises(ConfigError, match="is being written by another openalign"):
            pool.submit(other).result()
    with owned(out):  # released at the outer block's end
        pass


def test_a_full_disk_without_a_file_name_names_the_outputs_disk(tmp_path, monkeypatch):
    import errno

    from openalign.outputs import disk_full

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "big" / "shards"
    (tmp_path / "big").mkdir()
    sentence = disk_full(OSError(errno.ENOSPC, "No space left on device"), out)
    assert sentence.startswith(f"the disk is full: writing into {out} failed with ")
    assert f" MiB free on {tmp_path / 'big'};" in sentence  # the nearest folder that exists
    named = disk_full(OSError(errno.ENOSPC, "No space left on device", str(out / "x.tmp")), tmp_path / "other")
    assert named.startswith(f"the disk is full: writing {out / 'x.tmp'} failed")


def test_a_lock_file_of_a_run_that_ended_is_no_obstacle(tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    lock_path(out).write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": time.time()}))  # no one holds it
    with owned(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()


def test_a_full_disk_under_torch_save_and_numpy_is_one_sentence_and_leaves_no_tmp(tmp_path, shapes, monkeypatch, capsys):
    # Before: `RuntimeError: [enforce fail at inline_container.cc:672]` from train and `OSError: 40000 requested and
    # 31712 written` from embed: tracebacks, and half-written .tmp files.
    import collections

    import numpy as np
    import torch

    from conftest import COLORS, SHAPES, leftovers, save_tiny_model, shape_images
    from openalign import outputs

    model = save_tiny_model(tmp_path / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    images = shape_images(tmp_path / "images")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda p: usage(10 * 2**30, 10 * 2**30, 4096))

    def torch_full(obj, f, *a, **k):
        open(f, "wb").write(b"half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1234 vs 1170")

    def numpy_full(f, array, *a, **k):
        f.write(b"half an array")
        raise OSError("40000 requested and 31712 written")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", torch_full)
        assert cli.main(["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "run"),
                         "--quiet", "train.steps=2", "train.checkpoint_every=1"]) == 2
    with monkeypatch.context() as patch:
        patch.setattr(np, "save", numpy_full)
        assert cli.main(["embed", str(model), "--images", str(images), "--out", str(tmp_path / "emb"), "--quiet"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert [e.split(" failed with")[0] for e in errors] == [
        f"openalign: error: the disk is full: writing {tmp_path / 'run' / 'checkpoint.tmp'}",
        f"openalign: error: the disk is full: writing {tmp_path / 'emb' / 'part-000000.npy.tmp'}"]
    assert "0 MiB free on" in errors[0] and leftovers(tmp_path) == []
