"""Image dimensions from the first bytes of an inline (data: URL) image.

OpenAI bills an image by its size, so counting needs width and height. Only the header is decoded
(PNG, GIF, WebP, JPEG); anything else, or an image behind an http(s) URL, is reported unknown.
"""

from __future__ import annotations

import base64
import binascii
import struct

# JPEG puts its size in the SOF segment, after EXIF/ICC blocks that can run to tens of KB.
_MAX_HEADER_CHARS = 256 * 1024
_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image's leading bytes, or None if the format is not recognised."""
    size: tuple[int, int] | None = None
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        size = struct.unpack(">II", data[16:24])
    elif data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        size = struct.unpack("<HH", data[6:10])
    elif data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        size = _webp_size(data)
    elif data.startswith(b"\xff\xd8"):
        size = _jpeg_size(data)
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def data_url_size(url: str) -> tuple[int, int] | None:
    """(width, height) of a base64 `data:` URL image, decoding only its header."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 256)
    if comma < 0 or ";base64" not in url[:comma]:
        return None
    chunk = url[comma + 1 : comma + 1 + _MAX_HEADER_CHARS]
    chunk = chunk[: len(chunk) - len(chunk) % 4]
    try:
        return image_size(base64.b64decode(chunk))
    except (binascii.Error, ValueError, struct.error):
        return None
