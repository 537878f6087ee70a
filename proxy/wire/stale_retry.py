"""One more try for a request our pool sent on a connection the upstream had just closed.

An idle pooled connection is closed by the upstream when *its* keep-alive timeout passes
(uvicorn 5 s, nginx 75 s, load balancers ~60 s). A request written in that instant meets the
close: the connection ends (EOF or reset) before a byte of the response. The client did nothing
wrong and the upstream is up; the failure is our pool's, so it must not become the client's 502.

What the HTTP clients do (RFC 9112 §9.3.1 lets a client retry a request on a new connection when
the old one closed before the response; for a non-idempotent one, not automatically):

- aiohttp (since aio-libs/aiohttp#7363, 3.9) retries once on `ServerDisconnectedError` or
  `ClientOSError`, for idempotent methods only (GET, HEAD, OPTIONS, TRACE, PUT, DELETE), on any
  connection (aio-libs/aiohttp#10790 asks for a way to turn it off). Its pool drops a connection it
  already saw closed; a close still in flight is not seen. httpx-aiohttp maps both errors to
  `httpx.ConnectTimeout` with the aiohttp error as the cause, and retries nothing.
- httpcore (httpx's transport) drops an idle connection whose socket is readable (the upstream's
  FIN arrived: `has_expired`) and retries nothing: the race is `RemoteProtocolError: Server
  disconnected without sending a response` (encode/httpx#2983; the retry of encode/httpx#3515 was
  not merged).
- urllib3 drops a pooled connection that `is_connection_dropped`; a read error after sending is
  retried only for `Retry.DEFAULT_ALLOWED_METHODS` (the idempotent ones).
- Go's net/http (`persistConn.shouldRetryRequest`) retries on a new connection only if the
  connection was *reused* ("a fresh connection … there's no reason the server should've hung up
  on us", and retrying it could loop forever), the body can be rewound, and the failure came
  before the first response byte (`errServerClosedIdle`, `transportReadFromServerError`); a POST
  only when nothing was written or it carries an `Idempotency-Key`.
- nginx gives an error on a cached keep-alive upstream connection an extra try
  (`ngx_http_upstream_next`: `if (u->peer.cached && ft_type == NGX_HTTP_UPSTREAM_FT_ERROR)
  u->peer.tries++`), but passes a POST on once it was sent only with
  `proxy_next_upstream non_idempotent`, and never once anything went to the client.
- The OpenAI SDKs retry every request, POST included, on a connection error and on any 5xx (2
  retries, with a back-off from 0.5 s: openai-python `_base_client.py`).

So the POST compactd would answer 502 is sent again anyway, by the client, later. compactd sends
it again at once, under Go's conditions bar the Idempotency-Key: one retry, only when the failed
attempt went out on a reused pooled connection, the connection was closed or reset before the
response head (never a timeout, never a connection that could not be made, never a response that
had begun; a reset, and with httpx's transport a close, reads the same with or without part of a
head, so that rarity is retried),
and the body is bytes we still hold (chat, Responses and Messages requests are; a
streamed body of another endpoint is not, and is never retried). The retry goes out on a new
connection of its own (a second pool that keeps none), so it cannot meet a stale one again, and
if it fails too the client gets that failure: no loop. An upstream that read the POST and died
before answering sees it twice, as with the SDK's retry; a connection the upstream closed because
it was idle had no request of ours in progress, and that is the case this is for.
"""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import ClientTimeout
    from aiohttp.tracing import Trace

log = logging.getLogger("compactd.pool")

