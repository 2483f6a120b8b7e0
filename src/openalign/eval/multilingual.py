"""Multilingual retrieval on the Multi30k layout: one image list, parallel caption files per language.

    image_splits/test_2016_flickr.txt     one Flickr30K file name per line
    raw/test_2016_flickr.en[.gz]          line i is a caption of image i (task 1: one per language)
    raw/test_2016_flickr.de[.gz]  .fr  .cs  (any language code)

    task 2 (five independent descriptions per image), as released:
    image_splits/train_images.txt         (val_images.txt, test_2016_images.txt)
    raw/train.1.en.gz ... raw/train.5.de.gz   the list's stem without `_images`; the 5 files of a language are merged

Without --captions, the caption files are looked for beside the image list, then in `../raw/` (the release
layout: image_splits/ and raw/ side by side).

`openalign eval MODEL --task multilingual --data image_splits/test_2016_flickr.txt --images flickr30k-images
--captions raw` reports, per language, the retrieval keys (eval/metrics.py) and their mean recall, and the
mean over languages (the paper's Table 11 metric).

The built-in emoji corpus's held-out shards carry their texts per language (`eval_languages`), so
`--task multilingual --data data/emoji-.../eval` needs no other files; languages need not have been trained on.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import torch

from openalign.config import ConfigError
from openalign.eval import metrics as M
from openalign.eval.features import Context, EvalData
from openalign.eval.options import MultilingualOptions


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").strip() for line in f]


def caption_files(image_list: Path, captions_dir: Path | None = None) -> dict[str, list[Path]]:
    """{language: aligned caption files}, found by the image list's stem (`stem[.n].lang[.gz]`), or for a
    task 2 list (`train_images.txt`) by the stem without `_images` (`train.1.en.gz`)."""
    stems = [image_list.stem]
    if image_list.stem.endswith("_images"):
        stems.append(image_list.stem.removesuffix("_images"))
    names = "|".join(re.escape(s) for s in stems)
    pattern = re.compile(rf"^(?:{names})(?:\.\d+)?\.([A-Za-z]{{2,3}}(?:[-_][A-Za-z]+)?)(?:\.gz)?$")
    places = [captions_dir] if captions_dir else [image_list.parent, image_list.parent.parent / "raw"]
    for place in places:
        found: dict[str, list[Path]] = {}
        for path in sorted(place.iterdir()) if place.is_dir() else []:
            match = pattern.match(path.name)
            if match and path != image_list and match.group(1) != "txt":
                found.setdefault(match.group(1), []).append(path)
        if found:
            return found
    where = " or ".join(str(p) for p in places)
    raise ConfigError(f"no caption files {stems[-1]}[.N].<lang>[.gz] in {where}; pass --captions DIR (Multi30k's raw/)")


def _multi30k(data: EvalData, source: Path, captions_dir: Path | None) -> dict[str, tuple[list[str], list[int]]]:
    names = [line for line in _lines(source) if line]
    row_of = {Path(k).name: i for i, k in enumerate(data.keys)}  # images that were read (unreadable ones skipped)
    out = {}
    for lang, files in caption_files(source, captions_dir).items():
        captions, owner = [], []
        for path in files:
            lines = _lines(path)
            if len(lines) < len(names):
                raise ConfigError(f"{path} has {len(lines)} lines for the {len(names)} images of {source}")
            for name, caption in zip(names, lines):
                if caption and name in row_of:
                    captions.append(caption)
                    owner.append(row_of[Path(name).name])
        out[lang] = (captions, owner)
    return out


META = "texts_by_language"  # the per-image metadata this task reads: {language: clean texts} (the emoji corpus)


def texts_by_language(data: EvalData) -> list[dict]:
    return [m.get(META) or {} for m in data.meta]


def _metadata(data: EvalData) -> tuple[list[int], dict[str, tuple[list[str], list[int]]]]:
    """The images that have texts in every language (one gallery for all, as in Multi30k), and per language
    their texts and each text's image (a position in that gallery)."""
    by_language = texts_by_language(data)
    languages = sorted(set().union(*by_language))
    rows = [i for i, texts in enumerate(by_language) if all(texts.get(lang) for lang in languages)]
    if not rows:
        raise ConfigError("no evaluation image has texts in every language of the data; evaluate fewer languages")
    out = {}
    for lang in languages:
        pairs = [(text, j) for j, i in enumerate(rows) for text in by_language[i][lang]]
        out[lang] = ([t for t, _ in pairs], [j for _, j in pairs])
    return rows, out


def multilingual(ctx: Context, options: MultilingualOptions = MultilingualOptions()) -> tuple[dict, dict]:
    data, source = ctx.data, Path(ctx.path)
    rows = list(range(len(data.keys)))
    if source.suffix == ".txt":
        per_language = _multi30k(data, source, Path(options.captions) if options.captions else None)
    elif any(texts_by_language(data)):
        rows, per_language = _metadata(data)
    else:
        raise ConfigError("--task multilingual needs --data IMAGE_LIST.txt (Multi30k's image_splits/ file), or "
                          "held-out shards with texts per language (openalign corpus emoji --eval-languages ...)")
    images = data.image_embeds[rows]
    out: dict = {}
    for lang, (captions, owner) in per_language.items():
        owner_t = torch.tensor(owner, dtype=torch.long)
        txt = ctx.encode(captions)
        metrics = M.retrieval_metrics(images, txt, owner_t)
        chance = M.retrieval_chance(owner_t, len(rows))
        out |= {f"{lang}_{k}": v for k, v in metrics.items()} | {f"chance_{lang}_{k}": v for k, v in chance.items()}
    languages = sorted(per_language)
    out["mean_recall"] = sum(out[f"{lang}_mean_recall"] for lang in languages) / len(languages)
    out["chance_mean_recall"] = sum(out[f"chance_{lang}_mean_recall"] for lang in languages) / len(languages)
    return out | {"languages": ",".join(languages), "n_images": len(rows)}, {}
