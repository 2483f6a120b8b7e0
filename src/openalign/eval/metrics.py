"""Retrieval and classification metrics as pure functions of embeddings (torch math; SciPy ranks the bootstrap).

Ranks are 0-based and ties count against the query: the rank of a target is the number of *wrong*
candidates scoring at least as high as it (so a constant model gets chance-or-worse, never luck).
Image->text: an image's hit is its best-scoring caption (any of its captions counts).

Non-finite scores (NaN, inf: a diverged model) never help: a query whose own target scores non-finite
gets the rank `MISS` (beyond every K), and a wrong candidate scoring NaN counts as scoring at least as
high as the target. Without this, `logits >= true` is all False for NaN logits and the rank is -1, a hit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["against_target", "best_thresholds", "bootstrap_spearman", "captions_by_image", "chance_key", "class_ranks",
           "class_weights", "count_at_least", "ECE_BINS", "fit_sigmoid", "fit_temperature", "i2t_ranks", "is_chance",
           "knn_predict", "KS", "mean_per_class_recall", "modality_gap", "nll", "pair_positives", "positive_chance",
           "positive_ranks", "probabilities", "ranks_to_metrics", "recalls", "reliability", "reranked_ranks",
           "retrieval_chance", "retrieval_metrics", "retrieval_ranks", "shared_caption_share", "t2i_ranks",
           "threshold_spread", "topk_accuracy", "youden_at"]

KS = (1, 5, 10)


def chance_key(key: str, metrics: dict) -> str | None:
    """Where `metrics` holds the chance level of `key`, or None: a task writes its metrics' chance levels under its
    own prefix (eval/tasks.py `Task.prefix`), `chance_i2t_r10` for retrieval's bare keys, `zeroshot_chance_top1` for
    `zeroshot_top1`, and a corpus's held-out split under its name (`openclipart/chance_i2t_r10`); the key is found
    in the metrics themselves, so no list of prefixes here can fall behind the tasks."""
    candidates = [f"chance_{key}"] + [key[:i + 1] + "chance_" + key[i + 1:] for i, c in enumerate(key) if c in "_/"]
    return next((c for c in candidates if c in metrics), None)


def is_chance(key: str) -> bool:
    return key.startswith("chance_") or "_chance_" in key or "/chance_" in key


MISS = torch.iinfo(torch.long).max  # the rank of a query without a finite target score: never within any K


def against_target(scores: torch.Tensor) -> torch.Tensor:
    """Scores of wrong candidates with NaN as +inf: a NaN candidate counts as beating the target."""
    return scores.nan_to_num(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))


BLOCK_BYTES = 64 * 2**20  # similarity rows per block: at most this many bytes of scores at a time


def _rows_per_block(columns: int, chunk: int | None) -> int:
    return chunk or max(1, BLOCK_BYTES // (4 * max(columns, 1)))


_INT16_MAX = 32767


def count_at_least(scores: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """[b] how many entries of each row of `scores` [b, n] are >= its `threshold` [b, 1].

    Summing booleans into int16 over column slices short enough not to overflow is ~4x faster on CPU
    than the default int64 reduction; the slice sums are then added in int64, so the count is exact."""
    out = torch.zeros(scores.shape[0], dtype=torch.long)
    for start in range(0, scores.shape[1], _INT16_MAX):
        out += (scores[:, start:start + _INT16_MAX] >= threshold).sum(dim=1, dtype=torch.int16)
    return out


def captions_by_image(text_to_image: torch.Tensor, n_images: int) -> torch.Tensor:
    """[N, c_max] caption indices of each image, padded with -1 (captions may be in any order)."""
    counts = torch.bincount(text_to_image, minlength=n_images)
    order = torch.argsort(text_to_image, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(text_to_image)) - starts[text_to_image[order]]
    table = torch.full((n_images, int(counts.max()) if len(counts) else 0), -1, dtype=torch.long)
    table[text_to_image[order], slot] = order
    return table


def positive_ranks(queries: torch.Tensor, gallery: torch.Tensor, positives: torch.Tensor,
                   exclude: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """[Q] rank of each query's best-scoring positive among the gallery's other items.

    queries [Q, D], gallery [G, D]; positives [Q, p]: gallery indices of each query's positives, padded
    with -1 (every query has at least one); exclude [Q]: one gallery index per query left out of the
    ranking, or -1 (intra-modal retrieval leaves out the query itself). Works in blocks of query rows
    (about 64 MiB of scores each); positives are found by index (gather), so no [Q, G] mask is built."""
    ranks = torch.empty(queries.shape[0], dtype=torch.long)
    step = _rows_per_block(gallery.shape[0], chunk)
    # NaN scores need a pass of their own; finite embeddings cannot make any. One sum per input tells: a NaN
    # or inf element makes it non-finite (~20x cheaper than isfinite().all(); an overflow only takes the slow path)
    finite = math.isfinite(float(queries.sum())) and math.isfinite(float(gallery.sum()))
    for start in range(0, queries.shape[0], step):
        sims = queries[start:start + step] @ gallery.T  # [b, G]
        if exclude is not None:
            left_out = exclude[start:start + step]
            rows = torch.nonzero(left_out >= 0).squeeze(1)
            sims[rows, left_out[rows]] = float("-inf")
        ranks[start:start + step] = _block_ranks(sims, positives[start:start + step], finite)
    return ranks


def _block_ranks(sims: torch.Tensor, idx: torch.Tensor, finite: bool) -> torch.Tensor:
    """[b] ranks of a block of query rows: sims [b, G], idx [b, p] their positives (padded with -1)."""
    scores = sims.gather(1, idx.clamp(min=0))  # [b, p]
    valid = (idx >= 0) & scores.isfinite()  # a non-finite positive score is no hit
    scores = scores.masked_fill(~valid, float("-inf"))
    best = scores.max(dim=1, keepdim=True).values  # [b, 1]
    # wrong items at least as good as the best positive = all such - positives such
    block = count_at_least(sims if finite else against_target(sims), best) - ((scores >= best) & valid).sum(dim=1)
    return block.masked_fill(~valid.any(dim=1), MISS)


def i2t_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int | None = None
              ) -> torch.Tensor:
    """[N] rank of each image's best caption among all M texts. img [N, D], txt [M, D], text_to_image [M]."""
    return positive_ranks(img, txt, captions_by_image(text_to_image, img.shape[0]), chunk=chunk)


