"""`openalign serve`: the index behind an HTTP API and a web page (FastAPI; uvicorn runs it).

    GET  /                 the search page (static HTML/JS/CSS, no build step)
    POST /search           JSON: text, image (base64 file bytes) or image_id, plus, minus, weights, k
    GET  /image/{id}       a JPEG thumbnail of an indexed image (?size=256), from its file or its shard
    GET  /health           counts and the index's kind
    GET  /docs             the OpenAPI documentation

Every request carries its own parameters; the app holds only read-only state (model, index, metadata),
so concurrent requests cannot interfere. One client cannot knock it over:
- a request body is limited in bytes on the wire, before anything parses it (`BodyLimit`: 413);
- every text is at most `max_text_chars` characters and a query has at most `max_terms` plus/minus
  texts, so the tokenization work of one request is bounded;
- weights must be finite numbers (Python's JSON parser accepts NaN and Infinity);
- uploads are limited in bytes and pixels; a corrupt or non-image upload gets a 400 that says what is wrong;
- validation errors name the field and the rule, never echo the input back.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from typing import Annotated

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from openalign.config import ConfigError
from openalign.data import images as image_lib
from openalign.data.sources import SOURCES
from openalign.index import build, search

STATIC = Path(__file__).parent / "static"


MAX_TEXT_CHARS = 1_000  # per text (query, plus or minus term); the tokenizer keeps 64 tokens of it anyway
MAX_TERMS = 8  # plus + minus texts


@dataclass(frozen=True)
class Limits:
    max_upload_bytes: int = 10 * 2**20  # largest query image accepted, e.g. 10M
    max_pixels: int = 40_000_000  # largest query image in pixels
    max_k: int = 200  # most results one request may ask for
    max_terms: int = MAX_TERMS  # most plus/minus texts in one query

    @property
    def max_body_bytes(self) -> int:
        """The largest request body: a base64 upload (4/3 of its bytes) plus room for the JSON around it."""
        return self.max_upload_bytes * 4 // 3 + 64 * 1024


Term = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class SearchRequest(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # NaN / Infinity weights: a 422 that says so

    text: str = Field("", max_length=MAX_TEXT_CHARS, description="a text query (with an image: added like a plus term)")
    image: str | None = Field(None, description="an image file's bytes, base64-encoded")
    image_id: int | None = Field(None, description="an indexed image as the query, by id")
    plus: list[Term] = Field(default_factory=list, max_length=MAX_TERMS, description="texts added to the query")
    minus: list[Term] = Field(default_factory=list, max_length=MAX_TERMS, description="texts subtracted from the query")
    text_weight: float = Field(search.TEXT_WEIGHT, ge=0, le=100, description="weight of texts next to an image (paper: 2)")
    image_weight: float = Field(search.IMAGE_WEIGHT, ge=0, le=100, description="weight of the image (paper: 1)")
    k: int = Field(24, ge=1)
    min_score: float | None = Field(None, ge=-1, le=1, description="leave out results scoring below this cosine "
                                    "(default: the server's --min-score, if any)")
    rerank: int = Field(0, ge=0, description="re-order the top K by late interaction (a text query alone; the "
                                             "index's embeddings need patch vectors: `openalign embed --patches`)")


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 before the app reads it whole.

    A declared Content-Length over the limit is refused without reading a byte; a body sent without one
    (chunked) is counted as it arrives and refused at the first chunk past the limit. So a 1 GB body costs
    the server at most `max_bytes` of memory, not the 2+ GB of parsing it."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(send)
        seen, started, refused = 0, False, False

        async def counted_receive():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # answer now; the app then sees a client that went away
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            if refused:
                return  # the 413 has been sent: whatever the app answers to the disconnect is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted_receive, tracked_send)

    async def _refuse(self, send):
        await JSONResponse({"detail": f"the request body is larger than {self.max_bytes:,} bytes"}, 413)(
            {"type": "http"}, None, send)


async def _validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    """422 naming each bad field and its rule; unlike FastAPI's default, never the (unbounded) input."""
    details = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:200], "type": e.get("type", "")}
               for e in err.errors()[:10]]
    return JSONResponse({"detail": details}, 422)


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
    min_score: float | None = None  # the score floor applied, if any
    rerank: int = 0  # the shortlist re-ordered by late interaction (0: none); scores are then its scores


