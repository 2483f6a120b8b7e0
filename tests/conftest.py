import contextlib
import io
import json
import random
import socket
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from openalign.corpora import emoji
from openalign.data.tars import ShardWriter

# tests that render the built-in emoji corpus (system packages `make test` installs)
needs_emoji_data = pytest.mark.skipif(
    not (Path(emoji.DEFAULT_FONT).is_file() and Path(emoji.DEFAULT_CLDR).is_dir()),
    reason="fonts-noto-color-emoji / unicode-cldr-core not installed (make test installs them)")

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (240, 210, 20)}
SHAPES = ("circle", "square", "triangle")


def shape_image(color: str, shape: str, size: int = 40) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    box = (6, 6, size - 6, size - 6)
    if shape == "circle":
        draw.ellipse(box, fill=COLORS[color])
    elif shape == "square":
        draw.rectangle(box, fill=COLORS[color])
    else:
        draw.polygon([(size // 2, 6), (size - 6, size - 6), (6, size - 6)], fill=COLORS[color])
    return image


def jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_shapes(out: Path, n: int, per_shard: int, seed: int = 0, corrupt: int = 0) -> dict:
    """Coloured-shape pairs with two captions each; `corrupt` samples get undecodable image bytes."""
    rng = random.Random(seed)
    writer = ShardWriter(out, "shapes", per_shard)
    for i in range(n):
        color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
        texts = [f"a {color} {shape}", f"{shape}, {color}"]
        data = b"not an image" if i < corrupt else jpeg(shape_image(color, shape))
        writer.write(f"s{i:05d}", data, "jpg", texts[0], {"texts": texts, "name": f"{color} {shape}"})
    return writer.close()


def shape_shards(root: Path) -> dict[str, Path]:
    """Training shards (96 pairs, two undecodable) and held-out shards (24) of coloured shapes under `root`."""
    write_shapes(root / "train", 96, 24, seed=0, corrupt=2)
    write_shapes(root / "eval", 24, 24, seed=1)
    return {"train": root / "train", "eval": root / "eval"}


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> dict[str, Path]:
    return shape_shards(tmp_path_factory.mktemp("shapes"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


_TINY_MODELS: dict[tuple, tuple[Path, object]] = {}  # (texts, embed_dim, seed) -> (the built directory, RNG after)


def save_tiny_model(out: Path, texts: list[str], embed_dim: int | None = None, seed: int = 0) -> Path:
    """A tiny untrained model (weights drawn with `seed`) with its tokenizer (and the tiny preset's embedding width,
    or `embed_dim`), saved as a model directory. Its BatchNorm statistics are measured on coloured shapes (as
    training would leave them): at their initial values an untrained image tower embeds every image alike.

    Built once per test run for each (texts, embed_dim, seed) and copied to `out` after that, leaving torch's RNG
    as building it would (a test may draw from it next)."""
    import atexit
    import shutil

    import torch

    key = (tuple(texts), embed_dim, seed)
    if key not in _TINY_MODELS:
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="tiny-model-"))
        atexit.register(shutil.rmtree, root, True)
        built = _build_tiny_model(root / "model", texts, embed_dim, seed)
        _TINY_MODELS[key] = (built, torch.get_rng_state())
    built, rng = _TINY_MODELS[key]
    shutil.copytree(built, out, dirs_exist_ok=True)
    torch.set_rng_state(rng)
    return out


def _build_tiny_model(out: Path, texts: list[str], embed_dim: int | None, seed: int) -> Path:
    import dataclasses

    import torch

    from openalign import presets
    from openalign.data import transforms
    from openalign.model.dual_encoder import DualEncoder
    from openalign.model.hub import save_pretrained
    from openalign.tokenizer import train_tokenizer

    torch.manual_seed(seed)
    tokenizer = train_tokenizer(texts * 4, 200, 16)
    cfg = presets.get("tiny")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, embed_dim=embed_dim or cfg.model.embed_dim,
        text=dataclasses.replace(cfg.model.text, vocab_size=len(tokenizer))))
    model = DualEncoder(cfg.model).train()
    batch = torch.stack([transforms.eval_transform(shape_image(c, s), 36, 32) for c in COLORS for s in SHAPES])
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None  # a plain average over the calibration batches
        for _ in range(3):
            model.encode_image(batch)
    save_pretrained(model.eval(), tokenizer, out, cfg)
    return out


def http_get(url: str, timeout: float = 60) -> tuple[int, bytes]:
    """(status, body) of a GET; an HTTP error's status too."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def serve_process(args: list[str]):
    """`openalign serve ARGS` in a subprocess on a free loopback port, once /health answers: (process, its URL).
    A crash in a C library fails the test instead of killing pytest; the caller stops it."""
    import subprocess
    import sys
    import time

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "openalign", "serve", *map(str, args), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, f"the server exited: {process.stdout.read()[-2000:]}"
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if http_get(url + "/health", timeout=10)[0] == 200:
                return process, url
        except OSError:
            time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_gloo(worker, args_for, nprocs: int, ports=None, tries: int = 3) -> None:
    """`worker` in `nprocs` forked processes with `args_for(port)`, on a port that was free a moment ago. Another
    process can take it before rank 0's rendezvous binds it (EADDRINUSE, seen once under load); then the launch runs
    again on another port, up to `tries` times. `ports`: the ports to try (default: a fresh free one each time)."""
    import torch.multiprocessing as mp

    ports = ports if ports is not None else iter(free_port, None)
    for attempt in range(tries):
        try:
            mp.start_processes(worker, args=args_for(next(ports)), nprocs=nprocs, start_method="fork")
            return
        except mp.ProcessRaisedException as err:
            if "EADDRINUSE" not in str(err) or attempt == tries - 1:
                raise


def shape_images(images: Path) -> Path:
    """The 12 colour x shape images in `images`, each with its caption beside it (`a red circle`)."""
    images.mkdir(parents=True, exist_ok=True)
    for colour in COLORS:
        for shape in SHAPES:
            shape_image(colour, shape).save(images / f"{colour}_{shape}.png")
            (images / f"{colour}_{shape}.txt").write_text(f"a {colour} {shape}")
    return images


def shape_index(root: Path) -> Path:
    """A tiny model, the 12 colour x shape images with captions, and an index of them: the index directory."""
    from openalign import cli

    model = save_tiny_model(root / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    images = shape_images(root / "images")
    assert cli.main(["embed", str(model), "--images", str(images), "--out", str(root / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(root / "emb"), "--out", str(root / "idx")]) == 0
    return root / "idx"


class WritesAFile:
    """A pickled object whose unpickling creates `marker`: what an attacker puts in a file we load."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def save_code_running_pickle(path: Path, marker: Path, **tensors) -> None:
    """A torch file with the attacker's object beside `tensors`; loading it without weights_only creates `marker`."""
    import torch

    torch.save({**tensors, "payload": WritesAFile(marker)}, path)


def mark_ingested(table: Path) -> Path:
    """The manifest `openalign ingest` writes last beside a pair table, for tables a test builds by hand."""
    import pyarrow.parquet as pq

    manifest = {"stage": "ingest", "pairs": pq.read_metadata(table).num_rows}
    Path(table).with_suffix(".manifest.json").write_text(json.dumps(manifest))
    return Path(table)


def interrupt_after(monkeypatch, owner, name: str, calls: int) -> None:
    """Ctrl-C in the middle of a stage: `owner.name` works `calls` times, then raises KeyboardInterrupt."""
    real = getattr(owner, name)
    seen = {"n": 0}

    def interrupted(*args, **kwargs):
        seen["n"] += 1
        if seen["n"] > calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


def leftovers(root: Path) -> list[str]:
    """Temporary files a stage left behind under `root`."""
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.name.endswith(".tmp"))


