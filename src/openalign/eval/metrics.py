"""Retrieval and classification metrics as pure functions of embeddings (numpy-free torch math).

Ranks are 0-based and ties count against the query: the rank of a target is the number of *wrong*
candidates scoring at least as high as it (so a constant model gets chance-or-worse, never luck).
Image->text: an image's hit is its best-scoring caption (any of its captions counts).
"""

from __future__ import annotations

import torch

KS = (1, 5, 10)
TASK_PREFIXES = ("zeroshot_", "knn_", "linear_probe_")  # retrieval keys are bare (DESIGN.md)


def chance_key(key: str) -> str:
    """Where the chance level of a metric is stored: `chance_i2t_r10`, `zeroshot_chance_top1`, `knn_chance_top1`."""
    for prefix in TASK_PREFIXES:
        if key.startswith(prefix):
            return prefix + "chance_" + key[len(prefix):]
    return f"chance_{key}"


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


def i2t_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int | None = None
              ) -> torch.Tensor:
    """[N] rank of each image's best caption among all M texts. img [N, D], txt [M, D], text_to_image [M].

    Works in blocks of image rows (about 64 MiB of scores each); an image's own captions are found by
    index (gather), so no [N, M] mask is ever built."""
    n = img.shape[0]
    own = captions_by_image(text_to_image, n)  # [N, c]
    ranks = torch.empty(n, dtype=torch.long)
    step = _rows_per_block(txt.shape[0], chunk)
    for start in range(0, n, step):
        sims = img[start:start + step] @ txt.T  # [b, M]
        idx = own[start:start + step]  # [b, c]
        valid = idx >= 0
        own_scores = sims.gather(1, idx.clamp(min=0)).masked_fill(~valid, float("-inf"))  # [b, c]
        best = own_scores.max(dim=1, keepdim=True).values  # [b, 1]
        # wrong candidates at least as good as the best own caption = all such - own such
        ranks[start:start + step] = count_at_least(sims, best) - ((own_scores >= best) & valid).sum(dim=1)
    return ranks


def t2i_ranks(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor, chunk: int | None = None
              ) -> torch.Tensor:
    """[M] rank of each text's image among all N images."""
    m = txt.shape[0]
    ranks = torch.empty(m, dtype=torch.long)
    step = _rows_per_block(img.shape[0], chunk)
    for start in range(0, m, step):
        sims = txt[start:start + step] @ img.T  # [b, N]
        target = text_to_image[start:start + step]  # [b]
        score = sims.gather(1, target[:, None])  # [b, 1], from the same matrix: ties are exact
        ranks[start:start + step] = count_at_least(sims, score) - 1
    return ranks


def recalls(ranks: torch.Tensor, prefix: str, ks=KS) -> dict[str, float]:
    out = {f"{prefix}_r{k}": float((ranks < k).float().mean()) for k in ks}
    out[f"{prefix}_median_rank"] = float(ranks.float().median() + 1)  # 1-based, as papers report it
    return out


def retrieval_metrics(img: torch.Tensor, txt: torch.Tensor, text_to_image: torch.Tensor) -> dict[str, float]:
    """The DESIGN.md keys: i2t_r1/5/10, t2i_r1/5/10, mean_recall, plus median ranks and counts."""
    metrics = recalls(i2t_ranks(img, txt, text_to_image), "i2t") | recalls(t2i_ranks(img, txt, text_to_image), "t2i")
    metrics["mean_recall"] = sum(metrics[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in KS) / (2 * len(KS))
    return metrics | {"n_images": img.shape[0], "n_texts": txt.shape[0]}


def retrieval_chance(text_to_image: torch.Tensor, n_images: int, ks=KS) -> dict[str, float]:
    """Expected recalls of a random ranking (image->text: P(any of its c captions in the top K of M))."""
    m = len(text_to_image)
    captions = torch.bincount(text_to_image, minlength=n_images).double()  # [N] c per image
    out = {}
    for k in ks:
        miss = torch.ones_like(captions)
        for i in range(k):  # P(top K holds none of its c captions) = prod_i (M - c - i) / (M - i)
            miss *= ((m - captions - i) / (m - i)).clamp(min=0)
        out[f"i2t_r{k}"] = float((1 - miss).mean())
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
    """logits [N, C], labels [N]; ties count against (rank = wrong classes scoring >= the true one)."""
    true = logits.gather(1, labels[:, None])  # [N, 1]
    ranks = (logits >= true).sum(dim=1) - 1  # [N]
    return {f"top{k}": float((ranks < k).float().mean()) for k in ks}


def knn_predict(train: torch.Tensor, train_labels: torch.Tensor, test: torch.Tensor, k: int = 1,
                n_classes: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """[Q] predicted labels of `test` [Q, D] from its k nearest `train` [N, D] embeddings (cosine).

    k=1 is the paper's ImageNet KNN R@1: the label of the most similar training image; ties go to the
    lower training index (argmax). k>1: neighbours vote with their similarity; the vote's ties go to the
    lower label; ties at the k-th neighbour are broken by torch.topk (deterministic on CPU)."""
    n_classes = n_classes or int(train_labels.max()) + 1
    out = torch.empty(test.shape[0], dtype=torch.long)
    step = _rows_per_block(train.shape[0], chunk)
    for start in range(0, test.shape[0], step):
        sims = test[start:start + step] @ train.T  # [b, N]
        if k == 1:
            out[start:start + step] = train_labels[sims.argmax(dim=1)]
            continue
        top, idx = sims.topk(min(k, train.shape[0]), dim=1)
        votes = torch.zeros(len(sims), n_classes, dtype=sims.dtype).scatter_add_(1, train_labels[idx], top)
        out[start:start + step] = votes.argmax(dim=1)
    return out


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                 l2_grid=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1), val_fraction: float = 0.2, seed: int = 0,
                 max_iter: int = 200) -> dict[str, float]:
    """Multinomial logistic regression on frozen features (full-batch L-BFGS, as CLIP's probe).

    The L2 strength is chosen on a seeded `val_fraction` of the training set (ties: the stronger
    penalty), then the probe is refit on all training features and scored on the test set."""
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(train_x), generator=g)
    n_val = max(1, int(len(train_x) * val_fraction)) if len(train_x) > 1 else 0
    fit_idx, val_idx = perm[n_val:], perm[:n_val]

    def fit(x, y, l2):
        w = torch.zeros(x.shape[1], n_classes, dtype=x.dtype, requires_grad=True)
        b = torch.zeros(n_classes, dtype=x.dtype, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(x @ w + b, y) + l2 * (w * w).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return w.detach(), b.detach()

    best = (-1.0, 0.0)
    for l2 in l2_grid if n_val else l2_grid[-1:]:
        w, b = fit(train_x[fit_idx], train_y[fit_idx], l2)
        acc = float(((train_x[val_idx] @ w + b).argmax(1) == train_y[val_idx]).float().mean()) if n_val else 0.0
        if acc >= best[0]:
            best = (acc, l2)
    w, b = fit(train_x, train_y, best[1])
    return topk_accuracy(test_x @ w + b, test_y) | {"l2": best[1], "val_top1": best[0]}
