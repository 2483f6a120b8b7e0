"""What the service's two APIs share: the limits on a request, the body-size guard, the 422 that never echoes its
input, an upload's checks, a thumbnail."""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
from typing import Annotated

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError
from starlette.requests import ClientDisconnect

from openalign.data import images as image_lib
from openalign.data.sources import SOURCES, NotAFile, TooLarge
from openalign.index.opened import Loaded
from openalign.serve.options import MAX_TEXT_CHARS, Limits

Term = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


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


async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    """422 naming each bad field and its rule; unlike FastAPI's default, never the (unbounded) input."""
    details = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:200], "type": e.get("type", "")}
               for e in err.errors()[:10]]
    return JSONResponse({"detail": details}, 422)


def decode_upload(data: str, limits: Limits) -> bytes:
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


def thumbnail_jpeg(index: Loaded, image_id: int, size: int = 256, limits: Limits = Limits()) -> bytes:
    """A JPEG thumbnail of an indexed image, from its file or its shard (404 when it is gone). Its bytes come from a
    regular file only and are capped before they are read (`limits.max_image_bytes`): a FIFO, a device or a huge
    file swapped in behind an indexed path is a 404 at once, never a request thread blocked or memory filled."""
    if not 0 <= image_id < len(index.meta) or index.is_deleted(image_id):
        raise HTTPException(404, f"no image with id {image_id}")
    row = index.meta.row(image_id)
    path, key = row["path"], row["key"]
    if not path or os.path.realpath(path) != path:  # resolved when embedded: a link swapped in since is refused
        raise HTTPException(404, f"image {image_id} has moved since it was indexed")
    try:  # the one reader of files and tar members (data/sources.py: safe across request threads)
        data = SOURCES.read(path, key if path.endswith(".tar") else None, limits.max_image_bytes)
        image = image_lib.load_rgb(data, limits.max_pixels)
    except NotAFile:  # never the server's paths in an answer
        raise HTTPException(404, f"image {image_id} is no longer a regular file") from None
    except TooLarge:
        raise HTTPException(404, f"image {image_id} is over {limits.max_image_bytes:,} bytes, the most this service "
                                 "reads for a thumbnail (serve --max-image-bytes)") from None
    except (OSError, image_lib.BadImage):
        raise HTTPException(404, f"image {image_id} can no longer be read") from None
    image.thumbnail((max(16, min(size, 1024)),) * 2)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def shown_caption(caption: str | None, limits: Limits) -> str | None:
    """A caption as an answer carries it: at most `limits.max_caption_chars` characters, a cut one ending in "…"."""
    if caption is None or len(caption) <= limits.max_caption_chars:
        return caption
    return caption[:limits.max_caption_chars - 1] + "…"


def capped(results: list[dict], limits: Limits, fewer: str) -> list[dict]:
    """`results` when their JSON is within `limits.max_answer_bytes` (thumbnails and cut captions counted), else a
    413 that says what to ask for fewer of."""
    size = sum(len(json.dumps(r, ensure_ascii=False)) for r in results)
    if size > limits.max_answer_bytes:
        raise HTTPException(413, f"the answer would be {size / 2**20:,.1f} MiB, over this server's "
                                 f"{limits.max_answer_bytes / 2**20:,.0f} MiB: ask for fewer {fewer}")
    return results


def parsed_body(model, body: bytes):
    """A JSON body whatever its content type (ClipClient sends none, as Flask's `get_json(force=True)` reads it; every
    JSON route reads its body so), validated: a bad one is a 400 or 422 that says what is wrong."""
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HTTPException(400, "the request body is not JSON") from None
    except RecursionError:
        raise HTTPException(400, "the request body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise HTTPException(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as err:  # located in the body, as FastAPI locates its own
        raise RequestValidationError([e | {"loc": ("body", *e.get("loc", ()))} for e in err.errors()]) from None


def body_schema(model) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def read_body(http: Request) -> bytes | None:
    """The request's body; None when the client went away (or BodyLimit refused it: its 413 is already sent)."""
    try:
        return await http.body()
    except ClientDisconnect:
        return None
