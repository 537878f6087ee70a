"""The HTTP server's side of compactd's limits: request heads are bounded before they are parsed.

An ASGI app sees a request only once its whole head (request line and headers) has been parsed,
which is too late: httptools grows a header by concatenation, so one unauthenticated 64 MB
header held the worker's CPU for seconds and hundreds of MB of memory. `BoundedHttpToolsProtocol`
counts the bytes and headers of each request head as they arrive and answers a 431 (then closes
the connection) as soon as either passes its limit (`server.max_header_bytes`,
`server.max_headers`): Anthropic-shaped if the request target is one of Anthropic's paths
(`/v1/messages…`, as compactd's other errors there), else OpenAI-shaped. `head_too_large`
checks the same limits in the app, for servers other than ours.

Each response's head (status line and headers) is held until the body's first bytes are written,
or the event loop's next turn (`HeadWithBody`): uvicorn writes the two separately, which made two
sends and two TCP segments of every small answer, and woke the client twice to read one.

A request asking to upgrade to anything but a WebSocket (`curl --http2` on http:// asks for h2c)
is served as the HTTP/1.1 request it also is, body included: httptools skips the body of an
upgrade request, so its head is parsed again without the Upgrade header.

`websocket_protocol` is the WebSocket protocol handed to uvicorn: its real implementation (what
uvicorn's `ws="auto"` picks) is imported when a connection first upgrades, not at start-up, so
a worker that never relays a WebSocket does not hold the `websockets` package (~2.5 MB).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

import httptools
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.app.connection import Deadline
from proxy.config import Settings
from proxy.dialects.apis import is_anthropic
from proxy.dialects.errors import anthropic_error_body
from proxy.errors import (
    HeadersTooLargeError,
    ProxyError,
    RequestTimeoutError,
    TooManyConnectionsError,
)
from proxy.wire.asgi import error_body

LINGER_SECONDS = 2.0
"""How long a refused connection's remaining input is read and discarded before closing."""

KEEP_ALIVE_SECONDS = 75
"""How long an idle client connection is kept open: longer than clients keep theirs (httpx and
the OpenAI Python SDK 5 s, aiohttp 15 s, load balancers around 60 s). Were it equal, a client could
send its next request the instant the server closes the idle connection, and meet a reset
(uvicorn's default is 5 s, httpx's expiry is 5 s: tests/store/test_cluster.py met exactly that
after a 5 s wait)."""


@dataclass(frozen=True)
class HeadLimits:
    """Most bytes in one request head (request line + headers) and most header fields; how long
    a head and a body may take; most open connections of one worker."""

    max_bytes: int = 64 * 1024
    max_headers: int = 100
    head_timeout: float = 60.0
    body_timeout: float = 60.0
    max_connections: int = 800

    def refusal(self) -> HeadersTooLargeError:
        """The error a request over these limits gets."""
        return HeadersTooLargeError(
            f"Request headers exceed the limit of {self.max_bytes} bytes"
            f" or {self.max_headers} fields."
        )


def head_limits(settings: Settings) -> HeadLimits:
    """The limits `[server]` and `[limits]` set."""
    limits = settings.limits
    return HeadLimits(
        settings.server.max_header_bytes,
        settings.server.max_headers,
        head_timeout=limits.head_timeout_seconds,
        body_timeout=limits.body_timeout_seconds,
        max_connections=limits.max_connections,
    )


def head_too_large(scope: Scope, limits: HeadLimits) -> bool:
    """Whether a parsed request's headers are over the limits (the app's own check)."""
    headers = scope["headers"]
    if len(headers) > limits.max_headers:
        return True
    return sum(len(k) + len(v) + 4 for k, v in headers) > limits.max_bytes


def anthropic_target(target: bytes) -> bool:
    """Whether a request target (path and query) is one of Anthropic's paths, whose errors take
    its shape. The target alone decides: the headers are what is refused, and may be cut off."""
    path = target.partition(b"?")[0]
    return path.startswith(b"/v1/") and is_anthropic(path[len(b"/v1") :], ())


