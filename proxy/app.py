"""create_app(settings, …): the lifespan owns every resource; routes dispatch to the proxy."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from proxy.asgi import (
    BodyStream,
    ClientDisconnectedError,
    content_length,
    read_body,
    send_error,
    until_disconnect,
)
from proxy.config import Settings
from proxy.errors import BodyTooLargeError, NotFoundError, ProxyError
from proxy.forward import Timeouts, Upstream, relay
from proxy.headers import RawHeaders, compactd_headers, request_headers

log = logging.getLogger("compactd.app")

CHAT_PATH = b"/chat/completions"


@dataclass
class Prepared:
    """What to send upstream for one chat request, and what to tell the client about it."""

    content: bytes
    info: dict[str, str] = field(default_factory=dict)
    """Values of our `x-compactd-*` response headers (action, tokens-before, …)."""


class ChatHook(Protocol):
    """Where compaction plugs into the chat path: raw body in, body to forward out."""

    async def prepare(self, scope: Scope, body: bytes) -> Prepared:
        """Decide what to forward; must never raise (fail open)."""


class PassthroughHook:
    """Forwards every chat request unchanged."""

    async def prepare(self, scope: Scope, body: bytes) -> Prepared:
        """Forward the original bytes."""
        del scope
        return Prepared(content=body, info={"action": "passthrough"})


def build_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    """The pooled upstream transport (aiohttp by default: httpx's pool collapses under load)."""
    up = settings.upstream
    limits = httpx.Limits(
        max_connections=up.max_connections, max_keepalive_connections=up.max_connections
    )
    if up.transport == "httpx":
        return httpx.AsyncHTTPTransport(limits=limits)
    import aiohttp  # noqa: PLC0415  (only needed with this transport)
    from httpx_aiohttp import AiohttpTransport  # noqa: PLC0415

    def session() -> aiohttp.ClientSession:
        # No cookie jar: cookies set for one tenant must never be sent for another.
        # No auto headers: the upstream sees the client's headers, not aiohttp's defaults.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=up.max_connections, keepalive_timeout=30),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    return AiohttpTransport(client=session, limits=limits)


@dataclass
class Services:
    """Everything the request path needs, created in the lifespan."""

    settings: Settings
    upstream: Upstream
    chat: ChatHook


class ProxyHandler:
    """Relays /v1/* to the upstream; chat completions go through the chat hook first."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.max_body = services.settings.server.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self._handle(scope, receive, tracking_send)
        except ClientDisconnectedError:
            return
        except ProxyError as exc:
            if started:
                raise
            await send_error(send, exc, [])

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        sub_path = raw_path[len(b"/v1") :]
        url = self.services.upstream.url(sub_path, scope.get("query_string", b""))
        method: str = scope["method"]
        if method == "POST" and sub_path == CHAT_PATH:
            body = await read_body(receive, self.max_body, content_length(scope))
            prepared = await self.services.chat.prepare(scope, body)
            headers = request_headers(scope["headers"], keep_length=False)
            extra = compactd_headers(prepared.info)
            await until_disconnect(
                self._exchange(
                    send,
                    method=method,
                    url=url,
                    headers=headers,
                    content=prepared.content,
                    extra=extra,
                ),
                receive,
            )
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_body:
            raise BodyTooLargeError(f"Request body exceeds the limit of {self.max_body} bytes.")
        stream = BodyStream(receive, self.max_body)
        has_body = declared not in (None, 0) or _is_chunked(scope)
        headers = request_headers(scope["headers"], keep_length=has_body)
        content: bytes | BodyStream = stream if has_body else b""
        if not has_body:
            stream.done.set()
        exchange = self._exchange(
            send, method=method, url=url, headers=headers, content=content, extra=[]
        )
        try:
            await until_disconnect(exchange, receive, stream.done)
        except ProxyError:
            if stream.error is not None:
                raise stream.error from None
            raise

    async def _exchange(
        self,
        send: Send,
        *,
        method: str,
        url: httpx.URL,
        headers: RawHeaders,
        content: Any,
        extra: RawHeaders,
    ) -> None:
        response = await self.services.upstream.send(method, url, headers, content)
        await relay(send, response, extra)


def _is_chunked(scope: Scope) -> bool:
    return any(k == b"transfer-encoding" for k, _ in scope["headers"])


async def healthz(request: Request) -> Response:
    """Liveness: the process answers."""
    del request
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness: the lifespan finished and the dependencies answer."""
    services: Services | None = getattr(request.app.state, "services", None)
    if services is None:
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ready"})


class CompactdApp:
    """Top-level ASGI app: /v1/* goes straight to the proxy; the rest to a Starlette router."""

    def __init__(self, router: Starlette) -> None:
        self.router = router
        self.proxy: ProxyHandler | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and self.proxy is not None:
            await self.proxy(scope, receive, send)
            return
        await self.router(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    chat: ChatHook | None = None,
) -> CompactdApp:
    """Build the ASGI app; resources are created when the lifespan starts."""

    @contextlib.asynccontextmanager
    async def lifespan(router: Starlette) -> AsyncIterator[None]:
        up = settings.upstream
        timeouts = Timeouts(
            connect=up.connect_timeout,
            read=up.read_timeout or None,
            write=up.write_timeout or None,
            pool=up.pool_timeout or None,
        )
        upstream = Upstream(transport or build_transport(settings), up.url, timeouts)
        services = Services(settings=settings, upstream=upstream, chat=chat or PassthroughHook())
        router.state.services = services
        app.proxy = ProxyHandler(services)
        try:
            yield
        finally:
            app.proxy = None
            await upstream.aclose()

    async def not_found(request: Request, exc: Exception) -> Response:
        del exc
        err = NotFoundError(f"Unknown path {request.url.path}.")
        return JSONResponse(
            {"error": {"message": err.message, "type": err.type, "param": None, "code": err.code}},
            status_code=404,
        )

    router = Starlette(
        routes=[Route("/healthz", healthz), Route("/readyz", readyz)],
        lifespan=lifespan,
        exception_handlers={404: not_found},
    )
    app = CompactdApp(router)
    return app
