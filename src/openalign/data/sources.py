"""Reading an image collection in any layout a user brings: one item type, one format dispatch, one
decode loop that skips and counts what cannot be used. Evaluation, `embed`, `dedup`, `ingest`, the Karpathy
sharder and the service's thumbnails all read through here.

    SPEC                                   one Item per
    DIR of *.tar, a brace pattern, a list  webdataset sample: texts = json `texts` (else the .txt captions),
                                           label = json `name`, meta = the json object
    DIR of image files                     image below DIR (sorted walk, links followed): texts = a `.txt`
                                           beside it (tars.captions), label = its first directory (DIR/LABEL/x.jpg)
    X.json  {"images": [...]}              image of a Karpathy split: filename (+ filepath), split,
                                           sentences[].raw, caption ids = sentids; `split`: test, a
                                           comma list (train,restval) or all
    X.txt                                  line of a Multi30k image list (label = the file name)
    X.csv | X.tsv | X.jsonl | X.json [..]  image of a caption table (tables.py: the image and text columns found
    | X.parquet (rows)                     as everywhere; a list of captions in a cell is several), grouped by
                                           image; or row of a label table (image, label, no text column)
    X.parquet (a pair table)               distinct image of a pair table (image_key, path, member, text)
    X.parquet (img2dataset's output)       downloaded image (its bytes in the table's image column)
    DIR in CLIP_benchmark's layout         webdataset sample of DIR/SPLIT/{0..n-1}.tar (n in SPLIT/nshards.txt):
                                           label = its `.cls` (a class index into DIR/classnames.txt), texts =
                                           its `.txt` lines (a retrieval set); `split`: test by default

What a .json or .parquet is comes from its content (tables.kind). Image files named by a table or list are found
under `images_root` (default: beside the file); a `file://` URL is a path. Paths are made absolute, so what is
written from them works from any directory.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator

from openalign import host
from openalign.config import ConfigError
from openalign.data import images
from openalign.data import pairs, tables, tars
from openalign.data.tables import TABLE_SUFFIXES

IMAGE_SUFFIXES = images.IMAGE_SUFFIXES


@dataclass
class Item:
    key: str  # the image's name in its collection: a shard sample's key, a path relative to the root
    path: str  # where its bytes are: an absolute file, a tar (with `member`), or the shard it was read from
    texts: list[str] = field(default_factory=list)
    label: str = ""
    caption_ids: list[str] = field(default_factory=list)  # Karpathy sentids (default: `file.jpg#i`)
    meta: dict = field(default_factory=dict)  # a shard sample's json object
    member: str | None = None  # a member of the tar `path`
    data: bytes | None = None  # the bytes, when read already (a shard sample)

    @property
    def name(self) -> str:
        """What a report calls the image: its file, or a shard sample's / pair table's key."""
        return self.path if self.data is None and self.member is None else self.key

    def read(self) -> bytes:
        return self.data if self.data is not None else SOURCES.read(self.path, self.member)


# ---------------------------------------------------------------------------------------------- dispatch

CLIP_BENCHMARK_FILES = ("classnames.txt", "zeroshot_classification_templates.txt", "dataset_type.txt")


def clip_benchmark_root(spec: str) -> Path | None:
    """`spec` when it is a dataset in CLIP_benchmark's webdataset layout (as `clip_benchmark_export_wds` writes it):
    ROOT/SPLIT/nshards.txt and ROOT/SPLIT/{0..n-1}.tar, beside ROOT/classnames.txt (one class name per line, in
    class-index order), ROOT/zeroshot_classification_templates.txt (`{c}` for the class name) or
    ROOT/dataset_type.txt (`retrieval`); else None."""
    path = Path(spec)
    if path.is_dir() and any((path / f).is_file() for f in CLIP_BENCHMARK_FILES) and any(path.glob("*/nshards.txt")):
        return path
    return None


def clip_benchmark_shards(root: Path, split: str) -> list[str]:
    """The shards of one split of a CLIP_benchmark dataset, as its reader finds them: SPLIT/{0..n-1}.tar."""
    splits = sorted(p.parent.name for p in root.glob("*/nshards.txt"))
    count = root / split / "nshards.txt"
    if not count.is_file():
        raise ConfigError(f"{root} (CLIP_benchmark's layout) has no split {split!r}; it has {', '.join(splits)}: "
                          f"choose one with --split")
    try:
        n = int(count.read_text().strip())
    except ValueError:
        raise ConfigError(f"{count} does not hold a number of shards; write the count of {split}/*.tar "
                          "into it") from None
    shards = [str(root / split / f"{i}.tar") for i in range(n)]
    missing = [s for s in shards if not Path(s).is_file()]
    if missing:
        raise ConfigError(f"{count} says {n} shards but {missing[0]} does not exist; download the split whole, or "
                          "correct nshards.txt")
    return shards


def is_shards(spec: str) -> bool:
    """Whether `spec` names webdataset shards: a directory holding .tar files (or a dataset in CLIP_benchmark's
    layout), a brace pattern, a tar, or a list file of tars (a `.txt` of image names is a Multi30k list instead)."""
    path = Path(spec)
    if path.is_dir():
        return any(path.glob("*.tar")) or clip_benchmark_root(spec) is not None
    if not path.is_file() or path.suffix in (".tar", ".list"):
        return True
    if path.suffix != ".txt":
        return False
    first = next((line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()), "")
    return first.endswith(tars.SHARD_SUFFIXES)


def listing(spec: str, images_root: str = "", split: str = "test", image_column: str = "",
            text_column: str = "") -> list[Item] | None:
    """The items of a collection of image files (a directory, a split, a table, a list), in a fixed
    order without reading any image; None when `spec` is shards (read them with `shard_items`). A table file is
    told by its content (tables.kind); its columns are found as everywhere (tables.columns)."""
    path = Path(spec)
    if is_shards(spec):
        return None
    if path.is_dir():
        root = path.resolve()
        # a FIFO or device named x.jpg is listed, and skipped and counted when read (not_a_file): never read
        items = [Item(str(f.relative_to(root)), str(f), _sidecar_texts(f), label=_first_dir(f, root))
                 for f in folder_files(root) if not f.is_dir()]
        if not items:
            raise ConfigError(f"no images under {spec} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
        return items
    root = (Path(images_root) if images_root else path.parent).resolve()
    if path.suffix == ".txt":  # a Multi30k image list: one file name per line
        names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        return [_file(root, name, label=name) for name in names]
    if path.suffix.lower() in TABLE_SUFFIXES and path.is_file():
        kind = tables.kind(path)
        if kind == "karpathy":
            return karpathy_items(path, root, split)
        if kind == "pairs":
            return pair_table_items(path)
        if kind == "img2dataset":
            return img2dataset_items(path)
        return table_items(path, root, image_column, text_column)
    raise ConfigError(f"{spec} is not an image collection: give a directory of images or shards, a Karpathy JSON, "
                      f"a Multi30k list (.txt) or a table ({', '.join(TABLE_SUFFIXES)})")


def items(spec: str | list[str], images_root: str = "", split: str = "test", counter: dict | None = None,
          captionless: bool = True, columns: tuple[str, str] = ("", "")) -> Iterator[Item]:
    """Every item of `spec` (or of a list of shards), in order (shards are read lazily, one at a time);
    shard samples that cannot be used are skipped and counted in `counter`, those without text too unless
    `captionless`."""
    listed = None if isinstance(spec, list) else listing(spec, images_root, split, *columns)
    if listed is not None:
        return iter(listed)
    return (item for shard in shard_list(spec, split) for item in shard_items(shard, counter, captionless))


def shard_list(spec: str | list[str], split: str = "test") -> list[str]:
    """The shards `spec` names (tars.list_shards), or those of one split of a CLIP_benchmark dataset."""
    if isinstance(spec, list):
        return spec
    root = clip_benchmark_root(spec)
    return clip_benchmark_shards(root, split) if root else tars.list_shards(spec)


def decoded(collection, counter: dict | None = None, alpha: str = "white") -> Iterator[tuple[Item, images.Image.Image]]:
    """(item, upright RGB image) of every item whose bytes decode; the others are skipped and counted by
    reason (a missing file or member: `missing_file`; a FIFO or device: `not_a_file`; see images.REJECT_REASONS).
    `alpha`: the model's rule for transparency (VisionConfig.alpha)."""
    for item in collection:
        try:
            image = images.load_rgb(item.read(), alpha=alpha)
        except images.BadImage as err:
            tars.skip(counter, err.reason)
            continue
        except NotAFile:
            tars.skip(counter, "not_a_file")
            continue
        except OSError:
            tars.skip(counter, "missing_file")
            continue
        yield item, image


