"""How much of a model's held-out openclipart recall is siblings: R@10 both ways, split by whether a held-out
drawing's file-name stem (its title without numbers and category: "dog head nicu buculei" of
dog_head_nicu_buculei_02.png) also names a training drawing, a sibling of the same series (docs/demo.md).

    python bench/clipart_siblings.py runs/clipart/model --corpus data/openclipart-minshortside96

Every held-out image is ranked against every held-out title and the other way round, as the run's own
evaluation does; the split only groups the queries.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import duckdb
import numpy as np
import torch


def stems(pairs: Path) -> dict[str, set[str]]:
    """Each image key's file-name stems (an image filed under several names has several)."""
    out: dict[str, set[str]] = {}
    with duckdb.connect() as con:
        for key, path in con.execute("SELECT image_key, path FROM read_parquet(?)", [str(pairs)]).fetchall():
            words = [w for w in re.split(r"[_\-\s.]+", Path(path).stem) if w and not w.isdigit()]
            out.setdefault(key, set()).add(" ".join(words).lower())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--corpus", default="data/openclipart-minshortside96", help="the openclipart corpus directory")
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import openalign
    from openalign.data import images as image_lib
    from openalign.data.tars import image_bytes, list_shards, read_samples, sample_texts

    corpus = Path(args.corpus)
    by_key = stems(corpus / "pairs.parquet")
    train = {s["__key__"] for s in read_samples(list_shards(str(corpus / "train")))}
    seen = set().union(*(by_key.get(k, set()) for k in train))
    keys, pictures, titles = [], [], []
    for sample in read_samples(list_shards(str(corpus / "eval"))):
        keys.append(sample["__key__"])
        pictures.append(image_lib.load_rgb(image_bytes(sample)))
        titles.append(sample_texts(sample))
    texts = [t for own in titles for t in own]
    owner = np.array([i for i, own in enumerate(titles) for _ in own])
    model = openalign.load(args.model)
    with torch.no_grad():
        scores = (model.encode_images(pictures) @ model.encode_texts(texts).T).numpy()
    top_texts = np.argsort(-scores, axis=1)[:, :args.k]
    i2t = np.array([(owner[row] == i).any() for i, row in enumerate(top_texts)])
    top_images = np.argsort(-scores.T, axis=1)[:, :args.k]
    t2i = np.array([owner[j] in row for j, row in enumerate(top_images)])
    sibling = np.array([bool(by_key.get(k, set()) & seen) for k in keys])
    result = {"images": len(keys), "texts": len(texts), "k": args.k,
              "chance_i2t": float(np.mean([1 - np.prod([(len(texts) - len(own) - j) / (len(texts) - j)
                                                         for j in range(args.k)]) for own in titles])),
              "chance_t2i": args.k / len(keys)}
    for name, images in (("all", np.ones(len(keys), bool)), ("sibling in training", sibling),
                         ("no sibling", ~sibling)):
        queries = images[owner]
        result[name] = {"images": int(images.sum()), f"i2t_r{args.k}": float(i2t[images].mean()),
                        f"t2i_r{args.k}": float(t2i[queries].mean())}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
