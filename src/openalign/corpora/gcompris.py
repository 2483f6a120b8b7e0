"""Built-in corpus `gcompris`: the photographs and drawings of GCompris's activities, with the words they teach.

GCompris, the educational suite, ships each activity's pictures inside a Qt resource file (`.rcc`, gcompris-qt-data):
photographs of animals, tools, fish, monuments and planets, and the drawings of its vocabulary lesson. The other
built-in sources are drawings, icons and glyphs; these are mostly photographs, the style a third of Tux Paint's
stamps has and no other source does. The text is the word the activity teaches: the vocabulary lesson's own
description ("gorilla", "blue"; its words_sample.json), else the picture's file name as words ("measuringTape3" ->
"measuring tape", "northern_harrier" -> "northern harrier"). The label for zero-shot evaluation is the folder the
activity keeps it in ("tools", "fishes", "monuments") or the lesson's name ("animal", "color").

The resource files are read as data (`read_rcc`: Qt's documented layout, zlib-compressed entries inflated); nothing
in them is executed. The pictures are written under DIR/images/ once, then go through the pipeline (catalog.py).
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

from tqdm import tqdm

from openalign.config import ConfigError
from openalign.corpora.catalog import Entry, Origin, build_catalog, names_filter

__all__ = ["DEFAULT_ACTIVITIES", "DEFAULT_ROOT", "build", "file_words", "read_rcc"]

DEFAULT_ROOT = "/usr/share/gcompris-qt/rcc"
# activity -> the label of its pictures ("" : the folder each picture is in)
DEFAULT_ACTIVITIES = ("lang", "categorization", "erase", "explore_world_animals", "explore_farm_animals",
                      "explore_monuments", "solar_system")
LABELS = {"erase": "animals", "explore_world_animals": "animals", "explore_farm_animals": "animals",
          "explore_monuments": "monuments", "solar_system": "planets"}
LICENCE = "GPL-3+ (Debian's copyright file of gcompris-qt-data)"
IMAGES = (".webp", ".png", ".jpg", ".jpeg")
SIZE = 346  # the shards' image side, as openclipart's


def read_rcc(path: Path) -> dict[str, bytes]:
    """{resource path: its bytes} of a Qt resource file (format versions 1-3); entries compressed with zstd, which
    Qt 6 can write, are left out. A file that is not one is a ConfigError."""
    data = Path(path).read_bytes()
    try:
        if data[:4] != b"qres":
            raise ValueError("no qres magic")
        version, tree, payload, names = struct.unpack(">IIII", data[4:20])
        node = 22 if version >= 2 else 14
        out: dict[str, bytes] = {}

        def name(offset: int) -> str:
            length, = struct.unpack(">H", data[names + offset:names + offset + 2])
            return data[names + offset + 6:names + offset + 6 + 2 * length].decode("utf-16-be")

        stack = [(0, "")]
        while stack:
            index, prefix = stack.pop()
            at = tree + index * node
            if at + 14 > len(data):
                raise ValueError("a node past the file's end")
            offset, flags = struct.unpack(">IH", data[at:at + 6])
            here = f"{prefix}{name(offset)}" if index else ""
            if flags & 2:  # a directory: its children's count and first index
                count, first = struct.unpack(">II", data[at + 6:at + 14])
                if index and first <= index:  # children come after their directory: no cycles
                    raise ValueError("a directory's children before it")
                stack += [(child, f"{here}/" if index else "") for child in range(first, first + count)]
                continue
            start, = struct.unpack(">I", data[at + 10:at + 14])
            size, = struct.unpack(">I", data[payload + start:payload + start + 4])
            body = data[payload + start + 4:payload + start + 4 + size]
            if len(body) != size:
                raise ValueError("an entry runs past the file's end")
            if flags & 4:  # zstd
                continue
            out[here] = zlib.decompress(body[4:]) if flags & 1 else body
        return out
    except (ValueError, struct.error, zlib.error, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not a readable Qt resource file ({err}); is gcompris-qt-data installed "
                          "whole?") from None


def file_words(stem: str) -> str:
    """A picture's file name as words: camelCase and underscores split, trailing numbers dropped
    ("measuringTape3" -> "measuring tape", "northern_harrier" -> "northern harrier")."""
    words = re.sub(r"([a-z])([A-Z])", r"\1 \2", re.sub(r"\d+$", "", stem)).replace("_", " ").replace("-", " ")
    return " ".join(words.lower().split())


def _safe(name: str) -> str:
    """A resource's name as one harmless path component (no separators, no leading dots)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "_"


def _lessons(files: dict[str, bytes]) -> dict[str, tuple[str, str]]:
    """{image file name: (description, lesson)} of the vocabulary lesson's words_sample.json."""
    found: dict[str, tuple[str, str]] = {}

    def walk(node, lesson: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("image"), str) and isinstance(node.get("description"), str):
                found.setdefault(node["image"], (node["description"], lesson))
            here = node.get("name") if node.get("type") == "lesson" and isinstance(node.get("name"), str) else lesson
            for value in node.values():
                walk(value, here)
        elif isinstance(node, list):
            for value in node:
                walk(value, lesson)

    for path, body in files.items():
        if path.endswith("words_sample.json"):
            try:
                walk(json.loads(body), "")
            except ValueError:
                continue
    return found


def build(out: Path, root: str = DEFAULT_ROOT, activities: tuple[str, ...] = DEFAULT_ACTIVITIES,
          heldout: float = 0.2, seed: int = 0, engine: str = "local", samples_per_shard: int = 1000,
          progress: bool = True) -> dict:
    """Unpack the activities' pictures into `out/images/` and ingest, filter and shard them into `out`. The paper's
    filters, but for the three-word minimum ("gorilla") and the image-size rule (a lesson's drawing is 200 px)."""
    out = Path(out)
    missing = [a for a in activities if not (Path(root) / f"{a}.rcc").is_file()]
    if missing:
        raise ConfigError(f"GCompris's {missing[0]} activity not found at {Path(root) / (missing[0] + '.rcc')}; "
                          "install it with `apt-get install gcompris-qt-data` or pass --root DIR")
    images = out.resolve() / "images"  # absolute: the table's relative paths are read from its own folder
    entries = []
    for activity in tqdm(activities, desc="unpack gcompris", unit="activity", disable=not progress):
        files = read_rcc(Path(root) / f"{activity}.rcc")
        lessons = _lessons(files)
        for path, body in sorted(files.items()):
            if not path.lower().endswith(IMAGES):
                continue
            folder, file = path.rsplit("/", 2)[-2:]
            text, label = lessons.get(file, (file_words(file.rsplit(".", 1)[0]), ""))
            text = " ".join(text.split())
            if not text:
                continue
            target = images / _safe(activity) / _safe(folder) / _safe(file)  # names from the file stay under DIR
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(body)
            entries.append(Entry(str(target), (text,), label or LABELS.get(activity) or file_words(folder)))
    origin = Origin("gcompris-qt-data", LICENCE, root)
    return build_catalog("gcompris", entries, out, origin, heldout=heldout, seed=seed, image_size=SIZE,
                         filter_cfg=names_filter(0), engine=engine, samples_per_shard=samples_per_shard,
                         progress=progress)