# ---------------------------------------------------------------------------------------------- formats

def folder_files(root: Path) -> Iterator[Path]:
    """Image files under `root` by absolute path (later stages run from anywhere), in a fixed order. Symbolic
    links to directories are followed, each directory once by its real path: a link back to an ancestor
    (`loop -> .`) or two links to one place do not list images again (before: 3 images became 123 pairs)."""
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(Path(root).resolve(), followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames.clear()
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if os.path.realpath(os.path.join(dirpath, d)) not in seen)
        for name in sorted(filenames):
            if Path(name).suffix.lower() in IMAGE_SUFFIXES:
                yield Path(dirpath) / name


def read_caption(path: Path) -> str | None:
    """A text file's content (bytes that are not UTF-8 become U+FFFD, as everywhere); None if unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _sidecar_texts(image: Path) -> list[str]:
    """The captions of an image's `.txt` sidecar (`tars.captions`: one per non-empty line, or one alt-text when
    an img2dataset `.json` sidecar is beside it; that file is read only when the `.txt` has several lines)."""
    sidecar = image.with_suffix(".txt")
    text = (read_caption(sidecar) or "") if sidecar.is_file() else ""
    return tars.captions(text, sidecar_meta(image) if len(text.strip().splitlines()) > 1 else {})


def sidecar_meta(image: Path) -> dict:
    """An image's `.json` sidecar as a dict ({} when there is none, or it is not a JSON object)."""
    sidecar = image.with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8", errors="replace")) if sidecar.is_file() else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _first_dir(image: Path, root: Path) -> str:
    parts = image.relative_to(root).parts
    return parts[0] if len(parts) > 1 else ""


