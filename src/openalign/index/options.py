"""The options of `openalign embed`, `openalign index` and a search's query, apart from the code that runs them:
nothing here imports torch or FAISS, so that the commands' `--help` builds its flags from these classes at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from openalign.config import FRACTION_OPEN_CLOSED, NON_NEGATIVE, POSITIVE_INT, Options, at_least, non_negative

__all__ = ["EmbedOptions", "IndexOptions", "Query", "IMAGE_WEIGHT", "TEXT_WEIGHT"]

IMAGE_WEIGHT, TEXT_WEIGHT = 1.0, 2.0  # the paper's image+text query weights


@dataclass(frozen=True)
class EmbedOptions(Options):
    encode_batch: int = 128  # images (and captions) encoded at once
    part_size: int = 8_192  # images per part of a directory or table (a shard is one part): the unit of resuming
    float16: bool = False  # store float16 embeddings (half the size)
    images: str = ""  # image root for a Karpathy JSON or caption table (default: beside it)
    image_column: str = ""  # a table's image column (default: the first of image, filepath, file, path, image_path,
        # url)
    text_column: str = ""  # a table's caption column (default: the first of text, caption, captions, title)
    texts: bool = False  # also embed each row's caption (text-*.npy): text->text search, text indexes
    patches: bool = False  # also store each image's patch vectors (patch-*.npy, float16): search/serve --rerank
    top_patches: int = 0  # > 0: keep only this many patch vectors per image, those of largest norm (less disk)
    device: str = "auto"  # auto: this rank's GPU when there is one, else the CPU


@dataclass(frozen=True)
class IndexOptions(Options):
    kind: Literal["auto", "flat", "ivf", "hnsw"] = "auto"  # auto: exact up to exact_up_to vectors, IVF beyond
    recall: Annotated[float, FRACTION_OPEN_CLOSED] = 0.95  # recall@10 target of approximate indexes, against exact
        # search
    exact_up_to: Annotated[int, NON_NEGATIVE] = 200_000  # auto: exact search up to this many vectors
    codes: Literal["auto", "flat", "sq8", "pq"] = "auto"  # ivf: flat (float32), sq8 (8-bit per dimension), pq;
        # auto: sq8, product quantization beyond max_bytes
    max_bytes: Annotated[int, NON_NEGATIVE] = 8 * 2**30  # ivf auto: 8-bit codes up to this size, product quantization
        # beyond
    nlist: Annotated[int, non_negative("0 (automatic) or more")] = 0  # ivf: k-means cells; 0: 4 sqrt(n) (FAISS's rule
        # of thumb)
    train_per_cell: Annotated[int, at_least(39, "at least 39 (FAISS's floor)")] = 64  # ivf: k-means training points
        # per cell (FAISS warns below 39, caps at 256)
    tune_queries: Annotated[int, POSITIVE_INT] = 1_000  # queries the recall is measured on while tuning
    seed: int = 0  # of the k-means sample and the tuning queries
    vectors: Literal["image", "text"] = "image"  # image, or text (captions embedded by `openalign embed --texts`)
    memory: Annotated[int, NON_NEGATIVE] = 0  # bytes the build may hold (0: no limit); ivf codes beyond half of it:
        # shards on disk
    block_rows: Annotated[int, NON_NEGATIVE] = 0  # ivf shards: rows per shard, one add task each (0: what half the
        # memory holds per worker)
    chunk_rows: Annotated[int, POSITIVE_INT] = 65_536  # rows converted to float32 at a time
    refine: Annotated[int, non_negative("0 (off) or a shortlist factor of 1 or more")] = 0  # ivf/hnsw: re-score refine
        # x k candidates with float16 copies of the vectors (0: off)
    forget_deletions: bool = False  # a rebuild drops the take-downs (`index --delete`) of the index it replaces
        # (default: they stay deleted, found by image)


@dataclass(frozen=True)
class Query:
    text: str = ""  # the text to search for (alone, or added to an image's query)
    image: bytes | None = None  # the encoded image file to search by
    image_id: int | None = None  # an image of the index, by its id, to search by
    plus: tuple[str, ...] = ()  # a text whose embedding is added to the query (repeatable)
    minus: tuple[str, ...] = ()  # a text whose embedding is subtracted from the query (repeatable)
    image_weight: float = IMAGE_WEIGHT  # weight of the image in image+text queries (paper: 1)
    text_weight: float = TEXT_WEIGHT  # weight of the texts in image+text queries (paper: 2)
