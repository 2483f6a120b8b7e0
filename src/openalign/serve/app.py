"""`openalign serve`: indexes behind an HTTP API and a web page (FastAPI; uvicorn runs it).

    GET  /                 the search page (static HTML/JS/CSS, no build step)
    POST /search           JSON: text, image (base64 file bytes) or image_id, plus, minus, weights, k; index, modality
    GET  /image/{id}       a JPEG thumbnail of an indexed image (?size=256, ?index=NAME), from its file or its shard
    GET  /health           counts and kinds, per index name
    GET  /docs             the OpenAPI documentation
    POST /knn-service, GET /indices-list, POST /metadata    clip-retrieval's back-end API (knn.py)

The service answers one or more named indexes (catalog.py); each is reloaded at a request boundary when its
index.json changes. Every request carries its own parameters and searches the index as it was when the request
started, so concurrent requests cannot interfere. One client cannot knock it over:
- a request body is limited in bytes on the wire, before anything parses it (`BodyLimit`: 413);
- every text is at most `max_text_chars` characters and a query has at most `max_terms` plus/minus
  texts, so the tokenization work of one request is bounded;
- weights must be finite numbers (Python's JSON parser accepts NaN and Infinity);
- uploads are limited in bytes and pixels; a corrupt or non-image upload gets a 400 that says what is wrong;
- k is at most `max_k` (10,000) and only the first `max_metadata` results carry metadata;
- validation errors name the field and the rule, never echo the input back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from openalign.config import ConfigError
from openalign.index import search
from openalign.serve import knn
from openalign.serve.catalog import Catalog, Collection, parse_specs
from openalign.serve.common import (BodyLimit, Term, body_schema, decode_upload, parsed_body, read_body, shown_caption,
                                    thumbnail_jpeg, validation_error)
from openalign.serve.options import MAX_TERMS, MAX_TEXT_CHARS, Limits

STATIC = Path(__file__).parent / "static"
__all__ = ["Limits", "LOOPBACK", "allowed_hosts", "create_app"]


class SearchRequest(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # NaN / Infinity weights: a 422 that says so

    text: str = Field("", max_length=MAX_TEXT_CHARS, description="a text query (with an image: added like a plus term)")
    image: str | None = Field(None, description="an image file's bytes, base64-encoded")
    image_id: int | None = Field(None, strict=True, description="an indexed image as the query, by id")
    plus: list[Term] = Field(default_factory=list, max_length=MAX_TERMS, description="texts added to the query")
    minus: list[Term] = Field(default_factory=list, max_length=MAX_TERMS, description="texts subtracted from the query")
    # numbers are numbers: strict, so that `true` is no weight of 1.0, nor a k of 1
    text_weight: float = Field(search.TEXT_WEIGHT, strict=True, ge=0, le=100,
                               description="weight of texts next to an image (paper: 2)")
    image_weight: float = Field(search.IMAGE_WEIGHT, strict=True, ge=0, le=100,
                                description="weight of the image (paper: 1)")
    k: int = Field(24, strict=True, ge=1,
                   description="results (at most the server's max_k; the first max_metadata carry metadata)")
    min_score: float | None = Field(None, strict=True, ge=-1, le=1, description="leave out results scoring below this "
                                    "cosine (default: the server's --min-score, if any)")
    rerank: int = Field(0, strict=True, ge=0, description="re-order the top K by late interaction (a text query alone; "
                        "the index's embeddings need patch vectors: `openalign embed --patches`)")
    index: str | None = Field(None, max_length=64, description="which index, by name (default: the first served)")
    modality: Literal["image", "text"] | None = Field(
        None, description="search the name's image vectors or its text vectors (default: image, when it has them)")


class Result(BaseModel):
    rank: int
    score: float
    id: int
    path: str | None = None
    caption: str | None = None
    width: int | None = None
    height: int | None = None
    thumbnail: str


class SearchResponse(BaseModel):
    results: list[Result]
    count: int
    index: str  # the name searched
    modality: str  # its image or text vectors
    min_score: float | None = None  # the score floor applied, if any
    rerank: int = 0  # the shortlist re-ordered by late interaction (0: none); scores are then its scores


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def allowed_hosts(host: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The Host header values the service answers (the rest get 400, so a DNS-rebinding page that resolves its own
    name to this machine reaches nothing): the loopback names; when `host` is not loopback, also the machine's own
    names and addresses (the documented way to share it, `--host 0.0.0.0`, keeps working); plus `extra`."""
    import socket

    names = list(LOOPBACK)
    if host not in LOOPBACK:
        hostname = socket.gethostname()
        names += [hostname, socket.getfqdn()] + ([host] if host not in ("0.0.0.0", "::") else [])
        try:
            names += socket.gethostbyname_ex(hostname)[2]
        except OSError:  # no resolvable own name: the loopback names and --allowed-hosts
            pass
    return list(dict.fromkeys(names + list(extra)))


def collection_of(catalog: Catalog, name: str | None) -> Collection:
    try:
        return catalog.get(name)
    except ConfigError as err:
        raise HTTPException(404, str(err)) from None


