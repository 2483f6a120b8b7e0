"""The limits of `openalign serve` on every request, apart from the service's code: nothing here imports FastAPI,
so that `openalign serve --help` builds its flags from this class at once."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits", "MAX_TERMS", "MAX_TEXT_CHARS"]

MAX_TEXT_CHARS = 1_000  # per text (query, plus or minus term); the tokenizer keeps 64 tokens of it anyway
MAX_TERMS = 8  # plus + minus texts


@dataclass(frozen=True)
class Limits:
    max_upload_bytes: int = 10 * 2**20  # largest query image accepted, e.g. 10M
    max_pixels: int = 40_000_000  # largest query image in pixels
    max_k: int = 10_000  # most results one request may ask for (k, num_result_ids)
    max_metadata: int = 200  # /search: the first this many results carry their metadata; the rest, id and score
    max_rerank: int = 200  # largest shortlist re-ordered by late interaction
    max_inline_images: int = 100  # /knn-service and /metadata with_image: images sent inline at most
    max_image_bytes: int = 64 * 2**20  # largest indexed image file read for a thumbnail, e.g. 64M
    max_caption_chars: int = 4_096  # a longer caption is cut to this many characters in an answer (ending in …)
    max_answer_bytes: int = 16 * 2**20  # largest JSON answer of /knn-service and /metadata, e.g. 16M
    max_terms: int = MAX_TERMS  # most plus/minus texts in one query

    @property
    def max_body_bytes(self) -> int:
        """The largest request body: a base64 upload (4/3 of its bytes) plus room for the JSON around it."""
        return self.max_upload_bytes * 4 // 3 + 64 * 1024
