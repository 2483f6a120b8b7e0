"""The indexes one service answers, by name: `openalign serve A B C`, `NAME=DIR`, or a JSON file like
clip-retrieval's `indices_paths.json`.

A name (clip-retrieval's `indice_name`) holds an index of image vectors, an index of text vectors (`openalign index
--vectors text`: clip-retrieval's `modality=text`), or both, of one model. Each index is reloaded when its
`index.json` changes (an `index --add`, `--delete` or a rebuild finished), checked once per request: a request
searches the index as it was when the request started, and the next one sees the new one. A rebuild in progress
(no index.json yet) keeps the old one serving.

    indices_paths.json:  {"emoji": "runs/emoji-index",
                          "photos": {"image": "idx/photos", "text": "idx/photos-text", "model": "runs/m/model",
                                     "min_score": 0.2}}
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from openalign.config import ConfigError
from openalign.index import opened, search, takedown

MODALITIES = ("image", "text")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENTRY_KEYS = {"image", "text", "model", "min_score"}


@dataclass(frozen=True)
class Spec:
    """One name's index directories by modality, and its model and score floor (None: the server's)."""

    name: str
    paths: dict[str, Path]
    model: str | None = None
    min_score: str | float | None = None


def _vectors_of(path: Path) -> str:
    return opened.read_info(path).get("vectors", "image")


def _named(name: str, where: str) -> str:
    if not NAME.match(name):
        raise ConfigError(f"{where}: the index name {name!r} must be letters, digits, '_', '.' or '-' (at most 64)")
    return name


def parse_specs(items: list[str]) -> list[Spec]:
    """The service's names from the command line: index directories (named by their folder), NAME=DIR, or JSON
    files of names. Two indexes of one name are its image and its text index."""
    found: dict[str, dict] = {}

    def add(name: str, path: Path, model=None, floor=None, modality: str | None = None):
        entry = found.setdefault(name, {"paths": {}, "model": model, "min_score": floor})
        modality = modality or _vectors_of(path)
        if modality in entry["paths"]:
            raise ConfigError(f"two indexes named {name} both hold {modality} vectors ({entry['paths'][modality]} "
                              f"and {path}); name them apart with NAME=DIR")
        entry["paths"][modality] = path

    for item in items:
        if item.endswith(".json") and "=" not in item:
            for name, entry in _read_json(Path(item)).items():
                if isinstance(entry, str):
                    add(name, _relative(item, entry))
                    continue
                for modality in MODALITIES:
                    if entry.get(modality):
                        add(name, _relative(item, entry[modality]), entry.get("model"), entry.get("min_score"),
                            modality)
                        if _vectors_of(found[name]["paths"][modality]) != modality:
                            raise ConfigError(f"{item}: {name}'s {modality} index {entry[modality]} holds "
                                              f"{_vectors_of(found[name]['paths'][modality])} vectors")
            continue
        name, _, path = item.rpartition("=")
        path = Path(path)
        add(_named(name or path.resolve().name, item), path)
    return [Spec(name, entry["paths"], entry["model"], entry["min_score"]) for name, entry in found.items()]


def _relative(json_file: str, path: str) -> Path:
    """A path in a JSON file: relative to the file's folder."""
    return Path(json_file).parent / path


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"no file {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a BOM (as Windows editors write) is no content
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ConfigError(f"{path} is not a JSON file of index names (like clip-retrieval's indices_paths.json)"
                          ) from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path} must map index names to index directories: {{\"name\": \"DIR\"}}")
    for name, entry in data.items():
        _named(name, str(path))
        if isinstance(entry, dict):
            unknown = set(entry) - ENTRY_KEYS
            if unknown or not any(entry.get(m) for m in MODALITIES):
                raise ConfigError(f"{path}: {name} must be a directory or an object of {', '.join(sorted(ENTRY_KEYS))}"
                                  f" with an image or a text index" + (f" (unknown: {', '.join(sorted(unknown))})"
                                                                       if unknown else ""))
            wrong = [key for key in ("image", "text", "model") if key in entry and not isinstance(entry[key], str)]
            if wrong:
                raise ConfigError(f"{path}: {name}'s {wrong[0]} must be a directory (a string), not "
                                  f"{json.dumps(entry[wrong[0]])[:40]}")
            floor = entry.get("min_score")
            if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float, str))):
                raise ConfigError(f"{path}: {name}'s min_score must be a cosine (a number) or a metrics JSON's path, "
                                  f"not {json.dumps(floor)[:40]}")
        elif not isinstance(entry, str):
            raise ConfigError(f"{path}: {name} must be an index directory or an object with image / text")
    return data