def _decode_upload(data: str, limits: Limits) -> bytes:
    if len(data) > limits.max_upload_bytes * 4 // 3 + 4:
        raise HTTPException(413, f"the image is larger than {limits.max_upload_bytes // 2**20} MiB")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPException(400, "image must be the file's bytes in base64") from None
    try:
        image_lib.probe(raw, limits.max_pixels)
    except image_lib.BadImage as err:
        reason = {"too_many_pixels": f"the image has more than {limits.max_pixels:,} pixels",
                  "empty": "the upload is empty"}.get(err.reason, "the upload is not a readable image")
        raise HTTPException(413 if err.reason == "too_many_pixels" else 400, reason) from None
    return raw


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


def create_app(index_dir: Path, model_dir: str | None = None, limits: Limits = Limits(),
               min_score: str | float | None = None, hosts: list[str] | None = None) -> FastAPI:
    """The app over one index; `min_score` is the default score floor (a number or eval's metrics JSON); `hosts`:
    the Host header values answered (allowed_hosts; None: any, as a test client sends)."""
    index = build.load(Path(index_dir))
    model, tokenizer = search.load_model_for(index, model_dir)
    default_floor = search.min_score(min_score, index.info.get("weights"))
    state: dict = {}  # the patch vectors, memory-mapped at the first re-ranking request
    state_lock = threading.Lock()  # request threads race to that first request
    app = FastAPI(title="openalign search", version="1",
                  description="Search images by text, by image, and by image plus/minus texts (ALIGN, Section 7).")
    app.state.index_dir = str(index_dir)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    if hosts is not None:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "count": index.index.ntotal, "kind": index.info["kind"], "dim": index.info["dim"]}

    @app.post("/search", response_model=SearchResponse)
    def run_search(request: SearchRequest) -> SearchResponse:
        if len(request.plus) + len(request.minus) > limits.max_terms:
            raise HTTPException(400, f"at most {limits.max_terms} plus/minus terms")
        image = _decode_upload(request.image, limits) if request.image else None
        query = search.Query(text=request.text.strip(), image=image, image_id=request.image_id,
                             plus=tuple(t.strip() for t in request.plus if t.strip()),
                             minus=tuple(t.strip() for t in request.minus if t.strip()),
                             image_weight=request.image_weight, text_weight=request.text_weight)
        try:
            vector = search.query_vector(model, tokenizer, query, index)
        except ConfigError as err:
            raise HTTPException(400, str(err)) from None
        floor = default_floor if request.min_score is None else request.min_score
        k = min(request.k, limits.max_k)
        if request.rerank > limits.max_k:
            raise HTTPException(400, f"rerank shortlists at most {limits.max_k} results")
        hits = search.search(index, vector, max(k, request.rerank), floor)
        if request.rerank:
            try:
                with state_lock:
                    if "patches" not in state:
                        state["patches"] = search.patch_store(index)
                hits = search.rerank(model, tokenizer, query, hits, state["patches"], k)
            except ConfigError as err:
                raise HTTPException(400, str(err)) from None
        return SearchResponse(count=index.index.ntotal, min_score=floor, rerank=request.rerank, results=[
            Result(rank=h.rank, score=h.score, id=h.id, path=h.meta.get("path"), caption=h.meta.get("caption"),
                   width=h.meta.get("width"), height=h.meta.get("height"), thumbnail=f"/image/{h.id}")
            for h in hits])

    @app.get("/image/{image_id}", responses={200: {"content": {"image/jpeg": {}}}})
    def thumbnail(image_id: int, size: int = 256) -> Response:
        if not 0 <= image_id < len(index.meta):
            raise HTTPException(404, f"no image with id {image_id}")
        row = index.meta.row(image_id)
        path, key = row["path"], row["key"]
        if not path or os.path.realpath(path) != path:  # resolved when embedded: a link swapped in since is refused
            raise HTTPException(404, f"image {image_id} has moved since it was indexed")
        try:  # the one reader of files and tar members (data/sources.py: safe across request threads)
            image = image_lib.load_rgb(SOURCES.read(path, key if path.endswith(".tar") else None))
        except (OSError, image_lib.BadImage):  # never the server's paths in an answer
            raise HTTPException(404, f"image {image_id} can no longer be read") from None
        image.thumbnail((max(16, min(size, 1024)),) * 2)
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=85)
        return Response(buf.getvalue(), media_type="image/jpeg", headers={"Cache-Control": "max-age=3600"})

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