def t2i_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int | None = None
              ) -> torch.Tensor:
    """[M] rank of each text's image among all N images."""
    return positive_ranks(txt, img, text_to_image[:, None], chunk=chunk)


def reranked_ranks(queries: torch.Tensor, gallery: torch.Tensor, positives: torch.Tensor, ranks: torch.Tensor,
                   late: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], k: int, chunk: int | None = None
                   ) -> torch.Tensor:
    """[Q] rank of each query's best positive after a two-stage search: the pooled scores shortlist the top
    `k`, whose order `late(query rows [b], candidates [b, k]) -> scores [b, k]` replaces (late interaction).
    A query whose shortlist holds a positive: the shortlisted wrong items scoring at least as well as its best
    shortlisted positive (ties count against, as positive_ranks); otherwise its pooled rank `ranks` [Q]
    (it stays behind the shortlist, in pooled order)."""
    k = min(k, gallery.shape[0])
    out = ranks.clone()
    step = _rows_per_block(gallery.shape[0], chunk)
    for start in range(0, queries.shape[0], step):
        rows = torch.arange(start, min(start + step, queries.shape[0]))
        top = (queries[rows] @ gallery.T).topk(k, dim=1).indices  # [b, k]
        idx = positives[rows]  # [b, p]
        is_positive = ((top[:, :, None] == idx[:, None, :]) & (idx[:, None, :] >= 0)).any(dim=2)  # [b, k]
        scores = late(rows, top)
        best = scores.masked_fill(~is_positive, float("-inf")).max(dim=1, keepdim=True).values  # [b, 1]
        found = is_positive.any(dim=1)
        wrong_ahead = ((scores >= best) & ~is_positive).sum(dim=1)
        out[rows[found]] = wrong_ahead[found]
    return out