class Live:
    """An index that follows its directory: `current()` reloads it when its index.json was replaced."""

    def __init__(self, path: Path):
        self.path = path
        self.loaded = opened.load(path)
        self.stamp = self._stamp()
        self.lock = threading.Lock()
        self.extras: dict = {}  # what requests derive from this index once (patch vectors): dropped on a reload

    def _stamp(self):
        try:
            st = (self.path / opened.INFO).stat()
        except OSError:
            return None  # a rebuild between its unfinish and its index.json: keep serving the old one
        return st.st_ino, st.st_mtime_ns, st.st_size

    def current(self) -> opened.Loaded:
        stamp = self._stamp()
        if stamp is None or stamp == self.stamp:
            return self.loaded
        with self.lock:
            stamp = self._stamp()
            if stamp is not None and stamp != self.stamp:
                try:
                    fresh = opened.load(self.path)
                except Exception as err:  # noqa: BLE001 - caught between two files of a change, or damaged: any
                    # failure keeps the previous generation serving, and the next request tries again
                    print(f"warning: {self.path} changed and does not load yet ({str(err)[:300]}); serving the "
                          "previous one", file=sys.stderr)
                    return self.loaded
                old = self.loaded.info.get("weights")
                if old and fresh.info.get("weights") not in ("", old):
                    print(f"warning: {self.path} was rebuilt with another model; restart the service with it",
                          file=sys.stderr)
                else:
                    self.loaded, self.extras = fresh, {}
                self.stamp = stamp
            return self.loaded


@dataclass
class Collection:
    """One name of the service: its image and/or text index, the model they were embedded with, the score floor."""

    name: str
    indexes: dict[str, Live]
    model: object
    tokenizer: object
    floor: float | None
    state_lock: threading.Lock = field(default_factory=threading.Lock)

    merged: dict = field(default_factory=dict)  # modality -> (the generations it was made of, the index)

    def live(self, modality: str | None) -> Live:
        modality = modality or ("image" if "image" in self.indexes else "text")
        if modality not in self.indexes:
            raise ConfigError(f"{self.name} has no {modality} index; serve one built with `openalign index EMB "
                              f"--vectors {modality}` under the name {self.name}")
        return self.indexes[modality]

    def current(self, modality: str | None) -> opened.Loaded:
        """The index a request searches, as it is at the request's start, with every take-down of the name applied:
        an image deleted from the image index (`index --delete`) is gone from the text index too, and the other way
        round. Indexes of one embed output share row ids; others are matched by image (path and key)."""
        live = self.live(modality)
        loaded = live.current()
        others = [(other, other.current()) for other in self.indexes.values() if other is not live]
        if not any(len(o.deleted) for _, o in others):
            return loaded
        made_of = (loaded, *(o for _, o in others))
        with self.state_lock:
            cached = self.merged.get(live.path)
            if cached and len(cached[0]) == len(made_of) and all(a is b for a, b in zip(cached[0], made_of)):
                return cached[1]
        deleted = [loaded.deleted]
        for other_live, other in others:
            if not len(other.deleted):
                continue
            if other.info.get("parts") and other.info.get("parts") == loaded.info.get("parts"):
                deleted.append(other.deleted)  # one embed output: the same rows
                continue
            taken = takedown.read(other_live.path, other.info, other_live.path / opened.file_of(other.info, "meta"))
            found = takedown.moved(taken, live.path / opened.file_of(loaded.info, "meta")).column("id").to_numpy()
            deleted.append(found[found >= 0])
        merged = dataclasses.replace(loaded, deleted=np.unique(np.concatenate(deleted)).astype(np.int64))
        with self.state_lock:
            self.merged[live.path] = (made_of, merged)
        return merged

    def summary(self) -> dict:
        current = {m: self.current(m) for m in self.indexes}
        return {m: {"count": c.index.ntotal, "kind": c.info["kind"], "dim": c.info["dim"]} for m, c in current.items()}


class Catalog:
    """Every name the service answers, the first being the default."""

    def __init__(self, specs: list[Spec], model_dir: str | None = None, min_score: str | float | None = None):
        if not specs:
            raise ConfigError("give at least one index to serve")
        models: dict[str, tuple] = {}
        self.collections: dict[str, Collection] = {}
        for spec in specs:
            indexes = {m: Live(path) for m, path in spec.paths.items()}
            first = next(iter(indexes.values())).loaded
            weights = {live.loaded.info.get("weights") for live in indexes.values()}
            if len(weights) > 1:
                raise ConfigError(f"{spec.name}'s image and text indexes were embedded with different models; "
                                  "serve them under two names")
            chosen = spec.model or model_dir or first.info.get("model", "")
            if str(chosen) not in models:
                models[str(chosen)] = search.load_model_for(first, chosen)
            else:
                search.check_model_for(first, chosen, models[str(chosen)][0])
            model, tokenizer = models[str(chosen)]
            floor = search.score_floor(spec.min_score if spec.min_score is not None else min_score,
                                     first.info.get("weights"))
            self.collections[spec.name] = Collection(spec.name, indexes, model, tokenizer, floor)

    @property
    def names(self) -> list[str]:
        return list(self.collections)

    def get(self, name: str | None) -> Collection:
        if name is None or name == "":
            return next(iter(self.collections.values()))
        if name not in self.collections:
            raise ConfigError(f"no index named {name!r}; this service has {', '.join(self.collections)}")
        return self.collections[name]