def run_killed(monkeypatch, owner, name: str, argv: list[str], calls: int = 0) -> None:
    """The kill-and-rerun helper the stages' tests share: `openalign ARGV` with Ctrl-C in `owner.name` after
    `calls` calls of it; the run must stop there (the test then changes something and reruns)."""
    from openalign import cli

    with monkeypatch.context() as patch:
        interrupt_after(patch, owner, name, calls)
        try:
            cli.main(argv)
        except KeyboardInterrupt:
            return
    raise AssertionError(f"`openalign {' '.join(argv[:1])}` did not reach {name}")


@contextlib.contextmanager
def serving(app):
    """`app` served by uvicorn on a free loopback port in a thread, as `openalign serve` runs it: its URL."""
    import threading
    import time

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def two_small_sources(tmp_path) -> str:
    """Tux Paint stamps and an icon theme in their packages' layouts under tmp_path, 16 images each: the
    data.corpus_options= override that builds them (the built-in sources tuxpaint and icons, offline)."""
    import numpy as np

    rng = np.random.default_rng(0)
    stamps, theme = tmp_path / "stamps", tmp_path / "theme" / "64x64"
    words = ["duck", "cat", "apple", "pear", "storm", "boat", "tree", "chair", "hat", "drum", "moon", "bell", "fox",
             "owl", "kite", "lamp"]
    for i, word in enumerate(words):
        for folder, name in ((stamps / ("animals" if i % 2 else "food"), word), (theme / ("devices" if i % 2 else
                                                                                           "places"), f"gadget-{i}")):
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(folder / f"{name}.png")
        (stamps / ("animals" if i % 2 else "food") / f"{word}.txt").write_text(f"A {word}.\n")
    return (f"data.corpus_options=tuxpaint.root={stamps},tuxpaint.heldout=0.5,tuxpaint.image_size=64,"
            f"icons.root={tmp_path / 'theme'},icons.heldout=0.5,icons.image_size=64")


@contextlib.contextmanager
def held_elsewhere(out: Path):
    """`out`'s lock (outputs.owned) held by another thread for the block: another run, to the code under test (the
    thread that holds a lock may take it again, so the test's own thread cannot stand for another run)."""
    import threading

    from openalign.outputs import owned

    held, release = threading.Event(), threading.Event()

    def other_run():
        with owned(out):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=other_run)
    thread.start()
    try:
        assert held.wait(30), "the other thread never took the lock"
        yield
    finally:
        release.set()
        thread.join(30)


def poison(model: Path, prefix: str) -> Path:
    """A saved model whose weights named `prefix...` are NaN, as a diverged run leaves them (`text_projection`: every
    text vector NaN; `vision_model.embeddings`: every image vector)."""
    import torch
    from safetensors.torch import load_file, save_file

    for weights in sorted(Path(model).glob("*.safetensors")):
        state = load_file(weights)
        for name in state:
            if name.startswith(prefix) and state[name].is_floating_point():
                state[name] = torch.full_like(state[name], float("nan"))
        save_file(state, weights, metadata={"format": "pt"})
    return model
