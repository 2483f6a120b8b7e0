"""Image bytes as the web serves them: probe headers cheaply, classify what is wrong, convert to RGB.

`probe()` reads only the header (size, mode, EXIF orientation) and a few bytes at the end of the file
(truncation), never the whole raster, so ingest stays fast on large corpora. Every defect has a name:

- rejected (the pair cannot be used): `empty` (0 bytes), `unreadable` (not an image Pillow knows),
  `truncated` (the file ends before the format's end marker), `too_many_pixels` (a decompression bomb:
  more pixels than `max_pixels`);
- converted later by `to_rgb()` (the pair is kept and the fact counted): `cmyk`, `palette`,
  `high_bit_depth` (16-bit or float), `alpha` (composited on white, not black), `exif_rotated`
  (width and height are reported as displayed, i.e. after the EXIF rotation).
"""

from __future__ import annotations

import io
import re
import struct
import warnings
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps

__all__ = ["EXTENSIONS", "IMAGE_SUFFIXES", "BadImage", "ImageInfo", "load_rgb", "open_image", "probe", "to_rgb"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")  # files and shard members
EXTENSIONS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp",
              "TIFF": "tif"}  # a format's file suffix (one of IMAGE_SUFFIXES: the readers take it)
REJECT_REASONS = ("empty", "unreadable", "truncated", "too_many_pixels")
CONVERSIONS = ("cmyk", "palette", "high_bit_depth", "alpha", "exif_rotated")
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb threshold
_EXIF_ORIENTATION = 0x0112
_ROTATES_90 = {5, 6, 7, 8}  # EXIF orientations that swap width and height
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


def _stable(err: Exception) -> str:
    """An error's text without the object addresses Pillow puts in it (`<_io.BytesIO object at 0x7f..>`): the
    rejects table says the same on every run and every engine."""
    return re.sub(r"<([\w.]+) object at 0x[0-9a-f]+>", r"<\1>", str(err))


class BadImage(ValueError):
    """The bytes are not a usable image; `reason` is one of REJECT_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class ImageInfo:
    width: int  # as displayed (after EXIF rotation)
    height: int
    format: str  # JPEG, PNG, WEBP, GIF, ...
    mode: str  # Pillow mode before conversion
    conversions: tuple[str, ...] = field(default=())  # subset of CONVERSIONS


def _truncated(data: bytes, fmt: str) -> bool:
    tail = data[-4096:]
    if fmt == "JPEG":
        return b"\xff\xd9" not in tail  # End Of Image marker; small trailers after it are tolerated
    if fmt == "PNG":
        return b"IEND" not in tail[-64:]
    if fmt == "GIF":
        return not data.rstrip(b"\0").endswith(b"\x3b")
    if fmt == "WEBP":
        return len(data) < 8 + int.from_bytes(data[4:8], "little")  # RIFF size field
    return False


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """`Image.open` of encoded bytes (the header read, the raster not yet), with the caller's pixel limit in place
    of Pillow's: Pillow refuses more than twice its MAX_IMAGE_PIXELS before any caller can look, so a
    `--max-pixels` above that opens the image through its format's plugin, as Image.open does, without that check
    (the caller checks its own limit). DecompressionBombError above the caller's limit, as Pillow's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            return Image.open(io.BytesIO(data))
        except Image.DecompressionBombError:
            if Image.MAX_IMAGE_PIXELS is None or max_pixels <= 2 * Image.MAX_IMAGE_PIXELS:
                raise
    Image.init()
    for format_id in Image.ID:  # Image.open's order
        factory, accept = Image.OPEN[format_id]
        verdict = accept(data[:16]) if accept else True
        if not verdict or isinstance(verdict, str):  # a str: "this plugin would, but cannot" (a warning)
            continue
        try:
            image = factory(io.BytesIO(data), "")
        except (SyntaxError, IndexError, TypeError, struct.error):
            continue
        if image.width * image.height > max_pixels:
            raise Image.DecompressionBombError(f"Image size ({image.width * image.height} pixels) exceeds limit of "
                                               f"{max_pixels} pixels")
        return image
    raise Image.UnidentifiedImageError("cannot identify image file")


def probe(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Header-only facts about an encoded image, or `BadImage` saying why it cannot be used."""
    if not data:
        raise BadImage("empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = open_image(data, max_pixels)
            width, height, fmt, mode = image.width, image.height, image.format or "", image.mode
            orientation = image.getexif().get(_EXIF_ORIENTATION, 1) if fmt in ("JPEG", "WEBP", "PNG", "TIFF") else 1
            transparency = "transparency" in image.info
    except Image.DecompressionBombError as err:
        raise BadImage("too_many_pixels", str(err)) from None
    except Exception as err:  # noqa: BLE001 - Pillow raises many types for garbage input
        reason = "truncated" if "truncated" in str(err) else "unreadable"  # PNG: reading EXIF hit the end
        raise BadImage(reason, f"{type(err).__name__}: {_stable(err)}") from None
    if width * height > max_pixels:
        raise BadImage("too_many_pixels", f"{width}x{height} > {max_pixels} pixels")
    if width < 1 or height < 1:
        raise BadImage("unreadable", f"{width}x{height} pixels")
    if _truncated(data, fmt):
        raise BadImage("truncated", f"{fmt} data ends before its end marker")
    conversions = []
    if mode == "CMYK":
        conversions.append("cmyk")
    if mode in ("P", "PA"):
        conversions.append("palette")
    if mode.startswith(("I", "F")):
        conversions.append("high_bit_depth")
    if mode in _ALPHA_MODES or transparency:
        conversions.append("alpha")
    if orientation in _ROTATES_90 or orientation in (2, 3, 4):
        conversions.append("exif_rotated")
    if orientation in _ROTATES_90:
        width, height = height, width
    return ImageInfo(width, height, fmt, mode, tuple(conversions))


def to_rgb(image: Image.Image, alpha: str = "white") -> Image.Image:
    """Upright 8-bit RGB: EXIF rotation applied, 16-bit scaled, CMYK converted, transparency on white (`alpha`
    "drop": the alpha channel dropped, as transformers' processors' convert("RGB") does)."""
    image = ImageOps.exif_transpose(image)
    if image.mode.startswith(("I", "F")):
        array = np.asarray(image, dtype=np.float64)
        peak = array.max(initial=0)
        # 16-bit, 8-bit, [0, 1]
        top = 65535.0 if peak > 255 else 255.0 if peak > 1 or image.mode.startswith("I") else 1.0
        image = Image.fromarray(np.clip(array / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if alpha == "white" and (image.mode in _ALPHA_MODES or (image.mode == "P" and "transparency" in image.info)):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    return image.convert("RGB")


def load_rgb(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, alpha: str = "white") -> Image.Image:
    """Decode fully into upright RGB (to_rgb's `alpha` rule); raises BadImage like `probe`."""
    probe(data, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()
    except Exception as err:  # noqa: BLE001
        raise BadImage("truncated" if "truncated" in str(err) else "unreadable", _stable(err)) from None
    return to_rgb(image, alpha)