def _file(root: Path, name: str, texts: list[str] | None = None, label: str = "",
          caption_ids: list[str] | None = None) -> Item:
    local, remote = tables.location(name, root)
    return Item(name, local or remote, texts or [], label, caption_ids or [])


def karpathy_items(path: Path, root: Path, split: str) -> list[Item]:
    """The images of one split, several (`train,restval`) or `all`, with their captions and sentids."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig", errors="replace"))
        entries = data["images"]
        if not isinstance(entries, list):
            raise TypeError("images")
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ConfigError(f"{path} is not a Karpathy-split JSON (expected {{'images': [...]}})") from None
    wanted = set(split.split(","))
    out, bad = [], 0
    for entry in entries:
        try:
            if split != "all" and entry.get("split") not in wanted:
                continue
            name = str(Path(str(entry.get("filepath", ""))) / entry["filename"])
            sentences = [(str(s["raw"]).strip() if "raw" in s else " ".join(map(str, s["tokens"])),
                          str(s.get("sentid", ""))) for s in entry.get("sentences", [])]
        except (AttributeError, KeyError, TypeError):  # not an object with a filename and sentences
            bad += 1
            continue
        sentences = [(text, sentid or f"{entry['filename']}#{i}") for i, (text, sentid) in enumerate(sentences) if text]
        texts = [t for t, _ in sentences]
        out.append(_file(root, name, texts, texts[0] if texts else Path(name).stem, [i for _, i in sentences]))
    if bad:
        print(f"warning: skipped {bad:,} entries of {path} that are not images with a filename and sentences",
              file=sys.stderr)
    if not out:
        splits = sorted({str(e.get("split", "?")) for e in entries if isinstance(e, dict)})
        raise ConfigError(f"no images with split {split!r} in {path}; its splits are {', '.join(splits) or 'none'}")
    return out


def table_items(path: Path, root: Path, image_column: str = "", text_column: str = "") -> list[Item]:
    """One item per image of a caption table, with every caption of its rows in row order; or, for a label table
    (an image and a `label` column, no text column), one item per row. An evaluation table with a row that cannot
    be read is refused in one sentence: a metric over part of a benchmark would be silently another metric."""
    header = tables.names(path)
    image, text = tables.columns(path, header, image_column, text_column, need_text=False)
    if text is None and "label" not in header:
        tables.columns(path, header, image_column, text_column)  # the sentence: no text column
    grouped: dict[str, list[str]] = {}
    labelled = []
    for row in tables.rows(path, image, text or "", need_text=False):
        if row.bad:
            raise ConfigError(f"{path} {row.bad}; fix or remove that row")
        if not row.image:
            raise ConfigError(f"{path} row {row.number} has no image; fix or remove that row")
        if text is None:
            labelled.append(_file(root, row.image, label=row.label or ""))
        else:
            grouped.setdefault(row.image, []).extend(t.strip() for t in row.texts if t.strip())
    if text is None:
        return labelled
    return [_file(root, name, texts, texts[0] if texts else Path(name).stem,
                  [f"{Path(name).name}#{i}" for i in range(len(texts))]) for name, texts in grouped.items()]


def img2dataset_items(path: Path) -> list[Item]:
    """The downloaded images of img2dataset's `parquet` output (the images in a column), by key, with captions."""
    return [Item(row["key"], str(Path(path).resolve()), tars.captions(row["caption"], {"caption": row["caption"]}),
                 member=row["key"])
            for row in tables.img2dataset_rows(path, ["key", "status", "caption"], images=False)
            if row["status"] == "success"]


