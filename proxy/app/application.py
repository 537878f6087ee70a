"""create_app(settings, …): the lifespan owns every resource; /v1/* goes to the relay."""

from __future__ import annotations

import contextlib
import gc
import ssl
import sys
from collections.abc import AsyncIterator
from types import ModuleType

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.app import ui
from proxy.app.api import EXCEPTION_HANDLERS, ROUTES
from proxy.app.dashboard_api import ROUTES as INSIGHT_ROUTES
from proxy.app.openapi import PATH as OPENAPI_PATH
from proxy.app.openapi import openapi
from proxy.app.server import HeadLimits, anthropic_target, head_limits, head_too_large
from proxy.app.services import build_services
from proxy.chat.exchange import ExchangeSettings
from proxy.chat.handler import Handler
from proxy.config import Settings, UpstreamSettings
from proxy.dialects.errors import send_api_error
from proxy.errors import MethodNotAllowedError, NotFoundError
from proxy.providers.registry import ProviderRegistry
from proxy.store.base import Store
from proxy.telemetry.access import AccessLog
from proxy.telemetry.metrics import Metrics
from proxy.wire.asgi import error_body
from proxy.wire.ratelimit import limiter
from proxy.wire.stale_retry import Reuse, StaleRetry
from proxy.wire.upstream_keys import Gate

_ALPN = ("http/1.1",)
"""What aiohttp offers in the TLS handshake (HTTP/1.1 only), as its default contexts do."""
UPSTREAM_KEEP_ALIVE_SECONDS = UpstreamSettings.keepalive_seconds
"""How long an idle upstream connection stays pooled by default (`upstream.keepalive_seconds`)."""
SWITCH_INTERVAL = 0.002
"""Seconds a thread may hold the GIL before another may take it (Python's default is 0.005)."""


def build_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    """The pooled upstream transport (aiohttp by default: httpx's pool collapses under load),
    with one retry on a new connection for a request a reused connection's close cut off
    (proxy.wire.stale_retry)."""
    up = settings.upstream
    reuse = Reuse()
    if up.transport == "httpx":
        limits = httpx.Limits(
            max_connections=up.max_connections,
            max_keepalive_connections=up.max_connections,
            keepalive_expiry=up.keepalive_seconds,
        )
        return StaleRetry(
            httpx.AsyncHTTPTransport(limits=limits),
            lambda: httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0)),
            reuse,
            httpcore=True,
        )
    limits = httpx.Limits(
        max_connections=up.max_connections, max_keepalive_connections=up.max_connections
    )
    import aiohttp  # noqa: PLC0415  (only needed with this transport)
    from httpx_aiohttp import AiohttpTransport  # noqa: PLC0415

    def session(*, pooled: bool) -> aiohttp.ClientSession:
        # No cookie jar: cookies set for one tenant must never be sent for another.
        # No auto headers: the upstream sees the client's headers, not aiohttp's defaults.
        # The pool's connector reports each reused connection; the retries' keeps none.
        connector = (
            reuse.aiohttp_connector(
                limit=up.max_connections, keepalive_timeout=up.keepalive_seconds
            )
            if pooled
            else aiohttp.TCPConnector(limit=up.max_connections, force_close=True)
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            # Past these the upstream's response is refused as a 502 (proxy.wire.forward).
            max_line_size=up.max_response_header_bytes,
            max_field_size=up.max_response_header_bytes,
        )

    # httpx_aiohttp builds an SSL context (a CA bundle read, ~0.7 MB per worker) for sessions it
    # would make itself. Ours come from `session()`, whose connector verifies with aiohttp's
    # default context: hand it that one (should aiohttp rename it, it builds its own as before).
    verified = getattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", None)
    _unverified_without_ca_store(aiohttp.connector)

    def transport(*, pooled: bool) -> httpx.AsyncBaseTransport:
        return AiohttpTransport(
            verify=verified or True, client=lambda: session(pooled=pooled), limits=limits
        )

    return StaleRetry(transport(pooled=True), lambda: transport(pooled=False), reuse)


def _unverified_without_ca_store(connector: ModuleType) -> None:
    """aiohttp builds, at import, the context for requests sent with `ssl=False` (compactd sends
    none) and loads the system CA store into it, ~0.7 MB per worker, though it verifies
    nothing (CERT_NONE, no hostname check). Put the same context without the store in its
    place; left as it is if aiohttp changes it."""
    old = getattr(connector, "_SSL_CONTEXT_UNVERIFIED", None)
    if not isinstance(old, ssl.SSLContext) or old.verify_mode != ssl.CERT_NONE:
        return
    if old.check_hostname or old.protocol != ssl.PROTOCOL_TLS_CLIENT:
        return
    new = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    new.check_hostname = False
    new.verify_mode = ssl.CERT_NONE
    new.options = old.options
    new.minimum_version, new.maximum_version = old.minimum_version, old.maximum_version
    new.set_alpn_protocols(_ALPN)
    setattr(connector, "_SSL_CONTEXT_UNVERIFIED", new)  # noqa: B010  (a private name)


