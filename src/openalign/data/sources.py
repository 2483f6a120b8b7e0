"""Reading an image collection in any layout a user brings: one item type, one format dispatch, one
decode loop that skips and counts what cannot be used. Evaluation, `embed`, `dedup` and the Karpathy
sharder all read through here.

    SPEC                                   one Item per
    DIR of *.tar, a brace pattern, a list  webdataset sample: texts = json `texts` (else the .txt caption),
                                           label = json `name`, meta = the json object
    DIR of image files                     image below DIR (sorted walk, links followed): texts = a `.txt`
                                           beside it, label = its first directory under DIR (DIR/LABEL/x.jpg)
    X.json  {"images": [...]}              image of a Karpathy split: filename (+ filepath), split,
                                           sentences[].raw, caption ids = sentids; `split`: test, a
                                           comma list (train,restval) or all
    X.txt                                  line of a Multi30k image list (label = the file name)
    X.csv | X.tsv | X.jsonl                image of a caption table (image, caption; JSONL may carry a
                                           `captions` list), grouped by image; or row of a label table
                                           (image, label: a header with `label` and no `caption`)
    X.parquet                              distinct image of a pair table (image_key, path, member, text)

Image files named by a table or list are found under `images_root` (default: beside the file). Paths are
made absolute, so what is written from them works from any directory.
"""

from __future__ import annotations

import csv
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from openalign.config import ConfigError
from openalign.data import images
from openalign.data import tars

IMAGE_SUFFIXES = images.IMAGE_SUFFIXES
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")  # .json: a JSON array of rows, or a Karpathy split


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

def is_shards(spec: str) -> bool:
    """Whether `spec` names webdataset shards: a directory holding .tar files, a brace pattern, a tar, or a
    list file of tars (a `.txt` of image names is a Multi30k list instead)."""
    path = Path(spec)
    if path.is_dir():
        return any(path.glob("*.tar"))
    if not path.is_file() or path.suffix in (".tar", ".list"):
        return True
    if path.suffix != ".txt":
        return False
    first = next((line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()), "")
    return first.endswith(tars.SHARD_SUFFIXES)