def pair_positives(pairs: list[tuple[int, int]], n_queries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query indices with at least one positive, their [Q, p] positives padded with -1) from (query,
    gallery) index pairs; duplicates are kept once, queries come out in index order."""
    by_query: dict[int, list[int]] = {}
    for query, item in pairs:
        if item not in by_query.setdefault(query, []):
            by_query[query].append(item)
    queries = sorted(q for q in by_query if 0 <= q < n_queries)
    width = max((len(by_query[q]) for q in queries), default=0)
    table = torch.full((len(queries), width), -1, dtype=torch.long)
    for row, query in enumerate(queries):
        table[row, :len(by_query[query])] = torch.tensor(by_query[query])
    return torch.tensor(queries, dtype=torch.long), table


def recalls(ranks: torch.Tensor, prefix: str, ks=KS) -> dict[str, float]:
    out = {f"{prefix}_r{k}": float((ranks < k).float().mean()) for k in ks}
    median = int(ranks.median())
    out[f"{prefix}_median_rank"] = float("inf") if median == MISS else float(median + 1)  # 1-based, as papers report it
    return out


def retrieval_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(i2t_ranks, t2i_ranks) from one pass over the [N, M] scores, equal to them ties included.

    Image rows are scored in blocks; each block ranks its images (their captions are in the block) and, for
    the texts' side, counts per column the images scoring at least a little below each text's own image. That
    own-image score comes from another block, so a plain dot product stands in for it beforehand, and its
    rounding difference from the GEMM's value (at most `delta`, the fp error bound of a length-D dot product,
    twice) is settled afterwards: the few scores that land within +-delta of it are kept and compared with the
    GEMM's exact value once its block has been seen. Non-finite embeddings take the two-pass path."""
    n, m = img.shape[0], txt.shape[0]
    finite = math.isfinite(float(img.sum())) and math.isfinite(float(txt.sum()))
    if not finite or n == 0 or m == 0:
        return i2t_ranks(img, txt, text_to_image, chunk), t2i_ranks(img, txt, text_to_image, chunk)
    captions = captions_by_image(text_to_image, n)
    approx = (img[text_to_image] * txt).sum(dim=1)  # [M] each text's own-image score, up to rounding
    unit = torch.finfo(img.dtype).eps * img.shape[1]
    delta = 2.2 * unit * img.norm(dim=1)[text_to_image] * txt.norm(dim=1)
    low, high = (approx - delta)[None, :], (approx + delta)[None, :]
    own = torch.empty(m, dtype=img.dtype)  # each text's own-image score as the GEMM computes it
    at_least_low = torch.zeros(m, dtype=torch.long)
    near_cols, near_vals = [], []
    i2t = torch.empty(n, dtype=torch.long)
    step = _rows_per_block(m, chunk)
    for start in range(0, n, step):
        sims = img[start:start + step] @ txt.T  # [b, M]
        idx = captions[start:start + step]
        i2t[start:start + step] = _block_ranks(sims, idx, finite=True)
        rows, slots = torch.nonzero(idx >= 0, as_tuple=True)
        own[idx[rows, slots]] = sims[rows, idx[rows, slots]]
        above = sims >= low
        at_least_low += above.sum(dim=0, dtype=torch.int16 if sims.shape[0] <= _INT16_MAX else torch.int32)
        near = torch.nonzero(above & (sims <= high), as_tuple=True)
        near_cols.append(near[1])
        near_vals.append(sims[near])
    if not bool(((own >= low[0]) & (own <= high[0])).all()):  # the bound did not hold (cannot for finite input)
        return i2t, t2i_ranks(img, txt, text_to_image, chunk)
    cols, vals = torch.cat(near_cols), torch.cat(near_vals)
    below_own = torch.bincount(cols[vals < own[cols]], minlength=m)
    # images >= own score = (>= low) - (in the band but below it); minus the text's own image
    t2i = at_least_low - below_own - 1
    return i2t, t2i