class CompactdApp:
    """Top-level ASGI app: /v1/* goes straight to the relay; the rest to a Starlette router.
    Every HTTP exchange passes through the access log (date header, metric, log line)."""

    def __init__(self, router: Starlette, limits: HeadLimits | None = None) -> None:
        self.router = router
        self.limits = limits or HeadLimits()
        self.handler: Handler | None = None
        self.metrics: Metrics | None = None
        self._access = AccessLog(self._dispatch, lambda: self.metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._access(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and head_too_large(scope, self.limits):
            # Our uvicorn protocol refuses these before parsing; this covers any other server.
            target = scope.get("raw_path") or scope["path"].encode()
            await send_api_error(
                send,
                self.limits.refusal(),
                [(b"connection", b"close")],
                anthropic=anthropic_target(target),
            )
            return
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and self.handler:
            await self.handler(scope, receive, send)
            return
        if scope["type"] == "websocket" and scope["path"].startswith("/v1/") and self.handler:
            await self.handler.websocket(scope, receive, send)
            return
        await self.router(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    store: Store | None = None,
    registry: ProviderRegistry | None = None,
) -> CompactdApp:
    """Build the ASGI app; resources are created when the lifespan starts (not at import)."""

    @contextlib.asynccontextmanager
    async def lifespan(router: Starlette) -> AsyncIterator[None]:
        services = await build_services(
            settings,
            transport=transport or build_transport(settings),
            store=store,
            registry=registry,
        )
        router.state.services = services
        app.metrics = services.metrics
        # Start-up objects (model table, registries, encodings' Python side) live for the whole
        # process: keep them out of every later garbage collection, which otherwise stalls the
        # event loop for tens of milliseconds while a provider runs in a worker thread.
        gc.freeze()
        # Providers and large counts run in worker threads; a CPU-bound thread keeps the GIL for
        # the whole switch interval before the event loop gets it back. 2 ms instead of 5 keeps
        # the loop's longest wait during a compaction of a 1M-token history under ~7 ms.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        up = settings.upstream
        allowed = frozenset(k.strip().lower() for k in up.allowed_keys)
        app.handler = Handler(
            upstream=services.upstream,
            compactor=services.compactor,
            store=services.store,
            metrics=services.metrics,
            gate=Gate(tenancy=services.tenancy, upstream_key=up.api_key, allowed=allowed),
            max_body=settings.server.max_body_bytes,
            accountant=services.accountant,
            exchange=ExchangeSettings(
                strip_usage_null=settings.accounting.strip_usage_null,
                max_sse_event_bytes=settings.accounting.max_sse_event_bytes,
                retry_context_errors=settings.upstream.retry_context_errors,
                stream_overflow_wait=settings.upstream.stream_overflow_wait_ms / 1000,
            ),
            anthropic=services.anthropic,
            # Upstream-key mode for Anthropic only with an Anthropic key: else clients' own.
            anthropic_gate=Gate(
                tenancy=services.tenancy,
                upstream_key=up.anthropic_api_key,
                allowed=allowed,
                key_header="x-api-key",
            ),
            count_tokens_band=settings.tokens.count_tokens_band,
            count_tokens_timeout=settings.tokens.count_tokens_timeout_ms / 1000,
            chat_rate=limiter(settings.limits.chat_rate_per_minute),
        )
        try:
            yield
        finally:
            app.handler, app.metrics = None, None
            await services.aclose()

    async def not_found(request: Request, exc: Exception) -> Response:
        del exc
        err = NotFoundError(f"Unknown path {request.url.path}.")
        return Response(
            error_body(err.message, err.type, err.code), 404, media_type="application/json"
        )

    async def not_allowed(request: Request, exc: Exception) -> Response:
        # Starlette's own answer is plain text; compactd's errors are OpenAI-shaped everywhere.
        err = MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}.")
        allow = getattr(exc, "headers", None) or {}
        return Response(
            error_body(err.message, err.type, err.code),
            405,
            headers=dict(allow),
            media_type="application/json",
        )

    router = Starlette(
        routes=[*ROUTES, *INSIGHT_ROUTES, Route(OPENAPI_PATH, openapi), *ui.routes()],
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_allowed, **EXCEPTION_HANDLERS},
    )
    app = CompactdApp(router, head_limits(settings))
    return app