def listing(spec: str, images_root: str = "", split: str = "test") -> list[Item] | None:
    """The items of a collection of image files (a directory, a split, a table, a list), in a fixed
    order without reading any image; None when `spec` is shards (read them with `shard_items`)."""
    path = Path(spec)
    if is_shards(spec):
        return None
    if path.is_dir():
        root = path.resolve()
        items = [Item(str(f.relative_to(root)), str(f), _sidecar_texts(f), label=_first_dir(f, root))
                 for f in folder_files(root) if f.is_file()]  # a FIFO named x.jpg would block a reader
        if not items:
            raise ConfigError(f"no images under {spec} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
        return items
    root = (Path(images_root) if images_root else path.parent).resolve()
    if path.suffix == ".parquet":
        return pair_table_items(path)
    if path.suffix == ".txt":  # a Multi30k image list: one file name per line
        names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        return [_file(root, name, label=name) for name in names]
    if path.suffix == ".json" and _karpathy(path):
        return karpathy_items(path, root, split)
    if path.suffix in TABLE_SUFFIXES:
        rows = table_rows(path)
        if path.suffix in (".csv", ".tsv") and rows and "label" in rows[0] and "caption" not in rows[0]:
            return [_file(root, row["image"], label=row["label"]) for row in rows]
        return caption_table_items(path, rows, root)
    raise ConfigError(f"{spec} is not an image collection: give a directory of images or shards, a Karpathy JSON, "
                      f"a Multi30k list (.txt) or a table ({', '.join(TABLE_SUFFIXES)})")


def items(spec: str | list[str], images_root: str = "", split: str = "test", counter: dict | None = None,
          captionless: bool = True) -> Iterator[Item]:
    """Every item of `spec` (or of a list of shards), in order (shards are read lazily, one at a time);
    shard samples that cannot be used are skipped and counted in `counter`, those without text too unless
    `captionless`."""
    listed = None if isinstance(spec, list) else listing(spec, images_root, split)
    if listed is not None:
        return iter(listed)
    shards = spec if isinstance(spec, list) else tars.list_shards(spec)
    return (item for shard in shards for item in shard_items(shard, counter, captionless))


def decoded(collection, counter: dict | None = None, alpha: str = "white") -> Iterator[tuple[Item, "images.Image.Image"]]:
    """(item, upright RGB image) of every item whose bytes decode; the others are skipped and counted by
    reason (a missing file or member: `missing_file`; see images.REJECT_REASONS). `alpha`: the model's rule for
    transparency (VisionConfig.alpha)."""
    for item in collection:
        try:
            image = images.load_rgb(item.read(), alpha=alpha)
        except images.BadImage as err:
            tars.skip(counter, err.reason)
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
    """The captions of an image's `.txt` sidecar (`shards.captions`: one per non-empty line, or one alt-text when
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


def sniff_delimiter(path: Path) -> str:
    """A CSV's delimiter from its header line: a tab, comma, semicolon or bar (a tab-separated file named .csv
    is common); `.tsv` files are tab-separated."""
    import csv

    if Path(path).suffix.lower() == ".tsv":
        return "\t"
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = f.readline()
    try:
        return csv.Sniffer().sniff(header, delimiters="\t,;|").delimiter
    except csv.Error:  # one column, or nothing to tell by
        return ","


def _first_dir(image: Path, root: Path) -> str:
    parts = image.relative_to(root).parts
    return parts[0] if len(parts) > 1 else ""


def _file(root: Path, name: str, texts: list[str] | None = None, label: str = "",
          caption_ids: list[str] | None = None) -> Item:
    path = root / name
    return Item(name, str(path), texts or [], label, caption_ids or [])


def _karpathy(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"{")


def karpathy_items(path: Path, root: Path, split: str) -> list[Item]:
    """The images of one split, several (`train,restval`) or `all`, with their captions and sentids."""
    try:
        data = json.loads(path.read_text())
        entries = data["images"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a Karpathy-split JSON (expected {{'images': [...]}})") from None
    wanted = set(split.split(","))
    out = []
    for entry in entries:
        if split != "all" and entry.get("split") not in wanted:
            continue
        name = str(Path(entry.get("filepath", "")) / entry["filename"])
        sentences = [(s["raw"].strip() if "raw" in s else " ".join(s["tokens"]), str(s.get("sentid", "")))
                     for s in entry.get("sentences", [])]
        sentences = [(text, sentid or f"{entry['filename']}#{i}") for i, (text, sentid) in enumerate(sentences) if text]
        texts = [t for t, _ in sentences]
        out.append(_file(root, name, texts, texts[0] if texts else Path(name).stem, [i for _, i in sentences]))
    if not out:
        splits = sorted({e.get("split", "?") for e in entries})
        raise ConfigError(f"no images with split {split!r} in {path}; its splits are {', '.join(splits)}")
    return out


def table_rows(path: Path) -> list[dict]:
    """The rows of a CSV/TSV (by header), JSONL or JSON array table."""
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.suffix == ".json":
            rows = json.loads(path.read_text())
            if not isinstance(rows, list):
                raise ValueError
            return rows
    except ValueError:
        raise ConfigError(f"{path} is not a JSON{' Lines' if path.suffix == '.jsonl' else ''} table of rows") from None
    delimiter = sniff_delimiter(path)
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter=delimiter))


def caption_table_items(path: Path, rows: list[dict], root: Path, image_column: str = "image",
                        text_column: str = "caption") -> list[Item]:
    """One item per image of a caption table, with every caption of its rows in row order."""
    grouped: dict[str, list[str]] = {}
    for row in rows:
        if not isinstance(row, dict) or image_column not in row or (text_column not in row and "captions" not in row):
            found = ", ".join(row) if isinstance(row, dict) else type(row).__name__
            raise ConfigError(f"{path} rows need an {image_column!r} column and a {text_column!r} column "
                              f"(or a 'captions' list in JSONL); found {found}")
        captions = row.get("captions") or [row[text_column]]
        grouped.setdefault(row[image_column], []).extend(c.strip() for c in captions if c and c.strip())
    return [_file(root, name, texts, texts[0] if texts else Path(name).stem,
                  [f"{Path(name).name}#{i}" for i in range(len(texts))]) for name, texts in grouped.items()]


PAIR_IMAGES = """SELECT image_key, min(path) AS path, min(member) AS member, list(text ORDER BY uid) AS texts
                 FROM read_parquet(?) GROUP BY image_key ORDER BY image_key"""


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
    """The samples of one shard as items holding their bytes; samples that cannot be used are counted."""
    for sample in tars.read_samples([shard], counter=counter):
        try:
            meta = tars.sample_meta(sample)
            texts = tars.sample_texts(sample)
        except tars.BadSample as err:
            if err.reason != "no_text" or not captionless:
                tars.skip(counter, err.reason)
                continue
            texts = []
        try:
            data = tars.image_bytes(sample)
        except tars.BadSample as err:
            tars.skip(counter, err.reason)
            continue
        yield Item(sample["__key__"], sample["__url__"], texts, str(meta.get("name") or ""), list(meta.get("caption_ids") or []),
                   meta, data=data)


# ---------------------------------------------------------------------------------------------- bytes

class _Sources:
    """Image bytes by (path, member); tar indexes are built once per process and tar. A tar cut short keeps
    the members before the cut; a member that cannot be read is an OSError, as a missing file is."""

    def __init__(self):
        self.tars: dict[str, tuple[tarfile.TarFile, dict]] = {}
        self.tables: dict[str, tuple] = {}  # img2dataset parquet output: (file, image column, {key: (group, row)})
        self.group: tuple = (None, None, None)  # (path, row group, its images): the last row group read

    def read(self, path: str, member: str | None) -> bytes:
        if not member:
            return Path(path).read_bytes()
        if path.endswith(".parquet"):
            return self._table_image(path, member)
        if path not in self.tars:
            self.tars[path] = self._index(path)
        tar, index = self.tars[path]
        info = index.get(member) or next((m for name, m in index.items() if name.endswith("/" + member)), None)
        if info is None:
            raise FileNotFoundError(f"{member} not in {path}")
        try:
            return tar.extractfile(info).read()
        except tarfile.TarError as err:
            raise OSError(f"{member} of {path}: {err}") from None

    @staticmethod
    def image_column(schema) -> str | None:
        """The binary column holding img2dataset's `parquet` output's images (its --encode_format), if any."""
        import pyarrow as pa

        return next((c for c in IMG2DATASET_IMAGE_COLUMNS
                     if c in schema.names and pa.types.is_binary(schema.field(c).type)), None)

    def _table_image(self, path: str, key: str) -> bytes:
        """An image of img2dataset's `parquet` output by its key (row groups read one at a time, the last kept:
        stages read a table's images in order)."""
        import pyarrow.parquet as pq

        if path not in self.tables:
            try:
                table = pq.ParquetFile(path)
            except Exception as err:  # noqa: BLE001 - pyarrow's errors for a missing or damaged file
                raise OSError(f"{path}: {err}") from None
            column = self.image_column(table.schema_arrow)
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
    def _index(path: str) -> tuple[tarfile.TarFile, dict]:
        try:
            tar = tarfile.open(path)
        except tarfile.TarError as err:
            raise OSError(f"{path}: {err}") from None
        index = {}
        try:
            for info in tar:
                if info.isfile():
                    index[info.name] = info
        except tarfile.TarError:  # truncated: the members before the cut are still there
            pass
        return tar, index


IMG2DATASET_IMAGE_COLUMNS = ("jpg", "png", "webp")
SOURCES = _Sources()  # one per process: forked workers each build their own tar indexes


def read_bytes(path: str, member: str | None) -> bytes | None:
    """The bytes of a file or tar member; None where they cannot be read (missing, or cut off by a truncated tar)."""
    try:
        return SOURCES.read(path, member)
    except OSError:
        return None
