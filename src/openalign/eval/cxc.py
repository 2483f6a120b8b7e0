"""Crisscrossed Captions (CxC): intra- and inter-modal retrieval with human-judged positives, and
Spearman correlation of model cosine with human similarity (STS, SIS, SITS).

CxC (Parekh et al. 2021) rates MS-COCO Karpathy val/test pairs from 0 to 5, one CSV per kind:

    sts_test.csv    caption1,caption2,agg_score,sampling_method    captions as COCO_val2014:sentid:N
    sis_test.csv    image1,image2,agg_score,sampling_method        images as COCO_val2014_...jpg
    sits_test.csv   caption,image,agg_score,sampling_method

Captions resolve by Karpathy sentid (or `file.jpg#i`), images by file name, within the evaluated
split; rows naming items outside it are counted (`*_unmatched`), not guessed. For the correlations a
caption that is not an id is read as literal text.

The correlations also come as the mean and std of Spearman's rho over `bootstrap` resamples of the pairs
(`sts_spearman_boot_mean`, `sts_spearman_boot_std`, ...), the form of the paper's Table 3.

Retrieval (`t2t`, `i2i`, and `i2t`/`t2i` with CxC's extra positives): a pair with a score at or above
`positive_score` (default 3) is a positive in both directions; the queries are the items with at least
one positive, the gallery is every item of the split's modality with the query itself left out; for
`i2t`/`t2i` the original captions stay positives. Ties count against the query (eval/metrics.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from openalign.config import ConfigError
from openalign.data import tables
from openalign.eval import metrics as M
from openalign.eval.features import Context, EvalData
from openalign.eval.options import CxcOptions

KINDS = {"sts": ("caption1", "caption2"), "sis": ("image1", "image2"), "sits": ("caption", "image")}
SCORE_COLUMNS = ("agg_score", "score", "similarity")
SENTID = re.compile(r"(?:.*:sentid:)?(\d+)$")
CAPTION_ID = re.compile(r"(?:.*:sentid:)?\d+$|.+#\d+$")  # a sentid or `file.jpg#i`; anything else is text


def read_ratings(directory: str, split: str) -> dict[str, list[tuple[str, str, float]]]:
    """{kind: [(first id, second id, score)]} for each of sts/sis/sits_<split>.csv present."""
    root = Path(directory)
    out = {}
    for kind, (first, second) in KINDS.items():
        path = root / f"{kind}_{split}.csv"
        if not path.is_file():
            continue
        rows = tables.dicts(path, ",")
        score = next((c for c in SCORE_COLUMNS if rows and c in rows[0]), None)
        if not rows or first not in rows[0] or second not in rows[0] or score is None:
            raise ConfigError(f"{path} needs the columns {first}, {second} and agg_score")
        out[kind] = [(r[first], r[second], float(r[score])) for r in rows]
    if not out:
        raise ConfigError(f"--cxc {directory} has none of sts_{split}.csv, sis_{split}.csv, sits_{split}.csv")
    return out


class Resolver:
    """Maps CxC ids onto the evaluated split's images and captions."""

    def __init__(self, data: EvalData):
        self.images = {Path(k).name: i for i, k in enumerate(data.keys)}
        self.captions = {c: i for i, c in enumerate(data.caption_ids)}

    def image(self, ref: str) -> int:
        return self.images.get(Path(ref).name, -1)

    def caption(self, ref: str) -> int:
        match = SENTID.match(ref.strip())
        return self.captions.get(match.group(1) if match else ref.strip(), -1)


def _recalls(prefix: str, ranks: torch.Tensor, positives: torch.Tensor, candidates: int) -> dict:
    chance = M.positive_chance((positives >= 0).sum(dim=1), candidates)
    return M.recalls(ranks, prefix) | {f"{prefix}_n_queries": len(ranks)} | {
        f"chance_{prefix}_r{k}": v for k, v in chance.items()}


