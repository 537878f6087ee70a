"""Token estimates for what is not text: images, audio and files in content parts.

OpenAI and Anthropic bill an image by its size, so counting needs width and height: for an inline
(data: URL) image only its header is decoded (PNG, GIF, WebP, JPEG); an image behind an http(s)
URL, or in another format, is charged its rule's maximum. Which rule, and its figures, depend on
the model (`ImageRule`, from the model table). Audio is estimated from its duration and files
from their size, erring high.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Images, OpenAI's tile rule (vision guide, "Calculating costs"): detail "low" is the model's base
# alone; otherwise the image is scaled to fit 2048x2048, then its shortest side to 768, and costs
# the base plus a per-512px-tile figure. An image whose size we cannot read is charged the rule's
# maximum, 2x4 tiles. These are GPT-4o's figures, the table's default.
IMAGE_BASE = 85
IMAGE_PER_TILE = 170
IMAGE_UNKNOWN = IMAGE_BASE + IMAGE_PER_TILE * 8
# OpenAI's patch rule (GPT-4.1-mini/-nano, o4-mini, GPT-5-mini/-nano): 32px patches, at most
# 1536 (a larger image is scaled down to fit), times the model's multiplier; no "low" detail.
_PATCH = 32
_MAX_PATCHES = 1536
# Anthropic (vision docs): (width x height) / 750, once an image is scaled down to a long edge of
# at most 1568 px and the most pixels its size table keeps unscaled (784x1568, ~1.2 MP; 1092x1092
# for a square), so the estimate errs high.
_CLAUDE_PIXELS_PER_TOKEN = 750
_CLAUDE_MAX_EDGE = 1568
_CLAUDE_MAX_PIXELS = 784 * 1568

ImageRuleKind = Literal["tiles", "patches", "pixels"]


@dataclass(frozen=True)
class ImageRule:
    """How a model bills an image: OpenAI's `tiles` (a base and a per-tile figure) or `patches`
    (times a multiplier), or Anthropic's `pixels`."""

    kind: ImageRuleKind = "tiles"
    base: int = IMAGE_BASE
    tile: int = IMAGE_PER_TILE
    multiplier: float = 1.0

    @property
    def unknown(self) -> int:
        """Tokens for an image whose size cannot be read: the rule's maximum."""
        if self.kind == "patches":
            return math.ceil(_MAX_PATCHES * self.multiplier)
        if self.kind == "pixels":
            return math.ceil(_CLAUDE_MAX_PIXELS / _CLAUDE_PIXELS_PER_TOKEN)
        return self.base + self.tile * 8


TILES = ImageRule()
# Audio input is ~10 tokens per second; compressed audio of unknown bitrate is assumed to be a
# low 32 kbit/s, so its duration (and count) errs high.
AUDIO_TOKENS_PER_SECOND = 10
AUDIO_ASSUMED_BYTES_PER_SECOND = 4000
# Files (PDF): text plus a page image, ~1,300 tokens per page at a typical ~8 KB per page.
FILE_BYTES_PER_TOKEN = 6

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


def _tile_tokens(width: int, height: int, rule: ImageRule) -> int:
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    return rule.base + rule.tile * math.ceil(w / 512) * math.ceil(h / 512)


def _patches(width: int, height: int) -> int:
    patches = math.ceil(width / _PATCH) * math.ceil(height / _PATCH)
    if patches > _MAX_PATCHES:
        # The guide's scaling: shrink to the cap's area, then so whole patches cover each side.
        r = math.sqrt(_PATCH * _PATCH * _MAX_PATCHES / (width * height))
        w, h = width * r / _PATCH, height * r / _PATCH
        r *= min(math.floor(w) / w, math.floor(h) / h)
        patches = math.ceil(width * r / _PATCH) * math.ceil(height * r / _PATCH)
    return min(patches, _MAX_PATCHES)


def _pixel_tokens(width: int, height: int) -> int:
    scale = min(
        1.0,
        _CLAUDE_MAX_EDGE / max(width, height),
        math.sqrt(_CLAUDE_MAX_PIXELS / (width * height)),
    )
    return math.ceil(width * scale * height * scale / _CLAUDE_PIXELS_PER_TOKEN)


def image_tokens(width: int, height: int, detail: str = "auto", rule: ImageRule = TILES) -> int:
    """Tokens for one image of the given size, by the model's rule (GPT-4o's tiles by default)."""
    if rule.kind == "patches":
        return math.ceil(_patches(width, height) * rule.multiplier)
    if rule.kind == "pixels":
        return _pixel_tokens(width, height)
    if detail == "low":
        return rule.base
    return _tile_tokens(width, height, rule)


def image_part_tokens(image: Mapping[str, Any], rule: ImageRule = TILES) -> int:
    """Tokens for an `image_url` content part's payload ({"url", "detail"})."""
    detail = str(image.get("detail") or "auto")
    if detail == "low" and rule.kind == "tiles":
        return rule.base
    size = data_url_size(str(image.get("url") or ""))
    return rule.unknown if size is None else image_tokens(*size, detail, rule)


def base64_bytes(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    return len(data) * 3 // 4 - data.count("=", max(0, len(data) - 2))


def audio_tokens(data: str, fmt: str) -> int:
    """Tokens for one base64 audio clip, estimated from its duration."""
    byte_rate = AUDIO_ASSUMED_BYTES_PER_SECOND
    if fmt == "wav" and len(data) >= 44:
        try:
            header = base64.b64decode(data[:44])
        except (binascii.Error, ValueError):
            header = b""
        if header[:4] == b"RIFF":
            byte_rate = int.from_bytes(header[28:32], "little") or byte_rate
    return math.ceil(base64_bytes(data) / byte_rate * AUDIO_TOKENS_PER_SECOND)


def file_data_tokens(file_data: str) -> int:
    """Tokens for an inline file (base64), estimated from its size."""
    return base64_bytes(file_data) // FILE_BYTES_PER_TOKEN
