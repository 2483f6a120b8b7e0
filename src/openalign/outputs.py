"""A stage's outputs on disk: each appears under its final name only when the stage has succeeded, the manifest
last, so a file that looks finished is finished.

    with staged(path) as tmp: ...   write `tmp`; renamed onto `path` only when the block ends without an error
                                    (an exception or Ctrl-C removes `tmp` and leaves what was at `path`)
    with staged_dir(path) as tmp:   the same for a folder written whole (a model directory)
    place(tmp, path)                the rename alone, for a writer kept open across blocks or a staging folder
    write_json(path, obj)           one JSON file, written whole or not at all (temp + rename)
    unfinish(manifest)              before new work into an existing output: its old manifest goes first, so an
                                    interrupted rerun never leaves the old manifest beside new, partial files
    disk_full(err)                  the one sentence for a full disk: the path, the free space, what to do
    owned(out)                      the output's lock while a command writes it
    files_fingerprint(*paths)       a hash of the files' names, sizes and times: has an input changed?

Readers refuse an output without its manifest (each stage's reader says so in one sentence).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Iterator

__all__ = ["disk_full", "files_fingerprint", "foreign_files", "is_disk_full", "leftovers", "owned", "place",
           "sources_key", "staged", "staged_dir", "unfinish", "write_json"]


def temp_name(path: Path) -> Path:
    """A temporary name beside `path` (same directory: the rename is atomic), unique to this process."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def leftovers(folder: Path, names: set[str]) -> list[Path]:
    """The temporary files (`temp_name`) a killed process left in `folder` for the outputs `names`: a rerun removes
    these, never another `.*.tmp` file."""
    return [p for p in Path(folder).glob(".*.tmp") if p.name[1:].rsplit(".", 2)[0] in names]


@contextmanager
def staged(path: Path, tmp: Path | None = None) -> Iterator[Path]:
    """Yields a temporary path beside `path` (`tmp` where its name is part of a contract, such as a checkpoint's
    `checkpoint.tmp`; else `temp_name`); on success it replaces `path`, on any error (KeyboardInterrupt included)
    it is removed and `path` is left as it was."""
    tmp = Path(tmp) if tmp is not None else temp_name(path)
    try:
        yield tmp
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


@contextmanager
def staged_dir(path: Path) -> Iterator[Path]:
    """Yields an empty temporary folder beside `path`; on success it takes `path`'s place (a folder already there is
    moved aside first and removed after), on any error it is removed and `path` is left as it was."""
    path = Path(path)
    tmp = temp_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        old = path.with_name(f".{path.name}.{os.getpid()}.old")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    else:
        os.replace(tmp, path)


def place(tmp: Path, path: Path) -> None:
    """The finished file `tmp` renamed onto `path` in one step (beside it, so on the same filesystem): for a file
    whose writer outlives one block (a Parquet writer kept open through a stage) or one finished in a staging
    folder. Everything else writes through `staged`."""
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    with staged(Path(path)) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def unfinish(manifest: Path) -> None:
    """Marks an output as not finished before a rerun starts writing into it: its manifest is removed."""
    Path(manifest).unlink(missing_ok=True)


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(err: OSError, out: Path | None = None) -> str:
    """One sentence for ENOSPC: which file, how much room is left where, and what to do. A write to an open file
    fails without a file name: then the disk is the one under `out`, the command's output (not the current
    directory's, which may be another disk with room to spare)."""
    path = Path(err.filename) if err.filename else None
    where = path.parent if path else Path(out) if out else Path.cwd()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    what = f"writing {path}" if path else f"writing into {out}" if out else "writing an output"
    return (f"the disk is full: {what} failed with {free / 2**20:,.0f} MiB free on {where}; free some space there "
            "or choose an --out on another disk, then run the command again (finished work is kept)")


def foreign_files(out: Path, marks: tuple[str, ...]) -> list[str]:
    """The names in the folder `out` that show it is not a stage's own: none when it is new or empty (the lock
    aside) or holds one of `marks` (what only that stage writes there); else its entries, sorted. A stage refuses
    such a folder, so it never writes among, or removes, a user's files."""
    out = Path(out)
    if not out.is_dir() or any((out / mark).exists() for mark in marks):
        return []
    return sorted(p.name for p in out.iterdir() if p.name != LOCK)


# ---------------------------------------------------------------------------------------------- one owner

LOCK = ".openalign.lock"


