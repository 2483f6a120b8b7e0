"""webdataset tar shards: writing them with a manifest, finding them, and counting their samples.

A sample is `KEY.jpg|png|webp` (the image), `KEY.txt` (one alt-text, as img2dataset writes) and
`KEY.json` (metadata; `texts` may list several alt-texts for the image, `family` groups variants).

Every reader of shards (sample counting, tokenizer texts, the training loader, evaluation, embed)
goes through `read_samples` and `sample_texts` / `image_bytes`, so bad samples are handled one way:
- a tar cut short (a truncated download) ends its shard there; the sample it was in the middle of is
  skipped and counted (`truncated_tar`), never yielded half; a file that is not a tar at all counts once
  (`unreadable_tar`);
- a sample without an image (`no_image`), without any text (`no_text`) or with a `.json` that is not a
  JSON object (`bad_json`) raises `BadSample`, which readers skip and count (`skip`);
- text bytes that are not UTF-8 become U+FFFD, as ingest reads them: the sample is kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from pathlib import Path
from collections.abc import Iterator

import braceexpand

from openalign.config import ConfigError
from openalign.data.images import IMAGE_SUFFIXES
from openalign.data.pairs import open_keep_index

__all__ = ["MANIFEST", "BadSample", "ShardWriter", "TarWriter", "all_texts", "captions", "count_samples",
           "encode_image", "image_bytes", "list_shards", "read_samples", "sample_class", "sample_meta", "sample_texts"]

MANIFEST = "manifest.json"
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
SKIP_REASONS = ("truncated_tar", "unreadable_tar", "no_image", "no_text", "bad_json")


class BadSample(ValueError):
    """A sample that cannot be used; `reason` is one of SKIP_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def skip(counter: dict | None, reason: str, n: int = 1) -> None:
    """Count skipped samples: counter["skipped"] is the total, counter["reasons"] the split by reason."""
    if counter is None:
        return
    counter["skipped"] = counter.get("skipped", 0) + n
    reasons = counter.setdefault("reasons", {})
    reasons[reason] = reasons.get(reason, 0) + n


def skip_summary(counter: dict) -> str:
    """'3 (no_text 2, truncated_tar 1)': one line for a progress message or a report."""
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(counter.get("reasons", {}).items()))
    return f"{counter.get('skipped', 0):,}" + (f" ({reasons})" if reasons else "")


class TarWriter:
    """Writes webdataset samples into one tar: member `KEY.EXT` per field, in sorted field order, USTAR headers,
    mode 0444, owner `bigdata`, a whole-second mtime (the bytes webdataset's `TarWriter` writes for the same
    samples, tests/data/test_tars.py). Not webdataset's own class: importing webdataset imports torch, which every
    shard worker and Spark executor would pay. Values are bytes; a str is UTF-8, a dict or list JSON. Members get
    whole seconds: a float mtime makes Python's tar write a pax header before every member."""

    def __init__(self, path: Path, mtime: float | None = None):
        self.mtime = int(time.time() if mtime is None else mtime)
        self.tar = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)

    def write(self, sample: dict) -> None:
        key = sample["__key__"]
        for field in sorted(k for k in sample if not k.startswith("_")):
            value = sample[field]
            if isinstance(value, str):
                value = value.encode()
            elif isinstance(value, (dict, list)):
                value = json.dumps(value).encode()
            info = tarfile.TarInfo(f"{key}.{field}")
            info.size, info.mtime, info.mode = len(value), self.mtime, 0o444
            info.uname = info.gname = "bigdata"
            self.tar.addfile(info, io.BytesIO(value))

    def close(self) -> None:
        self.tar.close()

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardWriter:
    """Writes samples into `out/PREFIX-000000.tar ...` and a manifest with per-shard counts."""

    def __init__(self, out: Path, prefix: str = "shard", samples_per_shard: int = 1000, info: dict | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.prefix, self.samples_per_shard, self.info = prefix, samples_per_shard, dict(info or {})
        self.counts: dict[str, int] = {}
        self._writer = None
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
        self._writer = TarWriter(self.out / self._name)

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
    not_tars = [s for s in shards if Path(s).is_file() and not s.endswith(SHARD_SUFFIXES)]
    if not_tars:
        raise ConfigError(f"{not_tars[0]} is not a webdataset shard (.tar); give a directory of shards, a brace "
                          "pattern (shards-{000..009}.tar), a list file, or build shards with `openalign shard`")
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


def split_name(name: str) -> tuple[str, str]:
    """webdataset's rule: the key is the path up to the first dot of the file name, the rest its extension."""
    directory, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), (ext.lower() if dot else "")


def count_samples(shard: str, fraction: float = 1.0, keep: str = "") -> int:
    """Samples in one shard (in its `fraction` subset): from the manifest beside it, else by reading the tar
    headers (always, for a subset: its keys decide). In a tar cut short, the sample being read when it ended
    is not counted (`read_samples` skips it)."""
    manifest = Path(shard).parent / MANIFEST
    if manifest.is_file() and fraction >= 1.0 and not keep:
        counts = json.loads(manifest.read_text()).get("shards", {})
        if Path(shard).name in counts:
            return counts[Path(shard).name]
    keys: dict[str, None] = {}  # in order: the last one is the sample a truncation would cut
    size = Path(shard).stat().st_size
    try:
        with tarfile.open(shard) as tar:
            for member in tar:
                key, ext = split_name(member.name)
                if member.isfile() and ext:
                    keys[key] = None
                    if member.offset_data + member.size > size:
                        raise tarfile.ReadError("unexpected end of data")
            if not _ended(tar):
                raise tarfile.ReadError("no end-of-archive blocks")
    except (OSError, tarfile.TarError):
        if keys:
            keys.popitem()
    allowed = open_keep_index(keep).keys(shard) if keep else None
    return sum(in_fraction(key, fraction) and (allowed is None or key in allowed) for key in keys)


