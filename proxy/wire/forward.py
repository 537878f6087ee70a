"""Bytes in, bytes out: the upstream leg and the response relay.

Requests go through an httpx *transport* directly (no AsyncClient): nothing between us and the
socket merges cookies, follows redirects or re-encodes bodies, so what we send is exactly what we
chose to send. The relay passes the upstream's raw bytes on as they arrive.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

import httpx
from starlette.types import Send

from proxy.errors import (
    BadPathError,
    ProxyError,
    UpstreamBadResponseError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
)
from proxy.wire.asgi import sse_error_event
from proxy.wire.headers import RawHeaders, header, response_headers

log = logging.getLogger("compactd.forward")


CHAT_PATH = b"/chat/completions"
COMPACTED_PATHS = frozenset({CHAT_PATH, b"/responses", b"/messages"})
"""The routes whose requests are compacted (proxy.dialects.apis): never reachable by spelling."""
_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(string.ascii_letters.encode() + string.digits.encode() + b"-._~")
_TRAILING = bytes(range(33))  # blanks and control characters, NUL included


def route(sub_path: bytes) -> bytes:
    """What a path below /v1 names, for choosing how to handle it.

    Percent-encoded unreserved characters are the characters themselves (RFC 3986 §6.2.2.2), and
    empty segments and a trailing slash are dropped, as most servers do: `/chat/%63ompletions`
    and `/chat/completions/` are the chat route (`/responses/` that of the Responses API), with
    compaction, policy and accounting, not a way around them. A path that only names a compacted
    route once its slashes are decoded, or as a lenient server reads it (any case, `;` parameters
    or trailing blanks and NULs dropped), is refused: forwarded, it could be chat to the upstream
    and not to us.
    """
    if sub_path in COMPACTED_PATHS:
        return sub_path
    plain = _PERCENT.sub(_unreserved, sub_path)
    named = b"/" + b"/".join(s for s in plain.split(b"/") if s)
    if named not in COMPACTED_PATHS and _lenient(_decoded(sub_path)) in COMPACTED_PATHS:
        raise BadPathError("Invalid request path.")
    return named


def _unreserved(m: re.Match[bytes]) -> bytes:
    byte = int(m.group(1), 16)
    return bytes([byte]) if byte in _UNRESERVED else m.group(0)


def _decoded(path: bytes) -> bytes:
    """Fully percent-decoded (a few rounds: some servers decode twice), with `\\` as `/`."""
    for _ in range(3):
        decoded = _PERCENT.sub(lambda m: bytes([int(m.group(1), 16)]), path)
        if decoded == path:
            break
        path = decoded
    return path.replace(b"\\", b"/")


def _lenient(path: bytes) -> bytes:
    """`path` as the most forgiving server would match it: no empty segments, no `;` parameters,
    no trailing blanks or control characters, lower case."""
    segments = (s.partition(b";")[0].rstrip(_TRAILING) for s in path.lower().split(b"/"))
    return b"/" + b"/".join(s for s in segments if s)


@dataclass(frozen=True)
class Timeouts:
    """Upstream timeouts in seconds; `read=None` lets reasoning models stay silent for minutes."""

    connect: float = 10.0
    read: float | None = None
    write: float | None = 60.0
    pool: float | None = 30.0

    def as_extension(self) -> dict[str, float | None]:
        """The `timeout` request extension httpx transports understand."""
        return {"connect": self.connect, "read": self.read, "write": self.write, "pool": self.pool}


def _closed_without_answer(exc: BaseException) -> bool:
    """The upstream accepted the connection, then closed it before any response byte."""
    import aiohttp  # noqa: PLC0415 (installed with httpx-aiohttp; imported only on failure)

    if isinstance(exc.__cause__, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(exc, httpx.RemoteProtocolError) and "without sending" in str(exc)


def upstream_error(exc: BaseException) -> ProxyError:
    """Map a transport failure to 502 (unreachable) or 504 (timed out)."""
    if _closed_without_answer(exc):
        return UpstreamUnreachableError("The upstream closed the connection without answering.")
    cause = exc.__cause__
    # httpx-aiohttp maps all aiohttp connection errors to ConnectTimeout; the cause tells the truth.
    # httpx's own errors have httpcore's as their cause, which are no TimeoutError: their type does.
    from_aiohttp = cause is not None and type(cause).__module__.startswith("aiohttp")
    timed_out = (
        isinstance(cause, TimeoutError) if from_aiohttp else isinstance(exc, httpx.TimeoutException)
    )
    if timed_out:
        return UpstreamTimeoutError(f"The upstream did not answer in time ({type(exc).__name__}).")
    return UpstreamUnreachableError(f"The upstream could not be reached ({type(exc).__name__}).")


class Upstream:
    """The one configured upstream. Its base URL comes from config only (never from a request)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, base_url: str, timeouts: Timeouts):
        base = httpx.URL(base_url)
        self._transport = transport
        self._scheme = base.scheme
        self._host = base.host
        self._port = base.port
        self._base_path = base.raw_path.rstrip(b"/")
        self._timeout = timeouts.as_extension()
        # Built once (httpx.URL is immutable): parsing one costs ~3 % of a small request's CPU.
        self._chat_url = self._build(CHAT_PATH, b"")

    def url(self, sub_path: bytes, query: bytes) -> httpx.URL:
        """Upstream URL for a client path below /v1; refuses paths that could climb out of it,
        however they are encoded (`%2e%2e`, `%2f..%2f`, `..%5c`, double encoding)."""
        if sub_path == CHAT_PATH and not query:
            return self._chat_url
        decoded = _decoded(sub_path)
        if not sub_path.startswith(b"/") or b"\\" in sub_path:
            raise BadPathError("Invalid request path.")
        if any(segment in (b".", b"..") for segment in decoded.split(b"/")):
            raise BadPathError("Invalid request path.")
        return self._build(sub_path, query)

    def _build(self, sub_path: bytes, query: bytes) -> httpx.URL:
        return httpx.URL(
            scheme=self._scheme,
            host=self._host,
            port=self._port,
            raw_path=self._base_path + sub_path + (b"?" + query if query else b""),
        )

    async def send(
        self,
        method: str,
        url: httpx.URL,
        headers: RawHeaders,
        content: bytes | AsyncIterable[bytes],
    ) -> httpx.Response:
        """Send one request and return the response with its body still unread (streamed)."""
        request = httpx.Request(
            method, url, headers=headers, content=content, extensions={"timeout": self._timeout}
        )
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise upstream_error(exc) from exc
        except Exception as exc:
            raise UpstreamBadResponseError(
                f"The upstream's response could not be read ({type(exc).__name__})."
            ) from exc
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _ReadErrors(response.stream)
        return response

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._transport.aclose()


