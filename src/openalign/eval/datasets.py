"""Evaluation data in the public formats, as a stream of `EvalSample`s (pixels, captions, metadata).

    --data DIR_OF_SHARDS                          webdataset shards (json `texts`, `name`)
    --data dataset_flickr30k.json --images DIR    Karpathy split: images[].filename (+ filepath),
                                                  split, sentences[].raw; `--split test` by default
    --data captions.csv|.tsv|.jsonl --images DIR  one row per caption: image, caption (grouped by image;
                                                  a JSONL row may instead carry a `captions` list)
    --data DIR (sub-directories of images)        ImageNet-style classification folders: DIR/LABEL/*.jpg
    --data labels.csv --images DIR                classification table: image, label
    --data test_2016_flickr.txt --images DIR      Multi30k image list (captions per language: eval/multilingual.py)

The paper's protocols are the Karpathy test splits: Flickr30K 1K test images and MSCOCO 5K test
images, 5 captions each (`--split test` of dataset_flickr30k.json / dataset_coco.json).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Iterator

from openalign.config import ConfigError
from openalign.data import images, transforms
from openalign.data.ingest import IMAGE_SUFFIXES
from openalign.data.loader import EvalSample, eval_samples
from openalign.data.shards import list_shards

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")
TEMPLATE_SETS = ("imagenet80", "generic")  # shipped in eval/templates/: CLIP's 80 ImageNet prompts, a short set


def load_templates(spec: str) -> tuple[str, ...]:
    """A shipped template set by name, or a file with one template per line ({} = the class name)."""
    path = Path(__file__).parent / "templates" / f"{spec}.txt" if spec in TEMPLATE_SETS else Path(spec)
    if not path.is_file():
        raise ConfigError(f"no templates file {spec}; give a file or one of {', '.join(TEMPLATE_SETS)}")
    templates = tuple(t for t in path.read_text().splitlines() if t.strip())
    if not templates or not all("{}" in t for t in templates):
        raise ConfigError(f"every line of {spec} must contain {{}} where the class name goes")
    return templates


def load_classnames(path: str, labels: list[str]) -> dict[str, str]:
    """Readable class names: `label<TAB or ,>name` lines, or one name per line in sorted-label order
    (the convention of ImageNet class-name lists aligned with sorted WordNet ids)."""
    lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    pairs = [re.split(r"[\t,]", line, maxsplit=1) for line in lines]
    if all(len(p) == 2 for p in pairs) and {p[0] for p in pairs} >= set(labels):
        return {p[0]: p[1].strip() for p in pairs}
    ordered = sorted(set(labels))
    if len(lines) != len(ordered):
        raise ConfigError(f"{path} has {len(lines)} names for {len(ordered)} classes; give one per class in sorted "
                          "label order, or `label,name` lines")
    return dict(zip(ordered, lines))


def karpathy_items(path: Path, root: Path, split: str) -> list[tuple[Path, list[str], list[str]]]:
    """(image, captions, caption ids = the JSON's sentids) of one split, several (`train,restval`) or `all`."""
    try:
        data = json.loads(path.read_text())
        entries = data["images"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a Karpathy-split JSON (expected {{'images': [...]}})") from None
    wanted = set(split.split(","))
    items = []
    for entry in entries:
        if split != "all" and entry.get("split") not in wanted:
            continue
        name = Path(entry.get("filepath", "")) / entry["filename"]
        sentences = [(s["raw"].strip() if "raw" in s else " ".join(s["tokens"]), str(s.get("sentid", "")))
                     for s in entry.get("sentences", [])]
        sentences = [(text, sentid or f"{entry['filename']}#{i}") for i, (text, sentid) in enumerate(sentences) if text]
        items.append((root / name, [t for t, _ in sentences], [i for _, i in sentences]))
    if not items:
        splits = sorted({e.get("split", "?") for e in entries})
        raise ConfigError(f"no images with split {split!r} in {path}; its splits are {', '.join(splits)}")
    return items


def karpathy_shards(path: Path, images_root: Path, split: str, out: Path, progress: bool = True) -> dict:
    """Shard a Karpathy split for training or evaluation (data/shard.py: every caption of an image kept,
    the shorter side at most 346, unreadable images skipped and counted); reruns reuse finished shards."""
    from openalign.data.shard import ShardOptions, write_samples

    keys: dict[str, int] = {}
    samples = []
    for image, captions, ids in karpathy_items(path, images_root, split):
        key = re.sub(r"[^A-Za-z0-9_-]", "_", image.stem)  # webdataset keys: no dots
        keys[key] = keys.get(key, 0) + 1
        samples.append({"image_key": key if keys[key] == 1 else f"{key}_{keys[key]}", "texts": captions, "uids": ids,
                        "path": str(image), "member": None, "url": ""})
    return write_samples(samples, out, ShardOptions(prefix=f"{path.stem}-{split.replace(',', '-')}"), progress,
                         {"source": str(path), "split": split, "images": str(images_root)})


def table_items(path: Path, root: Path, image_column: str = "image", text_column: str = "caption"
                ) -> list[tuple[Path, list[str]]]:
    grouped: dict[str, list[str]] = {}
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        rows = table_rows(path)
    for row in rows:
        if image_column not in row or (text_column not in row and "captions" not in row):
            raise ConfigError(f"{path} rows need an {image_column!r} column and a {text_column!r} column "
                              f"(or a 'captions' list in JSONL); found {', '.join(row)}")
        captions = row.get("captions") or [row[text_column]]
        grouped.setdefault(row[image_column], []).extend(c.strip() for c in captions if c and c.strip())
    return [((root / name), caps) for name, caps in grouped.items()]


def folder_items(root: Path) -> list[tuple[Path, str]]:
    """ImageNet-style folders: (image, label = its directory name), classes and files in sorted order."""
    items = []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        items += [(f, class_dir.name) for f in sorted(class_dir.iterdir())
                  if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file()]  # a FIFO named x.jpg would block
    if not items:
        raise ConfigError(f"{root} has no class sub-directories with images (DIR/LABEL/*.jpg)")
    return items


def file_samples(items: list[tuple[Path, list[str], str, list[str]]], resize: int, crop: int, counter: dict
                 ) -> Iterator[EvalSample]:
    """(image file, captions, label, caption ids) -> samples; unreadable images are skipped and counted."""
    for path, captions, label, caption_ids in items:
        try:
            image = images.load_rgb(path.read_bytes())
        except (OSError, images.BadImage):
            counter["skipped"] = counter.get("skipped", 0) + 1
            continue
        yield EvalSample(transforms.eval_pixels(image, resize, crop), captions,
                         {"name": label, "path": str(path), "caption_ids": caption_ids})


def captioned(items: list[tuple]) -> list[tuple[Path, list[str], str, list[str]]]:
    """(image, captions[, caption ids]) -> file_samples items; caption ids default to `file.jpg#i` (the
    Flickr30K token-file convention)."""
    return [(item[0], item[1], item[1][0] if item[1] else item[0].stem,
             item[2] if len(item) > 2 else [f"{item[0].name}#{i}" for i in range(len(item[1]))]) for item in items]


def labeled(items: list[tuple[Path, str]]) -> list[tuple[Path, list[str], str, list[str]]]:
    return [(path, [], label, []) for path, label in items]


def eval_stream(data: str, resize: int, crop: int, counter: dict, images_root: str = "",
                split: str = "test") -> Iterator[EvalSample]:
    """Samples of any supported evaluation format, in file order; unreadable images are counted."""
    path = Path(data)
    root = Path(images_root) if images_root else path.parent
    if path.suffix == ".json" and path.is_file():
        return file_samples(captioned(karpathy_items(path, root, split)), resize, crop, counter)
    if path.suffix == ".txt" and path.is_file():  # a Multi30k image list: one file name per line
        names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        return file_samples(labeled([(root / name, name) for name in names]), resize, crop, counter)
    if path.suffix in TABLE_SUFFIXES and path.is_file():
        header = path.read_text().split("\n", 1)[0]
        if path.suffix != ".jsonl" and "label" in header and "caption" not in header:
            rows = table_rows(path)
            return file_samples(labeled([(root / r["image"], r["label"]) for r in rows]), resize, crop, counter)
        return file_samples(captioned(table_items(path, root)), resize, crop, counter)
    if path.is_dir() and not any(path.glob("*.tar")) and any(p.is_dir() for p in path.iterdir()):
        return file_samples(labeled(folder_items(path)), resize, crop, counter)
    return eval_samples(list_shards(data), resize, crop, counter)


def table_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))