ALREADY_RETRIED_BY_AIOHTTP = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""aiohttp's own IDEMPOTENT_METHODS: it retries these once itself, so they are not retried here
(they would go out three times)."""


@dataclass
class Attempt:
    """What the transport reported about the connection one attempt used."""

    reused: bool = False
    connected: bool = False


class Reuse:
    """Tells, per request, whether the pool sent it on a connection it had used before.

    Reported by the pool's connector (aiohttp) or httpcore's `trace` extension, both run in
    the task sending the request."""

    def __init__(self) -> None:
        self._current: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
            "compactd_attempt", default=None
        )

    def start(self) -> tuple[Attempt, contextvars.Token[Attempt | None]]:
        attempt = Attempt()
        return attempt, self._current.set(attempt)

    def end(self, token: contextvars.Token[Attempt | None]) -> None:
        self._current.reset(token)

    def aiohttp_connector(self, **options: Any) -> aiohttp.TCPConnector:
        """An aiohttp TCPConnector that marks the attempt whose connection it took from the pool.

        A connection is reused when its protocol object already carried a request. aiohttp's
        own hook for this (a TraceConfig's `on_connection_reuseconn`) turns on every tracing
        signal of every request: ~20 us of CPU per request, 7 % of a small pass-through's, where
        this costs well under 1 us (bench/keepalive.py)."""
        import aiohttp  # noqa: PLC0415  (only needed with this transport)
        from aiohttp.client_reqrep import ClientRequest  # noqa: PLC0415
        from aiohttp.connector import Connection  # noqa: PLC0415

        current = self._current

        class Pool(aiohttp.TCPConnector):
            def __init__(self, **options: Any) -> None:
                super().__init__(**options)
                self._used: weakref.WeakSet[object] = weakref.WeakSet()

            async def connect(
                self,
                req: ClientRequest,
                traces: list[Trace],
                timeout: ClientTimeout,  # noqa: ASYNC109  (aiohttp's signature)
            ) -> Connection:
                connection = await super().connect(req, traces, timeout)
                protocol = connection.protocol
                if (attempt := current.get()) is not None:
                    attempt.reused = protocol in self._used
                if protocol is not None:
                    self._used.add(protocol)
                return connection

        return Pool(**options)

    async def httpcore_trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's `trace` extension: a request whose headers go out without a connect of
        its own went out on a pooled connection."""
        del info
        attempt = self._current.get()
        if attempt is None:
            return
        if name == "connection.connect_tcp.started":
            attempt.connected = True
        elif name == "http11.send_request_headers.started" and not attempt.connected:
            attempt.reused = True


def closed_before_answer(exc: httpx.TransportError) -> bool:
    """The connection was closed or reset before the response head arrived (not a timeout, not
    a connection that could not be made)."""
    cause = exc.__cause__
    if cause is not None and type(cause).__module__.startswith("aiohttp"):
        import aiohttp  # noqa: PLC0415

        if isinstance(cause, TimeoutError | aiohttp.ClientConnectorError):
            return False
        if isinstance(cause, aiohttp.ServerDisconnectedError):
            # Its message is the part of a response head that did arrive, if any did.
            return isinstance(cause.message, str)
        # A reset reads the same with or without part of a head: a head cut by a reset is rare.
        return isinstance(cause, aiohttp.ClientOSError | aiohttp.ClientConnectionResetError)
    if isinstance(exc, httpx.RemoteProtocolError):
        # httpcore says so too when part of a head came: its transport retries that rarity.
        return "without sending a response" in str(exc)
    return isinstance(exc, httpx.ReadError | httpx.WriteError)


Observe = Callable[[str], None]


class StaleRetry(httpx.AsyncBaseTransport):
    """The pooled transport, with one retry on a new connection for a request the upstream's
    close of a reused connection cut off before its answer (see the module's docstring)."""

    def __init__(
        self,
        pooled: httpx.AsyncBaseTransport,
        fresh: Callable[[], httpx.AsyncBaseTransport],
        reuse: Reuse,
        *,
        httpcore: bool = False,
    ) -> None:
        self.pooled = pooled
        self._make_fresh = fresh
        self._fresh: httpx.AsyncBaseTransport | None = None
        self._reuse = reuse
        self._httpcore = httpcore
        self.observe: Observe | None = None
        """Called with "ok" or "failed" after each retry (the metric; set by the services)."""

    def _retryable(self, request: httpx.Request) -> bool:
        if not isinstance(request.stream, httpx.ByteStream):
            return False  # a streamed body: what was sent of it is gone
        return self._httpcore or request.method not in ALREADY_RETRIED_BY_AIOHTTP

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self._retryable(request):
            return await self.pooled.handle_async_request(request)
        if self._httpcore:
            request.extensions = {**request.extensions, "trace": self._reuse.httpcore_trace}
        attempt, token = self._reuse.start()
        try:
            return await self.pooled.handle_async_request(request)
        except httpx.TransportError as exc:
            if not (attempt.reused and closed_before_answer(exc)):
                raise
            cause = type(exc.__cause__ or exc).__name__
        finally:
            self._reuse.end(token)
        return await self._retry(request, cause)

    async def _retry(self, request: httpx.Request, cause: str) -> httpx.Response:
        log.info(
            "upstream closed a reused connection before answering; sending again on a new one",
            extra={"method": request.method, "error": cause},
        )
        try:
            response = await self.fresh.handle_async_request(request)
        except BaseException:
            self._count("failed")
            raise
        self._count("ok")
        return response

    @property
    def fresh(self) -> httpx.AsyncBaseTransport:
        """The transport of the retries (built on the first): one new connection each."""
        if self._fresh is None:
            self._fresh = self._make_fresh()
        return self._fresh

    def _count(self, outcome: str) -> None:
        if self.observe is not None:
            self.observe(outcome)

    async def aclose(self) -> None:
        try:
            await self.pooled.aclose()
        finally:
            if self._fresh is not None:
                await self._fresh.aclose()