class _ReadErrors(httpx.AsyncByteStream):
    """A response body whose transport's own exceptions surface as httpx.ReadError.

    A transport raises its own types for what it will not parse (aiohttp: a ClientResponseError
    for a response header over its limit). Escaping, they were our plain-text 500; as httpx
    errors they are the upstream failing: a 502 before the response starts, a cut stream after.
    """

    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.HTTPError:
            raise
        except Exception as exc:
            raise httpx.ReadError(f"{type(exc).__name__} while reading the upstream") from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


async def peek(response: httpx.Response, limit: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """Read a response body up to `limit` bytes: (the whole body, None) if it fits, else (b"",
    every chunk, those read included, for `relay`), so a long body is relayed whole."""
    chunks = response.aiter_raw()
    read: list[bytes] = []
    size = 0
    async for chunk in chunks:
        read.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"", _chain(read, chunks)
    await response.aclose()
    return b"".join(read), None


async def _chain(read: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in read:
        yield chunk
    async for chunk in rest:
        yield chunk


MAX_HELD_BYTES = 1 << 20
"""Most bytes of one unfinished SSE event the relay holds back; a longer one goes out as is."""
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\n\r\n")
_COMMENT_LINES = re.compile(rb"(?::[^\r\n]*(?:\r\n|\r|\n))+")


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """SSE bytes as (every complete event, the unfinished one after them). Comment lines that
    begin the unfinished one go out too: they add nothing to it (keep-alives are sent so)."""
    if data.endswith((b"\n\n", b"\n\r")):  # the usual chunk; a blank line ended by CR
        return data, b""
    end = 0
    for sep in _EVENT_ENDS:
        at = data.rfind(sep)
        if at >= 0:
            end = max(end, at + len(sep))
    comments = _COMMENT_LINES.match(data, end)
    if comments is not None:
        end = comments.end()
    if len(data) - end > MAX_HELD_BYTES:
        return data, b""
    return data[:end], data[end:]


def is_event_stream(headers: RawHeaders) -> bool:
    """Whether a response is Server-Sent Events."""
    ctype = header(headers, b"content-type") or b""
    return ctype.startswith(b"text/event-stream")


@dataclass
class RelayResult:
    """What the relay saw, for accounting and logs."""

    status: int
    bytes_sent: int = 0
    error: str | None = None


async def relay(
    send: Send,
    response: httpx.Response,
    extra_headers: RawHeaders,
    tap: Callable[[bytes], bytes] | None = None,
    flush: Callable[[], bytes] | None = None,
    *,
    body: AsyncIterator[bytes] | None = None,
    error_event: bytes | Callable[[], bytes] | None = None,
    reframed: bool = False,
) -> RelayResult:
    """Stream the upstream response to the client as it arrives; always closes the upstream.

    `body`: the response's chunks when the caller already started reading them (see `peek`).
    `reframed`: `tap` changes the body's length, so the upstream's Content-Length is not sent
    (the server frames the body itself).

    A failure after the headers went out cannot change the status: an SSE stream ends with an
    `error` event (never a fake `[DONE]`, which would make a truncated answer look complete;
    `error_event` in the API's own shape, OpenAI's by default; a callable makes it when needed);
    any other body is cut off by raising, so the client sees a broken connection, not a short body.
    So is a compressed (content-encoded) stream: an event appended in plain text would land inside
    the gzip/deflate body and break the client's decompression instead of telling it anything.
    So that the error event is an event of its own, an uncompressed stream's bytes go out one
    complete event at a time (no client acts on part of one), and an event the upstream left
    unfinished is dropped.
    """
    raw = response_headers(response.headers.raw)
    if reframed:
        raw = [(k, v) for k, v in raw if k.lower() != b"content-length"]
    sse = is_event_stream(raw)
    if sse:
        extra_headers = [*extra_headers, (b"x-accel-buffering", b"no")]
    encoded = header(raw, b"content-encoding") not in (None, b"identity")
    whole = sse and not encoded
    held = b""
    result = RelayResult(status=response.status_code)
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": raw + extra_headers,
            }
        )
        async for chunk in body if body is not None else response.aiter_raw():
            out = tap(chunk) if tap is not None else chunk
            if whole:
                out, held = _whole_events(held + out)
            if out:
                result.bytes_sent += len(out)
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except httpx.HTTPError as exc:
        result.error = f"upstream failed mid-response: {type(exc).__name__}"
        log.warning("upstream failed mid-response", extra={"error": type(exc).__name__})
        if not sse or encoded:
            raise UpstreamUnreachableError(result.error) from exc
        event = error_event() if callable(error_event) else error_event
        await send(
            {
                "type": "http.response.body",
                "body": event or sse_error_event("The upstream connection failed mid-stream."),
                "more_body": True,
            }
        )
    finally:
        await response.aclose()
    tail = flush() if flush is not None else b""
    # After an error event, the unfinished event's bytes could only make it part of another.
    tail = b"" if result.error is not None else held + tail
    result.bytes_sent += len(tail)
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return result
