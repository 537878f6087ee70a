"""The upstream's own `usage`: read from a JSON body, or from a side-parsed copy of an SSE stream.

OpenAI streams carry `usage` only when the request set `stream_options.include_usage`; it then
arrives in one extra chunk (`"choices": []` plus `usage`) just before `data: [DONE]`. When
compactd asked for it and the client did not, `SSEUsageTap(strip_usage_chunk=True)` removes that
chunk so the client receives the stream it asked for.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.wire.long_events import Skim

_EOL = re.compile(rb"\r\n|\r|\n")
_USAGE_KEY = b'"usage"'
_USAGE_NULL = b'"usage":null'
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
MAX_EVENT_BYTES = 1 << 20
"""Longest SSE event the tap holds (`accounting.max_sse_event_bytes`); a longer one is read
without its long strings (`proxy.wire.long_events`), or passed over."""
MAX_JSON_BYTES = 16 << 20
"""Most bytes a compressed JSON body is inflated to when reading its usage."""
# zlib with 32 + MAX_WBITS accepts both gzip and zlib-wrapped deflate streams.
_AUTO_WBITS = 32 + zlib.MAX_WBITS


@dataclass(frozen=True)
class Usage:
    """Tokens the upstream billed for one response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """`prompt_tokens_details.cached_tokens`: the part of the prompt read from the prompt cache."""
    cache_write_tokens: int = 0
    """The part of the prompt written to the prompt cache (Anthropic bills it above input)."""
    server_tool_uses: int = 0
    """Server tools the upstream ran for the answer (Anthropic's web search and fetch): their
    results are prompt tokens the request never carried."""