PAIR_IMAGES = f"""SELECT image_key, s.path, s.member, texts FROM (
                      SELECT image_key, {pairs.first_source()} AS s, list(text ORDER BY uid) AS texts
                      FROM read_parquet(?) GROUP BY image_key) ORDER BY image_key"""


def pair_table_items(path: Path) -> list[Item]:
    """The distinct images of a (small) pair table, ordered by key, with all their texts."""
    import duckdb

    with duckdb.connect() as con:
        try:
            rows = con.execute(PAIR_IMAGES, [str(path)]).fetchall()
        except duckdb.Error as err:
            raise ConfigError(f"{path} is not a pair table (image_key, path, member, text from `openalign ingest`): "
                              f"{str(err).splitlines()[0]}") from None
    return [Item(key, src, [t for t in texts if t], member=member) for key, src, member, texts in rows]


def shard_items(shard: str, counter: dict | None = None, captionless: bool = True) -> Iterator[Item]:
    """The samples of one shard as items holding their bytes; samples that cannot be used are counted. A sample
    without text is kept when `captionless`, or when it has a label (an evaluation image needs one or the other:
    CLIP_benchmark's classification samples are an image and a `.cls`)."""
    for sample in tars.read_samples([shard], counter=counter):
        try:
            meta = tars.sample_meta(sample)
        except tars.BadSample as err:
            tars.skip(counter, err.reason)
            continue
        label = str(meta.get("name") or "") or tars.sample_class(sample)
        try:
            texts = tars.sample_texts(sample)
        except tars.BadSample as err:
            if not (captionless or label):
                tars.skip(counter, err.reason)
                continue
            texts = []
        try:
            data = tars.image_bytes(sample)
        except tars.BadSample as err:
            tars.skip(counter, err.reason)
            continue
        yield Item(sample["__key__"], sample["__url__"], texts, label, list(meta.get("caption_ids") or []), meta,
                   data=data)


# ---------------------------------------------------------------------------------------------- bytes

class NotAFile(OSError):
    """What should hold image bytes is a FIFO, a device, a socket or a directory."""


class TooLarge(OSError):
    """Image bytes over the reader's limit, refused before they are read."""


