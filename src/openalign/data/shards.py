"""webdataset tar shards: writing them with a manifest, finding them, and counting their samples.

A sample is `KEY.jpg|png|webp` (the image), `KEY.txt` (one alt-text, as img2dataset writes) and
`KEY.json` (metadata; `texts` may list several alt-texts for the image, `family` groups variants).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import braceexpand
import webdataset as wds

from openalign.config import ConfigError

MANIFEST = "manifest.json"
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


class ShardWriter:
    """Writes samples into `out/PREFIX-000000.tar ...` and a manifest with per-shard counts."""

    def __init__(self, out: Path, prefix: str = "shard", samples_per_shard: int = 1000, info: dict | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.prefix, self.samples_per_shard, self.info = prefix, samples_per_shard, dict(info or {})
        self.counts: dict[str, int] = {}
        self._writer: wds.TarWriter | None = None
        self._name = ""

    def write(self, key: str, image: bytes, image_ext: str, text: str, meta: dict) -> None:
        if self._writer is None or self.counts[self._name] >= self.samples_per_shard:
            self._open_next()
        self._writer.write({"__key__": key, image_ext: image, "txt": text, "json": json.dumps(meta).encode()})
        self.counts[self._name] += 1

    def _open_next(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._name = f"{self.prefix}-{len(self.counts):06d}.tar"
        self.counts[self._name] = 0
        self._writer = wds.TarWriter(str(self.out / self._name))

    def close(self) -> dict:
        if self._writer is not None:
            self._writer.close()
        manifest = {**self.info, "n_samples": sum(self.counts.values()), "shards": self.counts}
        (self.out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        return manifest


def list_shards(spec: str) -> list[str]:
    """A directory (all *.tar inside), a brace pattern (`shards-{000..099}.tar`) or a text file of paths."""
    path = Path(spec)
    if path.is_dir():
        shards = sorted(str(p) for p in path.glob("*.tar"))
    elif path.suffix in (".txt", ".list") and path.is_file():
        shards = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    else:
        shards = list(braceexpand.braceexpand(spec))
    missing = [s for s in shards if not Path(s).is_file()]
    if not shards or missing:
        what = f"{missing[0]} does not exist" if missing else f"no .tar shards found at {spec}"
        raise ConfigError(f"{what}; build a corpus with `openalign corpus emoji --out DIR` or pass data.train=DIR")
    return shards


def in_fraction(key: str, fraction: float) -> bool:
    """Whether a sample is in the `fraction` subset of a shard set (data.fraction): decided by a hash of its
    key alone, so the subset is the same in every run and every seed, and a smaller fraction's subset lies
    inside a larger one's."""
    if fraction >= 1.0:
        return True
    digest = hashlib.blake2b(f"fraction:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


def count_samples(shard: str, fraction: float = 1.0) -> int:
    """Samples in one shard (in its `fraction` subset): from the manifest beside it, else by reading the tar
    headers (always, for a subset: its keys decide)."""
    manifest = Path(shard).parent / MANIFEST
    if manifest.is_file() and fraction >= 1.0:
        counts = json.loads(manifest.read_text()).get("shards", {})
        if Path(shard).name in counts:
            return counts[Path(shard).name]
    keys = set()
    with tarfile.open(shard) as tar:
        for member in tar:
            if member.isfile() and "." in member.name:
                keys.add(member.name.split(".", 1)[0])
    return sum(in_fraction(key, fraction) for key in keys)


def image_bytes(sample: dict) -> bytes:
    for ext in IMAGE_EXTENSIONS:
        if ext in sample:
            return sample[ext]
    raise ValueError("sample has no image (jpg/png/webp)")


def sample_texts(sample: dict) -> list[str]:
    """All alt-texts of a sample: json `texts` when present, else the `.txt` caption."""
    if "json" in sample:
        meta = json.loads(sample["json"])
        if meta.get("texts"):
            return list(meta["texts"])
    if "txt" in sample:
        return [sample["txt"].decode("utf-8")]
    raise ValueError("sample has no text (.txt or json texts)")


def all_texts(shards: list[str], fraction: float = 1.0):
    """Every alt-text of every sample (of the `fraction` subset), in shard order (tokenizer training)."""
    return (text for sample in read_samples(shards, fraction=fraction) for text in sample_texts(sample))


def sample_meta(sample: dict) -> dict:
    return json.loads(sample["json"]) if "json" in sample else {}


def read_samples(shards: list[str], handler=wds.warn_and_continue, fraction: float = 1.0):
    """Raw samples (dicts of bytes) from tar shards in order; only those `in_fraction` when fraction < 1."""
    samples = wds.tarfile_samples(({"url": s} for s in shards), handler=handler)
    return samples if fraction >= 1.0 else (s for s in samples if in_fraction(s["__key__"], fraction))


def encode_image(image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, quality=quality)
    return buf.getvalue()
