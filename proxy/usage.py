"""The upstream's own `usage`: read from a JSON body, or from a side-parsed copy of an SSE stream.

OpenAI streams carry `usage` only when the request set `stream_options.include_usage`; it then
arrives in one extra chunk (`"choices": []` plus `usage`) just before `data: [DONE]`. When
compactd asked for it and the client did not, `SSEUsageTap(strip_usage_chunk=True)` removes that
chunk so the client receives the stream it asked for.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

_EOL = re.compile(rb"\r\n|\r|\n")
_USAGE_KEY = b'"usage"'
_USAGE_NULL = b'"usage":null'
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true}'
# zlib with 32 + MAX_WBITS accepts both gzip and zlib-wrapped deflate streams.
_AUTO_WBITS = 32 + zlib.MAX_WBITS


@dataclass(frozen=True)
class Usage:
    """Tokens the upstream billed for one response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """`prompt_tokens_details.cached_tokens`: the part of the prompt read from the prompt cache."""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_of(obj: object) -> Usage | None:
    """The `usage` of a parsed response or chunk, or None if it carries none."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(cached),
    )


def _decoder(content_encoding: str) -> Any:
    enc = content_encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(_AUTO_WBITS)
    raise ValueError(f"cannot read usage through content-encoding {content_encoding!r}")


def usage_from_json(body: bytes, content_encoding: str = "") -> Usage | None:
    """The `usage` of a complete JSON response body (gzip/deflate decoded), or None."""
    try:
        decoder = _decoder(content_encoding)
        if decoder is not None:
            body = decoder.decompress(body) + decoder.flush()
    except (ValueError, zlib.error):
        return None
    if _USAGE_KEY not in body:
        return None
    try:
        return usage_of(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


def inject_include_usage(body: dict[str, Any]) -> bool:
    """Ask a streaming request for usage; True if added (the caller must then strip the chunk)."""
    if body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if options is None:
        body["stream_options"] = {"include_usage": True}
        return True
    if isinstance(options, dict) and options.get("include_usage") is not True:
        body["stream_options"] = {**options, "include_usage": True}
        return True
    return False


def include_usage_bytes(raw: bytes, body: Mapping[str, Any]) -> bytes | None:
    """`raw` with include_usage inserted as its first key, every other byte kept; else None.

    For requests otherwise forwarded unchanged: inserting beats re-serializing, which would
    change the bytes of everything else. Only done when `stream_options` is absent.
    """
    if body.get("stream") is not True or "stream_options" in body:
        return None
    start = raw.find(b"{")
    if start < 0 or raw[:start].strip():
        return None
    rest = raw[start + 1 :]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return raw[: start + 1] + _INCLUDE_USAGE + sep + rest


def _without_usage_null(event: bytes) -> bytes:
    # Only the compact form, and only when unambiguous: one occurrence, next to a comma.
    if event.count(_USAGE_NULL) != 1:
        return event
    for form in (b"," + _USAGE_NULL, _USAGE_NULL + b","):
        if event.count(form) == 1:
            return event.replace(form, b"", 1)
    return event


class SSEUsageTap:
    """Reads `usage` from a copy of an SSE stream; optionally removes the usage-only chunk.

    `feed` returns the bytes to send to the client now. Without stripping that is the chunk
    itself, untouched. With stripping, bytes are released one complete event at a time (only an
    incomplete trailing event is held back, never reordered) and the usage-only event is
    dropped; `close` releases whatever is left. `strip_usage_null` also removes the
    `"usage":null` that OpenAI adds to every other chunk once include_usage is set.
    """

    def __init__(
        self,
        *,
        strip_usage_chunk: bool = False,
        strip_usage_null: bool = False,
        content_encoding: str = "",
    ) -> None:
        self._decoder = _decoder(content_encoding)
        if strip_usage_chunk and self._decoder is not None:
            raise ValueError("cannot strip a chunk from a compressed stream; ask for identity")
        self._strip = strip_usage_chunk
        self._strip_null = strip_usage_chunk and strip_usage_null
        self._buf = bytearray()
        self._pos = 0  # start of the first line of _buf not yet terminated
        self._data: list[bytes] = []
        self._closed = False
        self.usage: Usage | None = None
        """The last `usage` seen in the stream."""
        self.stripped = False
        """The usage-only chunk was removed."""

    def feed(self, chunk: bytes) -> bytes:
        """Parse a copy of `chunk`; return the bytes to forward now."""
        if self._decoder is not None:
            try:
                self._buf += self._decoder.decompress(chunk)
            except zlib.error:
                self._decoder, self._buf, self._data = None, bytearray(), []
                self._closed = True  # unreadable: stop parsing, keep forwarding
        elif not self._closed:
            self._buf += chunk
        if self._closed:
            return chunk
        out = self._scan(final=False)
        return out if self._strip else chunk

    def close(self) -> bytes:
        """End of stream: the held-back bytes (strip mode), after a last look for usage."""
        if self._closed:
            return b""
        self._closed = True
        if self._decoder is not None:
            try:
                self._buf += self._decoder.flush()
            except zlib.error:
                return b""
        out = self._scan(final=True)
        tail = bytes(self._buf)
        if tail[self._pos :]:
            self._field(tail[self._pos :])
        # An unterminated last event is never dropped: only read for usage.
        self._dispatch()
        self._buf = bytearray()
        return out + tail if self._strip else b""

    def _scan(self, *, final: bool) -> bytes:
        buf = self._buf
        out = bytearray()
        start = 0
        pos = self._pos
        while (m := _EOL.search(buf, pos)) is not None:
            if not final and m.end() == len(buf) and m.group() == b"\r":
                break  # a trailing CR may be the first half of CRLF: wait for the next byte
            line = bytes(buf[pos : m.start()])
            pos = m.end()
            if line:
                self._field(line)
                continue
            event = bytes(buf[start:pos])
            start = pos
            keep = self._dispatch()
            if self._strip and keep:
                out += _without_usage_null(event) if self._strip_null else event
        del buf[:start]
        self._pos = pos - start
        return bytes(out)

    def _field(self, line: bytes) -> None:
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            self._data.append(b"")

    def _dispatch(self) -> bool:
        """Finish the current event; False if it is the usage-only chunk to be stripped."""
        data = b"\n".join(self._data)
        self._data = []
        if _USAGE_KEY not in data:
            return True
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return True
        usage = usage_of(obj)
        if usage is None:
            return True
        self.usage = usage
        if self._strip and isinstance(obj, dict) and obj.get("choices") == []:
            self.stripped = True
            return False
        return True
