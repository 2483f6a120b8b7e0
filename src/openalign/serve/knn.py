"""clip-retrieval's back-end API, over the same indexes as `/search`: its `ClipClient` and front end talk to
`openalign serve` as they talk to `clip-retrieval back`. The shapes follow clip-retrieval's own code
(clip_retrieval/clip_back.py, 2.45.0), not its README.

    POST /knn-service   {text | image (base64) | embedding_input, modality, num_images, num_result_ids,
                         indice_name, deduplicate, ...}  ->  [{id, similarity, caption, image_path, ...}, ...]
    GET  /indices-list  ->  ["name", ...]
    POST /metadata      {ids, indice_name}  ->  [{id, metadata}, ...]

As clip-retrieval does: `num_result_ids` results are searched, near-duplicates among them dropped when
`deduplicate` (cosine above 0.94, connected groups keep their best), and only the first `num_images` carry
metadata; `embedding_input` is searched as given (not normalized). Where it differs:
- `image_url` is refused: this service fetches nothing from the network (send the bytes as `image`);
- the safety model, the violence detector, the aesthetic embeddings and mclip are not part of openalign: the flags
  are accepted and named in the `X-Openalign-Not-Applied` response header, never pretended;
- `text` and `image` together are a combined query (clip-retrieval uses the text alone), weighted by `text_weight`
  and `image_weight` as in `/search` (the paper's 2 and 1); ClipClient itself never sends both;
- `image` (base64) in the answer only when `with_image` is asked (clip-retrieval re-encodes every result's file);
- bad requests get a 4xx with one sentence, as on `/search`, never a 500.
The field-by-field mapping is in docs/search.md.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from openalign.config import ConfigError
from openalign.index import search
from openalign.index.opened import Loaded
from openalign.serve.catalog import Catalog
from openalign.serve.common import (body_schema, capped, decode_upload, parsed_body, read_body, shown_caption,
                                    thumbnail_jpeg)
from openalign.serve.options import MAX_TEXT_CHARS, Limits

DEDUP_THRESHOLD = 0.94  # clip-retrieval's near-duplicate cosine
MAX_DIM = 8_192  # longest embedding_input accepted before it is compared with the index's width


class KnnRequest(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")  # clip-retrieval ignores keys it does not know

    text: str | None = Field(None, max_length=MAX_TEXT_CHARS, description="a text query")
    image: str | None = Field(None, description="an image file's bytes, base64-encoded")
    image_url: str | None = Field(None, description="refused: this service fetches nothing; send `image`")
    embedding_input: list[float] | None = Field(None, max_length=MAX_DIM, description="a query vector, searched as "
                                                "given (clip-retrieval does not normalize it)")
    modality: Literal["image", "text"] = Field("image", description="search the index's image or text vectors")
    num_images: int = Field(40, strict=True, ge=1, description="results that carry metadata (the first ones)")
    num_result_ids: int | None = Field(None, strict=True, ge=1, description="results searched (default: num_images)")
    indice_name: str | None = Field(None, max_length=64, description="which index (default: the first served)")
    deduplicate: bool = Field(False, description="drop near-duplicate results (cosine above 0.94), keeping the best")
    use_safety_model: bool = Field(False, description="not applied here (named in X-Openalign-Not-Applied)")
    use_violence_detector: bool = Field(False, description="not applied here (named in X-Openalign-Not-Applied)")
    use_mclip: bool = Field(False, description="not applied here: the index's own model encodes every text")
    aesthetic_score: int | str | None = Field(None, description="not applied here (named in X-Openalign-Not-Applied)")
    aesthetic_weight: float | str | None = Field(None, description="not applied here")
    text_weight: float = Field(search.TEXT_WEIGHT, strict=True, ge=0, le=100, description="openalign: the text's "
                               "weight when text and image come together (paper: 2)")
    image_weight: float = Field(search.IMAGE_WEIGHT, strict=True, ge=0, le=100,
                                description="openalign: the image's weight (paper: 1)")
    with_image: bool = Field(False, description="openalign: each result with metadata also carries `image`, a "
                             "base64 JPEG thumbnail")


class MetadataRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ids: list[Annotated[int, Field(strict=True)]] = Field(description="row ids from /knn-service")
    indice_name: str | None = Field(None, max_length=64)
    modality: Literal["image", "text"] | None = Field(None, description="openalign: the image or text index's rows")
    with_image: bool = Field(False, description="openalign: also `image`, a base64 JPEG thumbnail")


NOT_APPLIED = "X-Openalign-Not-Applied"


def not_applied(request: KnnRequest) -> list[str]:
    """The flags a request asked for that openalign does not have (clip-retrieval's models around CLIP)."""
    asked = [name for name in ("use_safety_model", "use_violence_detector", "use_mclip") if getattr(request, name)]
    if request.aesthetic_score not in (None, "") and request.aesthetic_weight not in (None, "", 0, 0.0, "0"):
        asked.append("aesthetic_score")
    return asked


def knn_query_vector(collection, index: Loaded, request: KnnRequest, limits: Limits) -> np.ndarray:
    """The vector a clip-retrieval request searches with: its `embedding_input` as given, or its text or image
    encoded as a search query is (index/search.py `query_vector`); a request that is neither is a 400."""
    if request.image_url:
        raise HTTPException(400, "image_url is not supported: this service fetches nothing from the network; send "
                                 "the image file's bytes as `image` (base64)")
    text = (request.text or "").strip()
    if request.embedding_input is not None:
        if text or request.image:
            raise HTTPException(400, "give embedding_input alone, without text or image")
        vector = np.asarray(request.embedding_input, dtype=np.float32)
        if vector.shape != (index.info["dim"],):
            raise HTTPException(400, f"embedding_input has {len(vector)} numbers; this index holds "
                                     f"{index.info['dim']}-dimensional vectors")
        if not np.isfinite(vector).all() or not vector.any():
            raise HTTPException(400, "embedding_input must be a finite, non-zero vector")
        if np.linalg.norm(vector.astype(np.float64)) >= np.finfo(np.float32).max:  # its scores would be infinite
            raise HTTPException(400, "embedding_input is too long a vector: its length must be a finite float32 (the "
                                     "index holds unit vectors; normalize it)")
        return vector
    if not text and not request.image:
        raise HTTPException(400, "a query needs text, image or embedding_input")
    image = decode_upload(request.image, limits) if request.image else None
    query = search.Query(text=text, image=image, image_weight=request.image_weight, text_weight=request.text_weight)
    try:
        return search.query_vector(collection.model, collection.tokenizer, query, index)
    except ConfigError as err:
        raise HTTPException(400, str(err)) from None


def metadata(index: Loaded, image_id: int, row: dict, with_image: bool, limits: Limits) -> dict:
    """One result's metadata as clip-retrieval's columns: caption (cut at `limits.max_caption_chars`), and image_path
    (a file) or tar + member (a shard's image; its bytes are at /image/ID); width and height; with_image: `image`, a
    base64 JPEG thumbnail."""
    path, out = row.get("path") or "", {"caption": shown_caption(row.get("caption"), limits)}
    if row.get("url"):
        out["url"] = row["url"]
    if path.endswith(".tar"):
        out["tar"], out["member"] = path, row.get("key")
    else:
        out["image_path"] = path or None
    out["width"], out["height"] = row.get("width"), row.get("height")
    if with_image:
        try:
            out["image"] = base64.b64encode(thumbnail_jpeg(index, image_id, 512, limits)).decode()
        except HTTPException:  # a file gone since: clip-retrieval too leaves `image` out
            pass
    return out


def knn(catalog: Catalog, request: KnnRequest, limits: Limits) -> list[dict]:
    """The search behind /knn-service (run in a worker thread)."""
    count = request.num_result_ids or request.num_images
    if max(count, request.num_images) > limits.max_k:
        raise HTTPException(400, f"num_result_ids and num_images are at most {limits.max_k:,} on this server")
    if request.with_image and min(count, request.num_images) > limits.max_inline_images:
        raise HTTPException(400, f"with_image sends at most {limits.max_inline_images} images inline: lower "
                                 "num_images, or fetch each from /image/ID")
    try:
        collection = catalog.get(request.indice_name)
        index = collection.current(request.modality)
    except ConfigError as err:
        raise HTTPException(400, str(err)) from None
    vector = knn_query_vector(collection, index, request, limits)
    hits = search.nearest(index, vector, count, metadata=0)
    if request.deduplicate and hits:
        drop = set(search.near_duplicates(search.stored_vectors(index, [h.id for h in hits]), DEDUP_THRESHOLD))
        hits = [h for i, h in enumerate(hits) if i not in drop]
    ids = [h.id for h in hits[:request.num_images]]
    rows = index.meta.take(ids).to_pylist()
    results = []
    for i, hit in enumerate(hits):
        result = metadata(index, hit.id, rows[i], request.with_image, limits) if i < len(rows) else {}
        results.append(result | {"id": hit.id, "similarity": hit.score})
    return capped(results, limits, "num_images")


def add_routes(app: FastAPI, catalog: Catalog, limits: Limits) -> None:
    @app.post("/knn-service", openapi_extra=body_schema(KnnRequest), tags=["clip-retrieval"])
    async def knn_service(http: Request) -> Response:
        body = await read_body(http)
        if body is None:
            return Response(status_code=400)  # nobody reads it
        request = parsed_body(KnnRequest, body)
        results = await run_in_threadpool(knn, catalog, request, limits)
        skipped = not_applied(request)
        return JSONResponse(results, headers={NOT_APPLIED: ", ".join(skipped)} if skipped else None)

    @app.get("/indices-list", tags=["clip-retrieval"])
    def indices_list() -> list[str]:
        return catalog.names

    @app.post("/metadata", openapi_extra=body_schema(MetadataRequest), tags=["clip-retrieval"])
    async def metadata_service(http: Request) -> Response:
        body = await read_body(http)
        if body is None:
            return Response(status_code=400)
        request = parsed_body(MetadataRequest, body)
        return JSONResponse(await run_in_threadpool(_metadata, catalog, request, limits))


def _metadata(catalog: Catalog, request: MetadataRequest, limits: Limits) -> list[dict]:
    request.ids = list(dict.fromkeys(request.ids))  # each id answered once, in the order first asked
    if len(request.ids) > (limits.max_inline_images if request.with_image else limits.max_k):
        raise HTTPException(400, f"at most {limits.max_k:,} ids ({limits.max_inline_images} with with_image)")
    try:
        index = catalog.get(request.indice_name).current(request.modality)
    except ConfigError as err:
        raise HTTPException(400, str(err)) from None
    bad = [i for i in request.ids if not 0 <= i < len(index.meta) or index.is_deleted(i)]
    if bad:
        raise HTTPException(400, f"no image with id {bad[0]} in this index")
    rows = index.meta.take(request.ids).to_pylist()
    return capped([{"id": i, "metadata": metadata(index, i, row, request.with_image, limits)}
                   for i, row in zip(request.ids, rows)], limits, "ids")