def lock_path(out: Path) -> Path:
    """Where the lock of an output lives: inside an output directory (a path without a suffix, or an existing
    directory), beside an output file (`.pairs.parquet.lock`). Every run computes the same path for one --out."""
    out = Path(out)
    if out.is_dir() or (not out.suffix and not out.is_file()):
        return out / LOCK
    return out.parent / f".{out.name}.lock"


_HELD: set[tuple[str, int]] = set()  # (lock file, thread) this process holds: the same thread may take it again


@contextmanager
def owned(out: Path) -> Iterator[None]:
    """This process owns `out` for the block: a second run on the same output refuses in one sentence, naming the
    owner's host and pid. The lock is the kernel's (flock on the lock file), so a run that died (kill -9, a lost
    node) holds nothing and the next run takes its output over. Workers, executors and other ranks write under
    the owner's lock; only the driver (rank 0) calls this. The thread that holds it may take it again (a command's
    driver, then the stage's public function); another thread or process is refused."""
    import fcntl
    import socket
    import time

    from openalign.config import ConfigError

    path = lock_path(out)
    held = (str(path.resolve()), threading.get_ident())
    if held in _HELD:  # the CLI's driver holds it and calls the stage's function, which takes it too
        yield
        return
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next(p for p in (path.parent, *path.parent.parents) if p.exists())
        raise ConfigError(f"cannot write {out}: {blocker} is a file, not a directory; choose another --out") from None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = json.loads(os.read(fd, 4096) or b"{}")
            except ValueError:
                owner = {}
            os.close(fd)
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["since"])) if "since" in owner else "?"
            raise ConfigError(f"{out} is being written by another openalign run (pid {owner.get('pid', '?')} on "
                              f"{owner.get('host', '?')}, since {since}); wait for it to finish, or choose another "
                              "--out") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its last owner removed while this process was opening it
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode())
    _HELD.add(held)
    try:
        yield
    finally:
        _HELD.discard(held)
        path.unlink(missing_ok=True)
        os.close(fd)
        for directory in made:  # directories made only for the lock, if the run left nothing in them
            try:
                directory.rmdir()
            except OSError:
                break


@contextmanager
def writing(tmp: Path) -> Iterator[Path]:
    """Around a write to the temporary file `tmp`: on any error the partial file is removed, and a failure that a
    full disk explains is raised as ENOSPC naming `tmp` (so the CLI says so in one sentence). torch.save reports a
    full disk as "RuntimeError: [enforce fail at inline_container.cc] ... unexpected pos", numpy as "OSError: N
    requested and M written": neither carries the errno, so the free space decides."""
    try:
        yield Path(tmp)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, (OSError, RuntimeError)) and not is_disk_full(err) and _nearly_full(Path(tmp).parent):
            raise OSError(errno.ENOSPC, f"No space left on device ({err})", str(tmp)) from err
        raise


def _nearly_full(directory: Path) -> bool:
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return False
    return usage.free < max(64 * 2**20, usage.total // 1000)  # under 64 MiB or 0.1% left


def files_fingerprint(*paths: str) -> str:
    """A hash of the names, sizes and modification times of every file at or under `paths`."""
    entries = []
    for root in (Path(p) for p in paths if p):
        files = [root] if root.is_file() else sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else []
        for f in files:
            stat = f.stat()
            entries.append((str(f.resolve()), stat.st_size, stat.st_mtime_ns))
    return hashlib.blake2b(json.dumps(entries).encode(), digest_size=16).hexdigest()


def sources_key(*parts: Any) -> str:
    """A fingerprint of a job's inputs: options, and each input file's path, size and modification time.
    Every string (in lists and dicts too) that names an existing file, relative or absolute, stands for that
    file as it is now (a relative `--classifier my.py` included: it was never fingerprinted before)."""
    def describe(item):
        if isinstance(item, (list, tuple)):
            return [describe(i) for i in item]
        if isinstance(item, dict):
            return {str(k): describe(v) for k, v in item.items()}
        if isinstance(item, (str, Path)) and str(item) and "\n" not in str(item):
            try:
                if Path(item).is_file():
                    stat = Path(item).stat()
                    return [str(Path(item).resolve()), stat.st_size, stat.st_mtime_ns]
            except (OSError, ValueError):  # not a path (too long, a NUL byte)
                pass
        return item

    text = json.dumps([describe(p) for p in parts], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