def regular(st: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotAFile(f"{path} is not a regular file")


def open_regular(path: str):
    """`path` opened for reading without blocking on a FIFO (O_NONBLOCK), and checked on the open file itself (no
    swap between a check and the open): a regular file, or `NotAFile`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        regular(os.fstat(fd), path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, max_bytes: int | None = None) -> bytes:
    """A regular file's bytes; `TooLarge` past `max_bytes` (by its size, then by what is read: a file that grows
    while read is cut at the limit and refused too)."""
    with open_regular(path) as f:
        if max_bytes is None:
            return f.read()
        if os.fstat(f.fileno()).st_size > max_bytes:
            raise TooLarge(f"{path} is over {max_bytes:,} bytes")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"{path} is over {max_bytes:,} bytes")
    return data


class _Sources:
    """Image bytes by (path, member): a file, a tar member (by name, or by sample key: its image), or an image of
    img2dataset's `parquet` output (by key). Safe for a service's request threads: each tar is indexed once (under
    a lock) into member offsets, and every read opens the file afresh (no shared file position); the Parquet reader
    and its row-group cache are used under a lock. A tar cut short keeps the members before the cut; a member that
    cannot be read is an OSError, as a missing file is."""

    def __init__(self):
        # path -> ((size, mtime), {member name or sample key: (offset, size)})
        self.tars: dict[str, tuple[tuple[int, int], dict[str, tuple[int, int]]]] = {}
        self.tables: dict[str, tuple] = {}  # img2dataset parquet output: (file, image column, {key: (group, row)})
        self.group: tuple = (None, None, None)  # (path, row group, its images): the last row group read
        self._lock = threading.Lock()

    def close(self) -> None:
        """Forget every index and close the Parquet readers (the end of a command: `host.command_scope`)."""
        with self._lock:
            for table, _, _ in self.tables.values():
                getattr(table, "close", lambda: None)()
            self.tars, self.tables, self.group = {}, {}, (None, None, None)

    def read(self, path: str, member: str | None, max_bytes: int | None = None) -> bytes:
        """The bytes of a file, a tar member or a table's image; `max_bytes`: larger ones are `TooLarge`, refused
        before they are read. Whatever holds them must be a regular file (`NotAFile`: a FIFO would block the
        reader forever, /dev/zero fill its memory)."""
        if not member:
            return read_regular(path, max_bytes)
        stat = os.stat(path)
        regular(stat, path)
        if path.endswith(".parquet"):
            with self._lock:  # one ParquetFile and row-group cache per table, shared by every thread
                data = self._table_image(path, member)
            if max_bytes is not None and len(data) > max_bytes:
                raise TooLarge(f"{member} of {path} is over {max_bytes:,} bytes")
            return data
        stamp = (stat.st_size, stat.st_mtime_ns)  # a tar written again at the same path is indexed again
        stamped = self.tars.get(path)
        if stamped is None or stamped[0] != stamp:
            with self._lock:
                stamped = self.tars.get(path)
                if stamped is None or stamped[0] != stamp:
                    stamped = self.tars[path] = (stamp, self._index(path))
        index = stamped[1]
        found = index.get(member) or next((v for name, v in index.items() if name.endswith("/" + member)), None)
        if found is None:
            raise FileNotFoundError(f"{member} not in {path}")
        offset, size = found
        if max_bytes is not None and size > max_bytes:
            raise TooLarge(f"{member} of {path} is over {max_bytes:,} bytes")
        with open_regular(path) as f:
            f.seek(offset)
            data = f.read(size)
        if len(data) != size:
            raise OSError(f"{member} of {path} is cut short")
        return data

    def _table_image(self, path: str, key: str) -> bytes:
        """An image of img2dataset's `parquet` output by its key (row groups read one at a time, the last kept:
        stages read a table's images in order)."""
        import pyarrow.parquet as pq

        if path not in self.tables:
            try:
                table = pq.ParquetFile(path)
            except Exception as err:  # noqa: BLE001 - pyarrow's errors for a missing or damaged file
                raise OSError(f"{path}: {err}") from None
            column = tables.img2dataset_image_column(table.schema_arrow)
            rows = {}
            for g in range(table.num_row_groups):
                for r, k in enumerate(table.read_row_group(g, columns=["key"]).column(0).to_pylist()):
                    rows[k] = (g, r)
            self.tables[path] = (table, column, rows)
        table, column, rows = self.tables[path]
        if column is None or key not in rows:
            raise FileNotFoundError(f"{key} not in {path}")
        group, row = rows[key]
        if self.group[:2] != (path, group):
            self.group = (path, group, table.read_row_group(group, columns=[column]).column(0))
        data = self.group[2][row].as_py()
        if data is None:
            raise FileNotFoundError(f"{key} of {path} has no image")
        return data

    @staticmethod
    def _index(path: str) -> dict[str, tuple[int, int]]:
        """{member name: (offset, size)} of a tar's files, and {sample key: ...} of its image members (a webdataset
        sample `KEY.jpg` is found by `KEY` too: an index's metadata names samples by key)."""
        index, keys = {}, {}
        try:
            with open_regular(path) as f, tarfile.open(fileobj=f) as tar:
                try:
                    for info in tar:
                        if info.isfile():
                            index[info.name] = (info.offset_data, info.size)
                            key, ext = tars.split_name(info.name)
                            if "." + ext.lower() in IMAGE_SUFFIXES:
                                keys.setdefault(key, (info.offset_data, info.size))
                except tarfile.TarError:  # truncated: the members before the cut are still there
                    pass
        except NotAFile:
            raise
        except (tarfile.TarError, OSError) as err:
            raise OSError(f"{path}: {err}") from None
        return keys | index


SOURCES = _Sources()  # one per process (forked workers build their own), emptied when a command ends
host.command_cache(SOURCES.close)


def read_bytes(path: str, member: str | None) -> bytes | None:
    """The bytes of a file or tar member; None where they cannot be read (missing, or cut off by a truncated tar)."""
    try:
        return SOURCES.read(path, member)
    except OSError:
        return None