def intra_modal(prefix: str, embeds: torch.Tensor, pairs: list[tuple[int, int]]) -> dict:
    """Recalls of retrieving an item's positives (symmetric pairs) among all other items of its modality."""
    queries, positives = M.pair_positives(pairs + [(b, a) for a, b in pairs], len(embeds))
    return _recalls(prefix, M.positive_ranks(embeds[queries], embeds, positives, exclude=queries), positives,
                    len(embeds) - 1)


def cross_modal(img: torch.Tensor, txt: torch.Tensor, data: EvalData, pairs: list[tuple[int, int]]) -> dict:
    """i2t / t2i recalls where (caption, image) `pairs` are positives besides each image's own captions."""
    links = list(zip(range(len(txt)), data.text_to_image.tolist())) + pairs  # (caption, image)
    queries, positives = M.pair_positives([(i, c) for c, i in links], len(img))
    out = _recalls("i2t", M.positive_ranks(img[queries], txt, positives), positives, len(txt))
    queries, positives = M.pair_positives(links, len(txt))
    return out | _recalls("t2i", M.positive_ranks(txt[queries], img, positives), positives, len(img))


def cxc(ctx: Context, options: CxcOptions = CxcOptions()) -> tuple[dict, dict]:
    from scipy.stats import spearmanr

    data = ctx.data
    if not options.dir:
        raise ConfigError("--task cxc needs --cxc DIR (the Crisscrossed Captions CSVs) and the Karpathy JSON as --data")
    if not data.captions:
        raise ConfigError("--task cxc needs captioned evaluation data (the Karpathy JSON the ratings refer to)")
    ratings = read_ratings(options.dir, ctx.options.split)
    find = Resolver(data)
    txt, img = ctx.encode(data.captions), data.image_embeds
    # captions that are not ids are encoded as literal text, for the correlations only
    refs = [ref for kind, rows in ratings.items() if kind != "sis" for row in rows
            for ref in (row[:2] if kind == "sts" else row[:1])]
    literal = {ref: i for i, ref in enumerate(dict.fromkeys(r for r in refs if not CAPTION_ID.match(r.strip())))}
    texts = torch.cat([txt, ctx.encode(literal)])

    def text_row(ref: str) -> int:
        return len(txt) + literal[ref] if ref in literal else find.caption(ref)

    out: dict = {}
    for kind, rows in ratings.items():
        if kind == "sis":
            resolved = [(find.image(a), find.image(b), s) for a, b, s in rows]
            cosine = lambda a, b: float(img[a] @ img[b])  # noqa: E731
        elif kind == "sts":
            resolved = [(text_row(a), text_row(b), s) for a, b, s in rows]
            cosine = lambda a, b: float(texts[a] @ texts[b])  # noqa: E731
        else:
            resolved = [(text_row(a), find.image(b), s) for a, b, s in rows]
            cosine = lambda a, b: float(texts[a] @ img[b])  # noqa: E731
        matched = [(a, b, s) for a, b, s in resolved if a >= 0 and b >= 0]
        out[f"{kind}_unmatched"] = len(rows) - len(matched)
        if len(matched) >= 2:
            model, human = [cosine(a, b) for a, b, _ in matched], [s for *_, s in matched]
            out[f"{kind}_spearman"] = float(spearmanr(model, human).statistic)
            out[f"{kind}_n_pairs"] = len(matched)
            if options.bootstrap:
                out[f"{kind}_spearman_boot_mean"], out[f"{kind}_spearman_boot_std"] = M.bootstrap_spearman(
                    model, human, options.bootstrap, options.seed)
        # retrieval: only items of the split (literal texts are not in any gallery)
        positives = [(a, b) for a, b, s in matched if s >= options.positive_score and a < len(txt)
                     and (kind != "sts" or b < len(txt))]
        if kind == "sts" and positives:
            out |= intra_modal("t2t", txt, positives)
        elif kind == "sis" and positives:
            out |= intra_modal("i2i", img, positives)
        elif kind == "sits":
            out |= cross_modal(img, txt, data, positives)
    correlations = [out[f"{k}_spearman"] for k in KINDS if f"{k}_spearman" in out]
    if correlations:
        out["mean_spearman"] = sum(correlations) / len(correlations)
    return out, {}