def _ended(tar: tarfile.TarFile) -> bool:
    """Whether a tar read to its end closes with the end-of-archive block (512 zero bytes). tarfile stops
    quietly when a file ends at (or inside) a member header, so a download cut between two members looks
    complete to it; only the missing end blocks tell."""
    tar.fileobj.seek(tar.offset)
    block = tar.fileobj.read(tarfile.BLOCKSIZE)
    return len(block) == tarfile.BLOCKSIZE and not any(block)


def tar_samples(path: str, counter: dict | None = None) -> Iterator[dict]:
    """{"__key__", "__url__", ext: bytes, ...} for each sample of one tar (a sample's members are adjacent,
    as webdataset writes them). A tar cut short ends there and the sample it was in is counted, not yielded."""
    sample: dict | None = None
    try:
        tar = tarfile.open(path)
    except (OSError, tarfile.TarError):
        skip(counter, "unreadable_tar")
        return
    with tar:
        try:
            for member in tar:
                key, ext = split_name(member.name)
                if not member.isfile() or not ext:
                    continue
                if sample is not None and key != sample["__key__"]:
                    yield sample
                    sample = None
                sample = sample or {"__key__": key, "__url__": path}
                sample[ext] = tar.extractfile(member).read()
            if not _ended(tar):
                raise tarfile.ReadError("no end-of-archive blocks")
        except (OSError, tarfile.TarError):
            skip(counter, "truncated_tar")
            return
    if sample is not None:
        yield sample


def image_bytes(sample: dict) -> bytes:
    for suffix in IMAGE_SUFFIXES:
        if suffix[1:] in sample:
            return sample[suffix[1:]]
    raise BadSample("no_image", f"no image member ({'/'.join(IMAGE_SUFFIXES)})")


def sample_class(sample: dict) -> str:
    """The class index of a CLIP_benchmark sample (its `.cls`, as webdataset writes an int: `7`), else ""."""
    return sample["cls"].decode("utf-8", errors="replace").strip() if "cls" in sample else ""


def sample_meta(sample: dict) -> dict:
    """The `.json` metadata ({} without one); a `.json` that is not a JSON object is a BadSample."""
    if "json" not in sample:
        return {}
    try:
        meta = json.loads(sample["json"])
    except ValueError:
        raise BadSample("bad_json", "the .json member is not JSON") from None
    if not isinstance(meta, dict):
        raise BadSample("bad_json", "the .json member is not a JSON object")
    return meta


def captions(text: str | None, meta: dict) -> list[str]:
    """The alt-texts a `.txt` caption file holds: one per non-empty line (CLIP_benchmark's retrieval files hold an
    image's five captions so), except beside img2dataset's metadata (a `caption` string in the `.json`), where the
    `.txt` is that one web alt-text and a newline in it is only whitespace. Every reader of a `.txt` (ingest, the
    training stream, eval, embed) applies this rule."""
    if text is None:
        text = meta.get("caption") if isinstance(meta.get("caption"), str) else ""
    if isinstance(meta.get("caption"), str):
        return [" ".join(text.split())] if text.strip() else []
    return [line.strip() for line in text.splitlines() if line.strip()]


def sample_texts(sample: dict) -> list[str]:
    """All alt-texts of a sample: json `texts` when present, else the `.txt`'s `captions` (invalid UTF-8 bytes
    become U+FFFD, as ingest reads them)."""
    meta = sample_meta(sample)
    texts = [t for t in meta.get("texts") or [] if isinstance(t, str) and t.strip()]
    if texts:
        return texts
    texts = captions(sample["txt"].decode("utf-8", errors="replace") if "txt" in sample else None, meta)
    if not texts:
        raise BadSample("no_text", "no .txt caption and no json texts")
    return texts


def all_texts(shards: list[str], fraction: float = 1.0, counter: dict | None = None, keep: str = "") -> Iterator[str]:
    """Every alt-text of every usable sample (of the `fraction` subset, of what `keep` keeps), in shard order
    (tokenizer training); samples without usable text are skipped and counted."""
    for sample in read_samples(shards, fraction=fraction, counter=counter, keep=keep):
        try:
            yield from sample_texts(sample)
        except BadSample as err:
            skip(counter, err.reason)


def read_samples(shards: list[str], fraction: float = 1.0, counter: dict | None = None, keep: str = ""
                 ) -> Iterator[dict]:
    """Raw samples (dicts of bytes) from tar shards in order; only those `in_fraction` when fraction < 1, and
    only those a keep index keeps (`keep`: see `KeepIndex`). Truncated or unreadable tars are counted in
    `counter` (see `tar_samples`); samples the keep-lists drop are not skips and are not counted."""
    for shard in shards:
        allowed = open_keep_index(keep).keys(shard) if keep else None
        for sample in tar_samples(shard, counter):
            if allowed is not None and sample["__key__"] not in allowed:
                continue
            if fraction >= 1.0 or in_fraction(sample["__key__"], fraction):
                yield sample








def encode_image(image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, quality=quality)
    return buf.getvalue()
