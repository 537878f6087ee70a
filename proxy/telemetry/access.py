"""Every HTTP exchange: one `date` header, a metric and a log line, whatever the route.

Wraps the whole app, so requests that end in our own errors (401, 413, 404) are counted too.
A chat request's `compactd.request` line carries the access fields; every other request gets a
`compactd.access` line of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import formatdate

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.telemetry.logs import access_context, log_access
from proxy.telemetry.metrics import Metrics

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_MAX_PATH = 200
NO_RESPONSE = "none"
"""The status label of a request that ended before any response (the client went away)."""


def route_class(method: str, path: str) -> str:
    """A bounded label for a path: chat, v1, api, ui, health, metrics or other."""
    if path.startswith("/v1/"):
        return "chat" if method == "POST" and path == "/v1/chat/completions" else "v1"
    if path.startswith("/compactd/v1/"):
        return "api"
    if path == "/compactd/ui" or path.startswith("/compactd/ui/"):
        return "ui"
    if path in ("/healthz", "/readyz"):
        return "health"
    if path == "/metrics":
        return "metrics"
    return "other"


class _Date:
    """The IMF-fixdate of the current second, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._value = second, formatdate(second, usegmt=True).encode()
        return self._value


class AccessLog:
    """ASGI wrapper: adds `date` where the response has none, then counts and logs the exchange."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], Metrics | None]) -> None:
        self.app = app
        self.metrics = metrics
        self._date = _Date()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in _METHODS else "other"
        path: str = scope["path"]
        fields = {
            "method": method,
            "route": route_class(method, path),
            "started": time.perf_counter(),
        }

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                fields["status"] = message["status"]
                headers = message.get("headers") or []
                if not any(k.lower() == b"date" for k, _ in headers):
                    message = {**message, "headers": [*headers, (b"date", self._date.now())]}
            await send(message)

        with access_context(fields):
            try:
                await self.app(scope, receive, sending)
            finally:
                self._finish(fields, path)

    def _finish(self, fields: dict[str, object], path: str) -> None:
        status = fields.get("status")
        metrics = self.metrics()
        if metrics is not None:
            metrics.observe_http(
                method=str(fields["method"]),
                route=str(fields["route"]),
                status=str(status) if status is not None else NO_RESPONSE,
                seconds=time.perf_counter() - float(fields["started"]),  # type: ignore[arg-type]
            )
        log_access(fields, path[:_MAX_PATH])