_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def refusal_bytes(
    limits: HeadLimits, *, anthropic: bool = False, exc: ProxyError | None = None
) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection (in Anthropic's shape if
    `anthropic`): `exc`, by default the 431 of a head over `limits`."""
    exc = exc or limits.refusal()
    if anthropic:
        body = anthropic_error_body(exc.status, exc.message)
    else:
        body = error_body(exc.message, exc.type, exc.code)
    head = (
        f"HTTP/1.1 {exc.status} {_REASONS.get(exc.status, 'Error')}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeadWithBody:
    """The transport one request's response is written to: its first write (the response head)
    is held until the next (the body's first bytes) and both go out in one send, or until the
    event loop's next turn when no body follows at once (a stream waiting for its first event),
    so no byte is held longer than the step of the task that wrote it. Everything else is the
    connection's transport's."""

    __slots__ = ("_handle", "_held", "_loop", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._handle: asyncio.Handle | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        """Hold the first write; send the held bytes and `data` together with the next."""
        if not self._started:
            self._started = True
            self._held = data
            self._handle = self._loop.call_soon(self.flush)
            return
        if self._held is None:
            self._transport.write(data)
            return
        held, self._held = self._held, None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._transport.writelines((held, data))  # one writev, no copy of a large body

    def flush(self) -> None:
        """Send the held bytes now (the loop's next turn, or before the connection closes)."""
        held, self._held = self._held, None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        """Close the connection after what is held."""
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        """Whether the connection is closing."""
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing request heads over `limits` while they arrive.

    An incomplete head is measured by the bytes fed to the parser, checked after each socket
    read, so at most one read (256 KiB) past the limit is ever parsed; a complete one by its
    request target and fields, before the app sees it. The refusal is a 431 followed by a
    lingering close: the client's unread bytes are discarded for a moment instead of resetting
    the connection, which would destroy the answer before the client read it.
    """

    def __init__(self, *args: Any, limits: HeadLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self.url = b""  # uvicorn's: the current head's request target, as far as it arrived
        self._fed = 0  # bytes fed while the current head is incomplete
        self._size = 0  # the current head's target and fields, as parsed
        self._fields = 0
        self._in_head = True
        self._refused = False
        self._plain: bytes | None = None  # the head of an upgrade not made, to parse again
        self._deadline: Deadline | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline = Deadline(self.loop, self._expired)
        if len(self.connections) > self._limits.max_connections:
            # Answered and closed at once: its descriptor is free again before the next accept.
            self._refused = True
            refused = TooManyConnectionsError(
                f"This worker holds {self._limits.max_connections} connections"
                " (limits.max_connections); retry shortly."
            )
            self.logger.warning("connection refused: limits.max_connections reached")
            transport.write(refusal_bytes(self._limits, exc=refused))
            transport.close()
            return
        self._deadline.arm(self._limits.head_timeout, "head")  # a connection that sends nothing

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _expired(self, part: str) -> None:
        """The head or body took too long: a 408 unless a response has begun, then close."""
        if part == "body" and self.flow is not None and self.flow.read_paused:
            # The app has not read what arrived: the client is not the one waiting.
            if self._deadline is not None:
                self._deadline.arm(self._limits.body_timeout, "body")
            return
        transport: asyncio.Transport = self.transport
        if transport.is_closing():
            return
        self._refused = True
        limit = self._limits.head_timeout if part == "head" else self._limits.body_timeout
        self.logger.warning("request %s not received within %g s: 408", part, limit)
        cycle = self.cycle
        # A late head follows the last response (if any) in full; a late body gets an answer
        # only if its own has not begun. Never bytes in the middle of another response.
        if part == "head":
            answer = cycle is None or cycle.response_complete
        else:
            answer = cycle is not None and not cycle.response_started
        if answer:
            late = RequestTimeoutError(
                f"The request {part} did not arrive within {limit:g} seconds"
                f" (limits.{part}_timeout_seconds)."
            )
            refusal = refusal_bytes(self._limits, anthropic=anthropic_target(self.url), exc=late)
            transport.write(refusal)
        transport.close()

    def _over(self, size: int) -> bool:
        return size > self._limits.max_bytes or self._fields > self._limits.max_headers

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: discard what the client still sends
        if self._in_head:
            self._fed += len(data)
        # uvicorn's own data_received, but for an upgrade it does not make (see _not_upgraded).
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade as upgrade:
            head, self._plain = self._plain, None
            if head is not None:
                self.data_received(head + data[upgrade.args[0] :])
            elif self._should_upgrade():
                if self._deadline is not None:
                    self._deadline.cancel()  # a WebSocket's life is not a request body's
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head and not self._refused and self._over(self._fed):
            self._refuse()

    def _not_upgraded(self) -> bytes | None:
        """The head of a request asking for an upgrade other than to a WebSocket (`curl --http2`
        asks for h2c), without its Upgrade header; None for any other request.

        httptools skips the body of a request asking to upgrade, and the rest of the connection
        would be the new protocol's; a server that does not upgrade serves the request as plain
        HTTP/1.1, body included (RFC 9110 §7.8). So it is parsed again without the header.
        """
        if not self.parser.should_upgrade() or self._should_upgrade():
            return None
        if not any(name == b"upgrade" for name, _ in self.headers):
            return None  # CONNECT: refused as uvicorn refuses it
        version = self.parser.get_http_version().encode()
        lines = [self.parser.get_method() + b" " + self.url + b" HTTP/" + version]
        lines += [name + b": " + value for name, value in self.headers if name != b"upgrade"]
        return b"\r\n".join([*lines, b"", b""])

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._size, self._fields = True, 0, 0
        if self._deadline is not None:
            self._deadline.arm(self._limits.head_timeout, "head")

    def on_body(self, body: bytes) -> None:
        if self._deadline is not None:
            self._deadline.arm(self._limits.body_timeout, "body")  # between two reads, as nginx
        super().on_body(body)

    def on_url(self, url: bytes) -> None:
        self._size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        self._size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._over(self._size):
            self._refused = True
            raise self._limits.refusal()  # the parser stops; uvicorn calls send_400_response
        self._plain = self._not_upgraded()
        if self._plain is not None:
            return  # no request for the app yet: it comes when the head is parsed again
        self._in_head, self._fed = False, 0
        if self._deadline is not None:
            self._deadline.arm(self._limits.body_timeout, "body")
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle:  # a request for the app (not an upgrade): its response
            self.cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        if self._plain is None:
            super().on_message_complete()
            if self._deadline is not None:
                self._deadline.cancel()  # the next head's clock starts with its first byte
        self._in_head, self._fed = True, 0

    def send_400_response(self, msg: str) -> None:
        if self._refused:
            self._refuse()
            return
        super().send_400_response(msg)

    def _refuse(self) -> None:
        self._refused = True
        transport: asyncio.Transport = self.transport
        if transport.is_closing():
            return
        self.logger.warning("request head over the limits: refused with 431")
        transport.write(refusal_bytes(self._limits, anthropic=anthropic_target(self.url)))
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, transport.close)


def websocket_protocol(**kwargs: Any) -> asyncio.Protocol:
    """The protocol of one upgraded connection: uvicorn's automatic choice, imported on the
    first upgrade (uvicorn calls this with the keyword arguments it gives the class)."""
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol  # noqa: PLC0415

    if AutoWebSocketsProtocol is None:  # neither websockets nor wsproto is installed
        raise RuntimeError("no WebSocket implementation is installed")
    return AutoWebSocketsProtocol(**kwargs)


def protocol_options(limits: HeadLimits) -> dict[str, Any]:
    """uvicorn options: our HTTP protocol that bounds request heads (and h11's limit should
    anyone choose h11 instead), the WebSocket protocol imported on first use, and how long an
    idle connection is kept."""
    return {
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
        "http": functools.partial(BoundedHttpToolsProtocol, limits=limits),
        "ws": websocket_protocol,
        "h11_max_incomplete_event_size": limits.max_bytes,
    }