UsageReader = Callable[[object, "Usage | None"], "Usage | None"]
"""The usage one parsed event (or body) carries, given what the stream carried before; None if
it carries none. Each API reads its own shape (`proxy.dialects.usage`)."""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_of(
    obj: object, prompt: str = "prompt_tokens", completion: str = "completion_tokens"
) -> Usage | None:
    """The `usage` of a parsed response or chunk, or None if it carries none (`prompt` and
    `completion` name its counters, `input_tokens` and `output_tokens` in the Responses API;
    the cached part is in `<prompt>_details`)."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get(f"{prompt}_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return Usage(
        prompt_tokens=_count(usage.get(prompt)),
        completion_tokens=_count(usage.get(completion)),
        cached_tokens=_count(cached),
    )


def _decoder(content_encoding: str) -> Any:
    enc = content_encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(_AUTO_WBITS)
    raise ValueError(f"cannot read usage through content-encoding {content_encoding!r}")


def chat_usage(obj: object, previous: Usage | None) -> Usage | None:
    """Chat Completions: the `usage` of a response or of the usage chunk."""
    del previous
    return usage_of(obj)


def inflated(body: bytes, content_encoding: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
    """A complete response body decoded (gzip/deflate; identity as it is), or None if it cannot
    be or would inflate past `limit` bytes (a bomb, or far larger than anything we read)."""
    try:
        decoder = _decoder(content_encoding)
        if decoder is None:
            return body
        out: bytes = decoder.decompress(body, limit)
        if decoder.unconsumed_tail:
            return None
        tail: bytes = decoder.flush()
        return out + tail
    except (ValueError, zlib.error):
        return None


def usage_from_json(
    body: bytes, content_encoding: str = "", read: UsageReader = chat_usage
) -> Usage | None:
    """The `usage` of a complete JSON response body (gzip/deflate decoded), or None."""
    decoded = inflated(body, content_encoding)
    if decoded is None:
        return None
    body = decoded
    if _USAGE_KEY not in body:
        return None
    try:
        return read(orjson.loads(body), None)
    except orjson.JSONDecodeError:
        return None


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
        max_event_bytes: int = MAX_EVENT_BYTES,
        read: UsageReader = chat_usage,
    ) -> None:
        if strip_usage_chunk and content_encoding.strip().lower() not in ("", "identity"):
            raise ValueError("cannot strip a chunk from a compressed stream; ask for identity")
        self._strip = strip_usage_chunk
        self._read = read
        self._strip_null = strip_usage_chunk and strip_usage_null
        readable = True
        try:
            self._decoder = _decoder(content_encoding)
        except ValueError:
            # An encoding we cannot read (br, zstd): relay untouched, report no usage.
            self._decoder, readable = None, False
        self._buf = bytearray()
        self._pos = 0  # where to resume looking for the end of the first event in _buf
        self._cr = False  # a CR was seen: use the general line scanner from now on
        self._closed = not readable
        self._max_event = max_event_bytes
        self._skim: Skim | None = None  # the event over the limit now arriving, if any
        self._gave_up = False
        self.usage: Usage | None = None
        """The last `usage` seen in the stream."""
        self.stripped = False
        """The usage-only chunk was removed."""

    def feed(self, chunk: bytes) -> bytes:
        """Parse a copy of `chunk`; return the bytes to forward now."""
        if self._gave_up:
            return chunk
        if self._closed:
            return chunk if not self._strip else b""
        if self._decoder is None:
            out = self._take(chunk)
            return out if self._strip else chunk
        try:  # copy mode: inflated a limit's worth at a time, so memory stays bounded
            data = self._decoder.decompress(chunk, self._max_event + 1)
            self._take(data)
            while self._decoder.unconsumed_tail and not self._closed:
                tail = self._decoder.unconsumed_tail
                self._take(self._decoder.decompress(tail, self._max_event + 1))
        except zlib.error:
            self._buf, self._closed = bytearray(), True  # unreadable: stop looking
        return chunk

    def _take(self, data: bytes) -> bytes:
        """Read the stream's next bytes; what to emit in strip mode."""
        data = self._skimmed(data)
        if not data:
            return b""
        if not self._cr and b"\r" in data:
            self._cr, self._pos = True, 0  # rescan the held event line by line
        if not self._strip and not self._cr and not self._buf:
            # Copy mode, nothing held: most chunks are whole events without a usage object.
            found = _next_usage_object(data, 0)
            if found < 0:
                cut = data.rfind(b"\n\n")
                if cut + 2 != len(data):
                    self._buf += data[cut + 2 :] if cut >= 0 else data
                    self._check_size()
                return b""
            self._buf += data
            self._read_usage(final=False, first=found)  # no second search for what we found
            self._check_size()
            return b""
        self._buf += data
        return self._scan(final=False) + self._check_size()

    def _check_size(self) -> bytes:
        """One event without an end this long is not held: in copy mode on an LF stream it is
        read on without its long strings (the held part is one incomplete event); else the
        tap stops."""
        if len(self._buf) <= self._max_event:
            return b""
        if self._strip or self._cr:
            return self._give_up()
        self._skim = Skim(self._max_event)
        self._skim.feed(bytes(self._buf))
        self._buf, self._pos = bytearray(), 0
        return b""

    def _skimmed(self, data: bytes) -> bytes:
        """`data` after the end of the event over the limit now arriving (b"" while it goes
        on; all of it if there is none)."""
        if self._skim is None:
            return data
        end = self._skim.feed(data)
        if end < 0:
            return b""
        self._read_skimmed()
        return data[end:]

    def _read_skimmed(self) -> None:
        event = self._skim.event() if self._skim is not None else None
        self._skim = None
        if event is not None and _USAGE_OBJECT.search(event):
            self._dispatch(event)

    def _give_up(self) -> bytes:
        """Stop reading the stream; the held bytes (strip mode) go out unchanged."""
        held = bytes(self._buf) if self._strip else b""
        self._buf, self._closed, self._gave_up = bytearray(), True, True
        return held

    def close(self) -> bytes:
        """End of stream: the held-back bytes (strip mode), after a last look for usage."""
        if self._closed:
            return b""
        self._closed = True
        if self._decoder is not None:
            try:
                rest = self._decoder.flush()
            except zlib.error:
                return b""
            self._buf += self._skimmed(rest)
        if self._skim is not None:  # an unterminated last event, read as far as it came
            self._read_skimmed()
        out = self._scan(final=True)
        tail = bytes(self._buf)
        self._buf = bytearray()
        # An unterminated last event is never dropped: only read for usage.
        if _USAGE_OBJECT.search(tail):
            self._dispatch(tail)
        return out + tail if self._strip else b""

    def _scan(self, *, final: bool) -> bytes:
        """Consume every complete event in the buffer; the bytes to emit in strip mode."""
        if not self._strip and not self._cr:
            self._read_usage(final=final)
            return b""
        buf = self._buf
        out = bytearray()
        start = 0
        while (end := self._event_end(start, final=final)) >= 0:
            keep = True
            # Most events carry no usage object: no line splitting, no JSON parsing for them.
            if _USAGE_OBJECT.search(buf, start, end):
                keep = self._dispatch(bytes(buf[start:end]))
            if self._strip and keep:
                event = bytes(buf[start:end])
                out += _without_usage_null(event) if self._strip_null else event
            start = end
        del buf[:start]
        self._pos = max(self._pos - start, 0)
        return bytes(out)

    def _read_usage(self, *, final: bool, first: int = -1) -> None:
        """Copy mode on an LF stream (OpenAI's, Anthropic's): read only the events holding a
        usage object, found with C-speed searches instead of walking every event, and keep only
        the trailing, incomplete event. This is what makes accounting nearly free."""
        buf = self._buf
        done = 0
        found = first if first >= 0 else _next_usage_object(buf, 0)
        while found >= 0:
            start = buf.rfind(b"\n\n", done, found)
            start = done if start < 0 else start + 2
            end = buf.find(b"\n\n", found)
            if end < 0:
                if final:
                    self._dispatch(bytes(buf[start:]))
                del buf[:start]  # the usage event is still arriving: keep it whole
                return
            self._dispatch(bytes(buf[start : end + 2]))
            done = end + 2
            found = _next_usage_object(buf, done)
        cut = buf.rfind(b"\n\n", done)
        del buf[: max(done, cut + 2 if cut >= 0 else 0)]

    def _event_end(self, start: int, *, final: bool) -> int:
        """Offset just past the blank line ending the event at `start`, or -1 if incomplete."""
        buf = self._buf
        if not self._cr:
            # LF-only streams (OpenAI's): an event ends at the first "\n\n" (or a lone blank line).
            if buf[start : start + 1] == b"\n":
                end = start + 1
            else:
                i = buf.find(b"\n\n", max(self._pos, start))
                if i < 0:
                    self._pos = max(start, len(buf) - 1)
                    return -1
                end = i + 2
            self._pos = end
            return end
        pos = max(self._pos, start)  # always the start of a line on this path
        while (m := _EOL.search(buf, pos)) is not None:
            if not final and m.end() == len(buf) and m.group() == b"\r":
                break  # a trailing CR may be the first half of CRLF: wait for the next byte
            blank = m.start() == pos
            pos = m.end()
            if blank:
                self._pos = pos
                return pos
        self._pos = pos
        return -1

    def _dispatch(self, event: bytes) -> bool:
        """Read one event's usage; False if it is the usage-only chunk to be stripped."""
        data = b"\n".join(_data_lines(event))
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return True
        usage = self._read(obj, self.usage)
        if usage is None:
            return True
        self.usage = usage
        if self._strip and isinstance(obj, dict) and obj.get("choices") == []:
            self.stripped = True
            return False
        return True


_AFTER_USAGE_KEY = re.compile(rb"\s*:\s*\{")


def _next_usage_object(buf: bytes | bytearray, start: int) -> int:
    """Offset of the first `"usage": {` from `start`, or -1 (`"usage":null` does not count)."""
    while (at := buf.find(_USAGE_KEY, start)) >= 0:
        if _AFTER_USAGE_KEY.match(buf, at + len(_USAGE_KEY)):
            return at
        start = at + len(_USAGE_KEY)
    return -1


def _data_lines(event: bytes) -> list[bytes]:
    """The values of an event's `data` fields (one optional space after the colon removed)."""
    values = []
    for line in _EOL.split(event) if b"\r" in event else event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            values.append(b"")
    return values
