"""`rerank-cost`: pooled search against late-interaction re-ranking, measured.

A model's embeddings of a collection with patch vectors (`embed --patches`), an exact index, then per text query:
the pooled search, and FILIP's re-rank of the top K (each token's best patch) for several K; and the cost of
embedding one image. From the measured constants, the query count Q* at which re-ranking the top K costs as much as
embedding the collection once (M images): Q* = M t_image / t_rerank(K). The teaching's two-stage argument:
shortlist with the dual encoder, re-rank a few dozen with a scorer that reads both; a fusion pass at 0.1% of the
towers' cost breaks even with the dual encoder at about 900 queries for M = 10,000.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

import openalign
from experiments.failure_modes.options import FailureOptions
from experiments.lab.report import save_figure

NAME = "rerank-cost"


def run(options: FailureOptions, seeds: int, out: Path, progress: bool) -> dict:
    """The measured constants of pooled search and late-interaction re-ranking (one run: timings, not seeds)."""
    model_dir = Path(options.rerank_model)
    if not (model_dir / "config.json").is_file():
        raise openalign.ConfigError(f"rerank-cost needs a model at {model_dir} (run `make demo`, or give "
                                    "rerank_model=DIR)")
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)  # as `search` and `serve` run (the toy parts use one)
    emb, index_dir = out / "rerank-emb", out / "rerank-index"
    start = time.perf_counter()
    embedded = openalign.embed(model_dir, [options.rerank_images], emb, openalign.EmbedOptions(patches=True),
                               progress=progress)
    embed_seconds = time.perf_counter() - start
    openalign.build_index(emb, index_dir)
    index = openalign.open_index(index_dir)
    model = openalign.load(model_dir, device="cpu")
    words = [w for row in index.meta.take(list(range(min(len(index.meta), 400)))).to_pylist()
             for w in (row.get("caption") or "").split()[:3]] or ["image"]
    queries = [" ".join(words[(7 * i) % len(words):(7 * i) % len(words) + 2]) or "image"
               for i in range(options.rerank_queries)]
    pooled, reranks = [], {k: [] for k in options.rerank_shortlists}
    deepest = max(options.rerank_shortlists)
    for text in queries:
        t0 = time.perf_counter()
        openalign.search(index, text, deepest, model=model)
        pooled.append(time.perf_counter() - t0)
        for k in options.rerank_shortlists:
            reranks[k].append(openalign.search(index, text, k, model=model, rerank=k).rerank_ms / 1000)
    fresh = embedded.resumed_parts == 0
    per_image = embed_seconds / max(1, embedded.count) if fresh else None
    median = statistics.median
    result = {"images": embedded.count, "embed_seconds_per_image": per_image, "pooled_seconds": median(pooled),
              "rerank_seconds": {str(k): median(v) for k, v in reranks.items()},
              "patches_per_image": embedded.patches_per_image or None, "queries": len(queries), "threads": threads}
    if per_image:
        result["break_even_queries"] = {str(k): embedded.count * per_image / median(v) for k, v in reranks.items()}
    return result


def figure(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    ks = [int(k) for k in result["rerank_seconds"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [1e3 * result["rerank_seconds"][str(k)] for k in ks], marker="o",
            label="late-interaction re-rank of the top K")
    ax.axhline(1e3 * result["pooled_seconds"], color="k", ls="--", label="pooled search (text encoding + exact scan)")
    ax.set(xscale="log", yscale="log", xlabel="K re-ranked", ylabel="ms per query",
           title=f"per-query cost over {result['images']:,} images")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.grid(alpha=0.3)
    save_figure(fig, path, legend_axes=[ax], legend_size=8)


def reading(result: dict) -> list[str]:
    """How re-ranking grows with K, and whether it stays cheap against the towers (Q* at the largest K against the
    collection's size: re-ranking one query per image costs less than embedding the images once)."""
    seconds = {int(k): v for k, v in result["rerank_seconds"].items()}
    low, high = min(seconds), max(seconds)
    growth = seconds[high] / seconds[low]
    lines = [f"Re-ranking costs {1e3 * seconds[low]:.1f} ms per query at K={low} and {1e3 * seconds[high]:.1f} ms at "
             f"K={high}, against {1e3 * result['pooled_seconds']:.1f} ms for the pooled search: {growth:.1f}x for "
             f"{high / low:g}x the shortlist, "
             + ("slower than K grows (the query's tokens are encoded once; only the patch reads grow)."
                if growth < 0.5 * high / low else "about in proportion to K.")]
    per_image = result["embed_seconds_per_image"]
    if not per_image:
        return lines + ["The embeddings were already on disk, so their cost was not measured in this run."]
    q = result["break_even_queries"][str(high)]
    cheap = q >= result["images"]
    return lines + [f"Embedding one image cost {1e3 * per_image:.1f} ms, so re-ranking the top {high} for {q:,.0f} "
                    f"queries costs one embedding of the {result['images']:,} images: "
                    + ("a query per image re-ranked costs less than the towers' pass over the collection, which is "
                       "the teaching's two-stage design (shortlist with the dual encoder, re-rank with a scorer that "
                       "reads both)." if cheap else
                       "re-ranking is not cheap against the towers here (fewer break-even queries than images).")]


def section(result: dict, options: FailureOptions, seeds: int, out: Path) -> list[str]:
    figure(result, out / "rerank_cost.png")
    lines = ["## Pooled search against late-interaction re-ranking (measured)", "",
             f"{options.rerank_model} over {options.rerank_images}: {result['images']:,} images with "
             f"{result['patches_per_image']} patch vectors each; medians over {result['queries']} text queries on "
             f"this machine ({result['threads']} threads).", "",
             "| | ms per query | queries/s | Q*: queries whose re-ranking costs one embedding of the collection |",
             "|---|---|---|---|",
             f"| pooled search | {1e3 * result['pooled_seconds']:.1f} | {1 / result['pooled_seconds']:.0f} | |"]
    for k, seconds in result["rerank_seconds"].items():
        q = result.get("break_even_queries", {}).get(k)
        lines.append(f"| re-rank the top {k} | {1e3 * seconds:.1f} | {1 / seconds:.0f} | "
                     f"{f'{q:,.0f}' if q else 'embedding not timed (already done)'} |")
    return lines + ["", *reading(result), "", "![per-query cost against K](rerank_cost.png)", ""]
