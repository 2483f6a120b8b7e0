"""Appendix A's bucket near-duplicate detector against the exact search it approximates, on the same embeddings.

`openalign dedup --mode embedding` compares every training image with every evaluation image (FAISS flat inner
product); `--mode buckets` compares it only with the evaluation images that share one of its 3-of-10 cluster
buckets. Both decide by cosine > 0.975, so the buckets can only miss duplicates, never invent them: this measures
how many they miss (recall of the exact removals) and what they save (comparisons per training image, seconds),
for several numbers of k-means cells. Image embedding is the same work in both modes and is left out: the
embeddings are generated (unit vectors around 1,000 topics, plus near-copies of evaluation images at cosine
0.95-0.999 and same-topic look-alikes), and scored by the functions the dedup tasks run.

    .venv/bin/python bench/dedup_buckets.py [--train 100000] [--eval 10000] [--dim 640] [--clusters 256,1024,4096]

Writes its table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from _common import write_section


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def embeddings(n_train: int, n_eval: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    topics = unit(rng.normal(size=(1000, dim)))
    around = lambda n, spread: unit(topics[rng.integers(0, 1000, n)] + rng.normal(scale=spread / np.sqrt(dim),  # noqa: E731
                                                                                    size=(n, dim)))
    evaluation = around(n_eval, 1.0)
    train = around(n_train, 1.0)
    copies = n_train // 50  # 2%: near-copies of evaluation images, cosine ~0.95-0.999
    source = rng.integers(0, n_eval, copies)
    noise = rng.uniform(0.05, 0.35, (copies, 1)) * rng.normal(size=(copies, dim)) / np.sqrt(dim)
    train[:copies] = unit(evaluation[source] + noise)
    return train, evaluation


def main() -> None:
    import faiss

    from openalign.pipeline.curation import dedup as dd

    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--eval", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=640)
    parser.add_argument("--clusters", default="256,1024,4096")
    parser.add_argument("--threshold", type=float, default=0.975)
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    faiss.omp_set_num_threads(threads)
    train, evaluation = embeddings(args.train, args.eval, args.dim)

    start = time.perf_counter()
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(evaluation)
    exact_score = flat.search(train, 1)[0][:, 0]
    exact_s = time.perf_counter() - start
    exact = exact_score > args.threshold
    rows = [f"| exact (`--mode embedding`) | — | {args.eval:,} | {int(exact.sum()):,} | 1.000 | {exact_s:.1f} s "
            "| 1.00 |"]
    for k in (int(c) for c in args.clusters.split(",")):
        start = time.perf_counter()
        centroids = dd.kmeans(evaluation, k)
        index = dd.cell_index(dd.nearest_cells(evaluation, centroids, 10), len(centroids))
        setup_s = time.perf_counter() - start
        start = time.perf_counter()
        best, _, compared = dd.bucket_best(train, evaluation, dd.nearest_cells(train, centroids, 10), index, 3)
        score_s = time.perf_counter() - start
        found = np.nan_to_num(best, nan=-2.0) > args.threshold
        assert not (found & ~exact).any(), "the buckets flagged a pair the exact search does not"
        recall = (found & exact).sum() / max(1, exact.sum())
        rows.append(f"| buckets, {k:,} cells (10 nearest, 3 of 10) | {setup_s:.1f} s | {compared.mean():,.0f} | "
                    f"{int(found.sum()):,} | {recall:.3f} | {score_s:.1f} s | {(setup_s + score_s) / exact_s:.2f} |")
        print(rows[-1], flush=True)
    body = "\n".join([
        f"### Near-duplicate buckets (Appendix A) against exact search: {args.train:,} training x {args.eval:,} "
        f"evaluation embeddings, d={args.dim}, cosine > {args.threshold}, {threads} threads",
        "",
        "`.venv/bin/python bench/dedup_buckets.py` (generated unit embeddings around 1,000 topics; 2% of the training "
        "vectors are near-copies of evaluation vectors at cosine 0.95-0.999). Image embedding, the same in both "
        "modes, is not included. Recall: the share of the exact search's removals that the buckets also remove "
        "(they never remove one it does not).",
        "",
        "| mode | k-means + index | comparisons per training image | removed | recall | scoring | time / exact |",
        "|---|---|---|---|---|---|---|", *rows])
    write_section("dedup-buckets", body)
    print(body)


if __name__ == "__main__":
    main()
