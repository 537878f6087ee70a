"""Bytes in, bytes out: the upstream leg and the response relay.

Requests go through an httpx *transport* directly (no AsyncClient): nothing between us and the
socket merges cookies, follows redirects or re-encodes bodies, so what we send is exactly what we
chose to send. The relay passes the upstream's raw bytes on as they arrive.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass

import httpx
from starlette.types import Send

from proxy.errors import (
    BadPathError,
    ProxyError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
    sse_error_event,
)
from proxy.headers import RawHeaders, header, response_headers

log = logging.getLogger("compactd.forward")


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
    timed_out = (
        isinstance(cause, TimeoutError) if cause else isinstance(exc, httpx.TimeoutException)
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
        self._chat_url = self._build(b"/chat/completions", b"")

    def url(self, sub_path: bytes, query: bytes) -> httpx.URL:
        """Upstream URL for a client path below /v1; refuses paths that could climb out of it."""
        if sub_path == b"/chat/completions" and not query:
            return self._chat_url
        if not sub_path.startswith(b"/") or b"\\" in sub_path:
            raise BadPathError("Invalid request path.")
        segments = sub_path.lower().replace(b"%2e", b".").split(b"/")
        if b".." in segments or b"." in segments:
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
            return await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise upstream_error(exc) from exc

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._transport.aclose()


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
) -> RelayResult:
    """Stream the upstream response to the client as it arrives; always closes the upstream.

    A failure after the headers went out cannot change the status: an SSE stream ends with an
    `error` event (never a fake `[DONE]`, which would make a truncated answer look complete);
    any other body is cut off by raising, so the client sees a broken connection, not a short body.
    """
    raw = response_headers(response.headers.raw)
    sse = is_event_stream(raw)
    if sse:
        extra_headers = [*extra_headers, (b"x-accel-buffering", b"no")]
    result = RelayResult(status=response.status_code)
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": raw + extra_headers,
            }
        )
        async for chunk in response.aiter_raw():
            out = tap(chunk) if tap is not None else chunk
            if out:
                result.bytes_sent += len(out)
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except httpx.HTTPError as exc:
        result.error = f"upstream failed mid-response: {type(exc).__name__}"
        log.warning("upstream failed mid-response", extra={"error": type(exc).__name__})
        if not sse:
            raise UpstreamUnreachableError(result.error) from exc
        await send(
            {
                "type": "http.response.body",
                "body": sse_error_event("The upstream connection failed mid-stream."),
                "more_body": True,
            }
        )
    finally:
        await response.aclose()
    tail = flush() if flush is not None else b""
    result.bytes_sent += len(tail)
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return result