def retrieval_metrics(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor) -> dict[str, float]:
    """The metric keys of docs/evaluation.md: i2t_r1/5/10, t2i_r1/5/10, mean_recall, plus median ranks and counts."""
    return ranks_to_metrics(*retrieval_ranks(img, txt, text_to_image))


def ranks_to_metrics(i2t: torch.Tensor, t2i: torch.Tensor) -> dict[str, float]:
    metrics = recalls(i2t, "i2t") | recalls(t2i, "t2i")
    metrics["mean_recall"] = sum(metrics[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in KS) / (2 * len(KS))
    return metrics | {"n_images": len(i2t), "n_texts": len(t2i)}


def shared_caption_share(captions: list[str], text_to_image: torch.Tensor) -> float:
    """The share of captions whose text (case and spacing aside) is also a caption of another image. Such
    captions tie exactly with their twins, and ties count against the model, so R@K understates."""
    owners: dict[str, set[int]] = {}
    keys = [" ".join(c.lower().split()) for c in captions]
    for key, image in zip(keys, text_to_image.tolist()):
        owners.setdefault(key, set()).add(image)
    return sum(len(owners[key]) > 1 for key in keys) / len(keys) if keys else 0.0


def modality_gap(img: torch.Tensor, txt: torch.Tensor) -> dict[str, float]:
    """The geometry of the shared space (Liang et al. 2022, "Mind the Gap"): the distance between the
    image and text embeddings' centroids, and each modality's cone: the mean cosine between two
    different embeddings of it (1: one direction, 0: spread evenly). For unit vectors the mean pairwise
    cosine is (||sum x||^2 - N) / (N (N - 1)), so no N x N matrix is built."""
    img, txt = img.double(), txt.double()

    def cone(x: torch.Tensor) -> float:
        n = len(x)
        return float((x.sum(0).square().sum() - x.square().sum()) / (n * (n - 1))) if n > 1 else float("nan")

    return {"modality_gap": float((img.mean(0) - txt.mean(0)).norm()), "image_cone": cone(img), "text_cone": cone(txt)}


def positive_chance(n_positives: torch.Tensor, n_candidates: int, ks=KS) -> dict[int, float]:
    """Expected recall@K of a random ranking: mean over queries of P(any of its p positives among
    `n_candidates` is in the top K) = 1 - prod_i (n - p - i) / (n - i)."""
    p = n_positives.double()
    out = {}
    for k in ks:
        miss = torch.ones_like(p)
        for i in range(k):
            miss *= ((n_candidates - p - i) / (n_candidates - i)).clamp(min=0)
        out[k] = float((1 - miss).mean()) if len(p) else 0.0
    return out


def retrieval_chance(text_to_image: torch.Tensor, n_images: int, ks=KS) -> dict[str, float]:
    """Expected recalls of a random ranking (image->text: P(any of its c captions in the top K of M))."""
    captions = torch.bincount(text_to_image, minlength=n_images)  # [N] c per image
    i2t = positive_chance(captions, len(text_to_image), ks)
    out = {}
    for k in ks:
        out[f"i2t_r{k}"] = i2t[k]
        out[f"t2i_r{k}"] = min(1.0, k / n_images)
    out["mean_recall"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in ks) / (2 * len(ks))
    return out


def class_weights(text_embeds: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Prompt ensemble: [C*T, D] template embeddings (class-major) -> [C, D] classifier.

    Each template embedding is normalized, the T of a class are averaged, the mean is renormalized.
    """
    per_class = torch.nn.functional.normalize(text_embeds, dim=-1).reshape(n_classes, -1, text_embeds.shape[-1])
    return torch.nn.functional.normalize(per_class.mean(dim=1), dim=-1)  # [C, D]


def topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> dict[str, float]:
    """logits [N, C], labels [N]; ties count against (rank = wrong classes scoring >= the true one); a
    non-finite true logit is a miss and a NaN wrong logit counts against (see MISS)."""
    ranks = class_ranks(logits, labels)
    return {f"top{k}": float((ranks < k).float().mean()) for k in ks}


def class_ranks(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[N] the true class's rank: wrong classes scoring >= it (MISS when its own logit is not finite)."""
    true = logits.gather(1, labels[:, None])  # [N, 1]
    ranks = (against_target(logits) >= true).sum(dim=1) - 1
    return ranks.masked_fill(~true[:, 0].isfinite(), MISS)


def mean_per_class_recall(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean over the classes present in `labels` of the fraction of their images whose top-1 class is right
    (balanced accuracy: CLIP_benchmark's `mean_per_class_recall`, sklearn's balanced_accuracy_score); top-1 as in
    topk_accuracy (a tie counts against)."""
    hit = class_ranks(logits, labels) == 0
    present = labels.unique()
    return float(torch.stack([hit[labels == c].float().mean() for c in present]).mean()) if len(present) else 0.0


def best_thresholds(scores: torch.Tensor, positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `scores` [b, n] with its `positive` mask [b, n] (at least one positive and one negative):
    the similarity threshold that best separates its matches from its non-matches, and how well: Youden's
    J = TPR - FPR of "score >= threshold", maximized over every cut of the row's sorted scores. The
    threshold is the midpoint of the cut (equal scores are never split); ties between cuts go to the first."""
    order = scores.argsort(dim=1, descending=True, stable=True)
    ranked = scores.gather(1, order).double()
    hits = positive.gather(1, order).long()
    n_pos, n_neg = hits.sum(1, keepdim=True), (1 - hits).sum(1, keepdim=True)
    # J = tp/P - fp/N at a cut after position k (the first k+1 called matches), compared exactly as tp N - fp P
    gain = hits.cumsum(1) * n_neg - (1 - hits).cumsum(1) * n_pos
    cut_ok = torch.ones_like(gain, dtype=torch.bool)
    cut_ok[:, :-1] = ranked[:, :-1] > ranked[:, 1:]  # a cut between equal scores is no threshold
    best = gain.masked_fill(~cut_ok, torch.iinfo(gain.dtype).min).argmax(dim=1)  # [b], the first best
    j = gain.double() / (n_pos * n_neg).double()
    above = ranked.gather(1, best[:, None])[:, 0]
    below = ranked.gather(1, (best + 1).clamp(max=ranked.shape[1] - 1)[:, None])[:, 0]
    below = torch.where(best + 1 < ranked.shape[1], below, above - 1.0)
    return (above + below) / 2, j.gather(1, best[:, None])[:, 0]


def youden_at(scores: torch.Tensor, positive: torch.Tensor, threshold: float) -> torch.Tensor:
    """[b] Youden's J of each row at one shared `threshold`."""
    called = scores >= threshold
    tpr = (called & positive).sum(1).double() / positive.sum(1).double()
    fpr = (called & ~positive).sum(1).double() / (~positive).sum(1).double()
    return tpr - fpr


def threshold_spread(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int | None = None
                     ) -> dict[str, float]:
    """Does one global similarity threshold separate matches from non-matches equally well for every query?
    For image queries over all texts (i2t) and text queries over all images (t2i): the spread of the
    per-query best thresholds (std, interquartile range), and the mean Youden's J at each query's own best
    threshold against the mean J at one shared threshold (their median). A loss that pins every score to
    one constant (the symmetric softmax, as PMI) should give a small spread and a small J loss."""
    out: dict[str, float] = {}
    directions = {"i2t": (img, txt, lambda rows: text_to_image[None, :] == rows[:, None]),
                  "t2i": (txt, img, lambda rows: torch.arange(len(img))[None, :] == text_to_image[rows][:, None])}
    for name, (queries, gallery, positives) in directions.items():
        step = _rows_per_block(len(gallery), chunk)

        def blocks(queries=queries, gallery=gallery, positives=positives, step=step):
            """(scores, positive) of each block of the queries that have a match and a non-match."""
            for start in range(0, len(queries), step):
                rows = torch.arange(start, min(start + step, len(queries)))
                positive = positives(rows)
                usable = positive.any(1) & (~positive).any(1)
                yield queries[rows][usable].float() @ gallery.float().T, positive[usable]

        # two passes over bounded blocks: the shared threshold needs every query's own first
        t, own_j = (torch.cat(part) for part in zip(*(best_thresholds(s, p) for s, p in blocks())))
        if not len(t):
            continue
        shared = float(t.median())
        shared_j = [youden_at(s, p, shared) for s, p in blocks()]
        q1, q3 = torch.quantile(t, torch.tensor([0.25, 0.75], dtype=t.dtype)).tolist()
        out |= {f"{name}_threshold_std": float(t.std(unbiased=False)), f"{name}_threshold_iqr": q3 - q1,
                f"{name}_threshold_median": shared, f"{name}_youden_own": float(own_j.mean()),
                f"{name}_youden_shared": float(torch.cat(shared_j).mean())}
    return out


ECE_BINS = 15  # Guo et al. 2017


def probabilities(logits: torch.Tensor, head: str = "softmax") -> torch.Tensor:
    """[N, C] class probabilities of the logits under the model's scoring head: `softmax` over the classes
    (CLIP, ALIGN), or `sigmoid`, each (image, class) pair on its own (SigLIP and sigmoid-trained models: a row
    need not sum to 1)."""
    return torch.softmax(logits.double(), dim=1) if head == "softmax" else torch.sigmoid(logits.double())


def reliability(logits: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS, head: str = "softmax") -> dict:
    """Confidence (the top probability of `logits` [N, C] under `head`: `probabilities`) against accuracy, in
    `bins` equal-width bins over (0, 1] (bin m holds confidences in (m/M, (m+1)/M]): per bin its count, mean
    confidence and accuracy, and the expected calibration error ECE = sum_m |B_m|/N * |acc(B_m) - conf(B_m)|."""
    probs = probabilities(logits, head)
    confidence, predicted = probs.max(dim=1)
    correct = (predicted == labels).double()
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    count = torch.bincount(index, minlength=bins).double()
    conf_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, confidence)
    acc_sum = torch.zeros(bins, dtype=torch.float64).index_add_(0, index, correct)
    ece = float((acc_sum - conf_sum).abs().sum() / max(1, len(labels)))
    used = count > 0
    return {"ece": ece, "count": count.long().tolist(),
            "confidence": torch.where(used, conf_sum / count.clamp(min=1), torch.nan).tolist(),
            "accuracy": torch.where(used, acc_sum / count.clamp(min=1), torch.nan).tolist()}


def nll(logits: torch.Tensor, labels: torch.Tensor, head: str = "softmax") -> float:
    """Mean negative log-likelihood of the labels per image: under softmax(logits); or, for the `sigmoid` head,
    of every (image, class) pair's own answer (its class: yes, the others: no), summed over the classes as
    SigLIP's loss sums them."""
    if head == "softmax":
        return float(torch.nn.functional.cross_entropy(logits.double(), labels))
    return float(_pair_nll(logits.double(), labels))


def _pair_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    target = torch.nn.functional.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(labels)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Temperature scaling (Guo et al. 2017): the T > 0 minimizing the NLL of softmax(logits / T), by L-BFGS
    on log T in fp64 (the NLL is convex in 1/T, so the optimum is unique)."""
    logits = logits.double()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    _minimize([log_t], lambda: torch.nn.functional.cross_entropy(logits / log_t.exp(), labels))
    return float(log_t.detach().exp())


def _minimize(params: list[torch.Tensor], loss: Callable[[], torch.Tensor]) -> None:
    """`params` moved to a minimum of `loss()` by L-BFGS with a strong Wolfe line search (fp64, tight tolerances)."""
    optimizer = torch.optim.LBFGS(params, lr=0.5, max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        value = loss()
        value.backward()
        return value

    optimizer.step(closure)


def fit_sigmoid(cosines: torch.Tensor, labels: torch.Tensor, temperature: float, bias: float) -> tuple[float, float]:
    """The sigmoid head's temperature scaling: the (T > 0, b) minimizing the pair NLL of sigmoid(cos / T + b)
    (Platt scaling of every (image, class) pair), by L-BFGS on (log T, b) in fp64 from the model's own (T, b)."""
    cosines = cosines.double()
    log_t = torch.tensor(math.log(temperature), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(float(bias), dtype=torch.float64, requires_grad=True)
    _minimize([log_t, b], lambda: _pair_nll(cosines / log_t.exp() + b, labels))
    return float(log_t.detach().exp()), float(b.detach())


def knn_predict(train: torch.Tensor, train_labels: torch.Tensor, test: torch.Tensor, k: int = 1,
                n_classes: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """[Q] predicted labels of `test` [Q, D] from its k nearest `train` [N, D] embeddings (cosine).

    k=1 is the paper's ImageNet KNN R@1: the label of the most similar training image; ties go to the
    lower training index (argmax). k>1: neighbours vote with their similarity; the vote's ties go to the
    lower label; ties at the k-th neighbour are broken by torch.topk (deterministic on CPU).

    A non-finite similarity never makes a neighbour; a query with no finite similarity predicts -1, which
    is no label (a miss)."""
    n_classes = n_classes or int(train_labels.max()) + 1
    out = torch.empty(test.shape[0], dtype=torch.long)
    step = _rows_per_block(train.shape[0], chunk)
    for start in range(0, test.shape[0], step):
        sims = test[start:start + step] @ train.T  # [b, N]
        finite = sims.isfinite()
        sims = sims.masked_fill(~finite, float("-inf"))
        if k == 1:
            predicted = train_labels[sims.argmax(dim=1)]
        else:
            top, idx = sims.topk(min(k, train.shape[0]), dim=1)
            top = top.masked_fill(~top.isfinite(), 0.0)  # fewer than k finite neighbours: the rest do not vote
            votes = torch.zeros(len(sims), n_classes, dtype=sims.dtype).scatter_add_(1, train_labels[idx], top)
            predicted = votes.argmax(dim=1)
        out[start:start + step] = predicted.masked_fill(~finite.any(dim=1), -1)
    return out


def bootstrap_spearman(model: list[float], human: list[float], resamples: int = 1000, seed: int = 0
                       ) -> tuple[float, float]:
    """(mean, std) of Spearman's rho over `resamples` bootstrap resamples of the pairs (n drawn with replacement,
    seeded), as Crisscrossed Captions and the paper's Table 3 report it; the std is the sample std (ddof 1) of the
    resampled rhos, the bootstrap's standard error. Ranks are averaged over ties within each resample."""
    import numpy as np
    from scipy.stats import rankdata

    x, y = np.asarray(model, dtype=np.float64), np.asarray(human, dtype=np.float64)
    rows = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    rx, ry = rankdata(x[rows], axis=1), rankdata(y[rows], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of one repeated pair has no correlation
        rho = (rx * ry).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    rho = rho[np.isfinite(rho)]
    if len(rho) < 2:
        return float("nan"), float("nan")
    return float(rho.mean()), float(rho.std(ddof=1))