def live_index(collection: Collection, modality: str | None):
    """The index a request searches, as it is at this request's start (reloaded if it changed since the last)."""
    try:
        return collection.live(modality)
    except ConfigError as err:
        raise HTTPException(400, str(err)) from None


def current_index(collection: Collection, modality: str | None):
    """The index a request searches, as it is at this request's start, with the name's take-downs applied."""
    try:
        return collection.current(modality)
    except ConfigError as err:
        raise HTTPException(400, str(err)) from None


def create_app(indexes: Path | str | list[str] | Catalog, model_dir: str | None = None, limits: Limits = Limits(),
               min_score: str | float | None = None, hosts: list[str] | None = None) -> FastAPI:
    """The app over one index directory, a list of `catalog.parse_specs` items, or a Catalog; `min_score` is the
    default score floor (a number or eval's metrics JSON); `hosts`: the Host header values answered
    (allowed_hosts; None: any, as a test client sends)."""
    if not isinstance(indexes, Catalog):
        items = [str(indexes)] if isinstance(indexes, (str, Path)) else [str(i) for i in indexes]
        indexes = Catalog(parse_specs(items), model_dir, min_score)
    catalog = indexes
    app = FastAPI(title="openalign search", version="1",
                  description="Search images by text, by image, and by image plus/minus texts (ALIGN, Section 7); "
                              "clip-retrieval's back-end API beside it.")
    app.state.catalog = catalog
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    if hosts is not None:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)

    @app.get("/health")
    def health() -> dict:
        first = catalog.get(None)
        live = first.current(None)
        return {"status": "ok", "count": live.index.ntotal, "kind": live.info["kind"], "dim": live.info["dim"],
                "indices": {name: c.summary() for name, c in catalog.collections.items()}}

    @app.post("/search", response_model=SearchResponse, openapi_extra=body_schema(SearchRequest))
    async def search_service(http: Request) -> Response:
        body = await read_body(http)
        if body is None:
            return Response(status_code=400)  # nobody reads it
        request = parsed_body(SearchRequest, body)  # JSON with any content type, as /knn-service reads it
        return await run_in_threadpool(run_search, request)

    def run_search(request: SearchRequest) -> SearchResponse:
        if len(request.plus) + len(request.minus) > limits.max_terms:
            raise HTTPException(400, f"at most {limits.max_terms} plus/minus terms")
        if request.k > limits.max_k:
            raise HTTPException(400, f"k is at most {limits.max_k:,} on this server")
        if request.rerank > limits.max_rerank:
            raise HTTPException(400, f"rerank shortlists at most {limits.max_rerank} results")
        collection = collection_of(catalog, request.index)
        live = live_index(collection, request.modality)
        index = current_index(collection, request.modality)
        image = decode_upload(request.image, limits) if request.image else None
        query = search.Query(text=request.text.strip(), image=image, image_id=request.image_id,
                             plus=tuple(t.strip() for t in request.plus if t.strip()),
                             minus=tuple(t.strip() for t in request.minus if t.strip()),
                             image_weight=request.image_weight, text_weight=request.text_weight)
        try:
            vector = search.query_vector(collection.model, collection.tokenizer, query, index)
        except ConfigError as err:
            raise HTTPException(400, str(err)) from None
        floor = collection.floor if request.min_score is None else request.min_score
        hits = search.nearest(index, vector, max(request.k, request.rerank), floor, metadata=limits.max_metadata)
        if request.rerank:
            try:
                with collection.state_lock:
                    if "patches" not in live.extras:
                        live.extras["patches"] = search.patch_store(index)
                hits = search.rerank_hits(collection.model, collection.tokenizer, query, hits, live.extras["patches"],
                                     request.k)
            except ConfigError as err:
                raise HTTPException(400, str(err)) from None
        where = "" if collection.name == catalog.names[0] else f"?index={collection.name}"
        where += ("&" if where else "?") + "modality=text" if request.modality == "text" else ""
        return SearchResponse(
            count=index.index.ntotal, index=collection.name, modality=index.info.get("vectors", "image"),
            min_score=floor, rerank=request.rerank, results=[
                Result(rank=h.rank, score=h.score, id=h.id, path=h.meta.get("path"),
                       caption=shown_caption(h.meta.get("caption"), limits),
                       width=h.meta.get("width"), height=h.meta.get("height"), thumbnail=f"/image/{h.id}{where}")
                for h in hits])

    @app.get("/image/{image_id}", responses={200: {"content": {"image/jpeg": {}}}})
    def thumbnail(image_id: int, size: int = 256, index: str | None = None,
                  modality: Literal["image", "text"] | None = None) -> Response:
        loaded = current_index(collection_of(catalog, index), modality)
        return Response(thumbnail_jpeg(loaded, image_id, size, limits), media_type="image/jpeg",
                        headers={"Cache-Control": "max-age=3600"})

    knn.add_routes(app, catalog, limits)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        path = STATIC / name
        if path.parent != STATIC or not path.is_file():
            raise HTTPException(404, "not found")
        return FileResponse(path)

    return app