WORD_SCORE_COLUMNS = ("simlex999", "human (mean)", "human(mean)", "score", "similarity", "mean", "sim", "relatedness")
_POS_SUFFIX = re.compile(r"-[nvajr]$")


def word_pairs(path: Path) -> list[tuple[str, str, float]]:
    """(word, word, human score) from the released layouts of the word-similarity sets, recognised by content:
    SimLex-999 (tab-separated, header `word1 word2 POS SimLex999 ...`), WordSim-353 (`combined.csv` / `.tab`,
    header `Word 1,Word 2,Human (mean)`), MEN (space-separated `w1 w2 score`, no header; the lemma form's
    `-n/-v/-j` part-of-speech suffixes are dropped) and Stanford RW (tab-separated `w1 w2 score s1 ... s10`).
    The words are the first two fields; the score is the named score column, else the third field."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"{path} is empty; give a word-similarity file (SimLex-999, WordSim-353, MEN or RW)")
    delimiter = "\t" if "\t" in lines[0] else "," if "," in lines[0] else None
    rows = [next(csv.reader([line], delimiter=delimiter)) if delimiter else line.split() for line in lines]
    rows = [[field.strip() for field in row] for row in rows]

    def number(text: str) -> bool:
        try:
            float(text)
            return True
        except ValueError:
            return False

    header = not any(number(field) for field in rows[0])
    score = 2
    if header:
        names = [field.lower() for field in rows[0]]
        score = next((names.index(n) for n in WORD_SCORE_COLUMNS if n in names), 2)
        rows = rows[1:]
    pairs, bad = [], 0
    for row in rows:
        if len(row) <= score or not number(row[score]):
            bad += 1
            continue
        pairs.append((row[0], row[1], float(row[score])))
    if not pairs:
        raise ConfigError(f"{path} has no `word word score` rows (SimLex-999, WordSim-353, MEN or RW layouts)")
    if bad > len(pairs):
        raise ConfigError(f"{path}: {bad} of {bad + len(pairs)} rows have no number as their score; is it a "
                          "word-similarity file?")
    if all(_POS_SUFFIX.search(a) and _POS_SUFFIX.search(b) for a, b, _ in pairs):  # MEN's lemma form: sun-n
        pairs = [(_POS_SUFFIX.sub("", a), _POS_SUFFIX.sub("", b), s) for a, b, s in pairs]
    return pairs
