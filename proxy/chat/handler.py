"""The /v1/* relay: chat completions through the compactor, everything else untouched."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import httpx
from starlette.types import Message, Receive, Scope, Send

from proxy.chat.compactor import Compactor
from proxy.chat.count_tokens import PATH as COUNT_PATH
from proxy.chat.count_tokens import count_tokens
from proxy.chat.exchange import ChatExchange, ExchangeContext, ExchangeSettings, Overflow, Route
from proxy.chat.request import ChatRequest, Outcome
from proxy.dialects.anthropic_count import Confirm, confirmer
from proxy.dialects.apis import compacted_api, is_anthropic
from proxy.dialects.errors import send_api_error, stream_end
from proxy.errors import BodyTooLargeError, ClientDisconnectedError, ProxyError, RateLimitedError
from proxy.store.base import Store
from proxy.telemetry.accounting import Accountant
from proxy.telemetry.metrics import Metrics
from proxy.wire.asgi import BodyStream, content_length, read_body, until_disconnect
from proxy.wire.forward import Upstream, relay, route
from proxy.wire.headers import RawHeaders, request_headers
from proxy.wire.ratelimit import RateLimiter
from proxy.wire.tenant import ANONYMOUS, raw_header_map
from proxy.wire.upstream_keys import Gate
from proxy.wire.websocket import POLICY_VIOLATION, relay_websocket, ws_url

# The relay's log lines keep the logger they always had.
log = logging.getLogger("compactd.handler")


@dataclass
class Handler:
    """The ASGI app mounted on /v1."""

    upstream: Upstream
    compactor: Compactor
    store: Store
    metrics: Metrics
    gate: Gate
    max_body: int
    accountant: Accountant | None = None
    """Usage aggregation (None: accounting off)."""
    exchange: ExchangeSettings = field(default_factory=ExchangeSettings)
    """How a chat request's exchange treats the upstream's answers."""
    anthropic: Upstream | None = None
    """The upstream for Anthropic's paths (`upstream.anthropic_url`); None: `upstream`."""
    anthropic_gate: Gate | None = None
    count_tokens_band: float = 0.0
    """Anthropic requests this near their trigger are counted upstream first (0: never)."""
    count_tokens_timeout: float = 1.0
    chat_rate: RateLimiter | None = None
    """Requests per minute per tenant on the compacted APIs (None: no limit)."""
    _exchanging: ExchangeContext = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._exchanging = ExchangeContext(
            settings=self.exchange,
            metrics=self.metrics,
            store=self.store,
            accountant=self.accountant,
            calibration=self.compactor.calibration,
            input_window=self.compactor.sizing.input_window,
        )

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
            anthropic = is_anthropic(_sub_path(scope), scope["headers"])
            retry = getattr(exc, "retry_after", None)
            extra = [(b"retry-after", str(retry).encode())] if retry is not None else []
            await send_api_error(send, exc, extra, anthropic=anthropic)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        sub_path = _sub_path(scope)
        named = route(sub_path)
        anthropic = is_anthropic(named, scope["headers"])
        upstream = self.anthropic if anthropic and self.anthropic is not None else self.upstream
        gate = self.anthropic_gate if anthropic and self.anthropic_gate is not None else self.gate
        method: str = scope["method"]
        query = scope.get("query_string", b"")
        api = compacted_api(method, named)
        if api is not None:
            # However the client spelled the path, a compacted route goes to its canonical URL.
            route_to = Route(api, upstream, gate)
            await self._chat(scope, receive, send, upstream.url(named, query), route_to)
            return
        if method == "POST" and named == COUNT_PATH:
            # Counted as what compactd would forward, not as what the client holds.
            await count_tokens(
                scope,
                receive,
                send,
                compactor=self.compactor,
                upstream=upstream,
                gate=gate,
                max_body=self.max_body,
            )
            return
        url = upstream.url(sub_path, query)
        declared = content_length(scope)
        if declared is not None and declared > self.max_body:
            raise BodyTooLargeError(f"Request body exceeds the limit of {self.max_body} bytes.")
        headers = gate.authorize(list(scope["headers"]))
        stream = BodyStream(receive, self.max_body)
        has_body = declared not in (None, 0) or any(k == b"transfer-encoding" for k, _ in headers)
        headers = request_headers(headers, keep_length=has_body)
        content: bytes | BodyStream = stream if has_body else b""
        if not has_body:
            stream.done.set()

        async def exchange() -> None:
            response = await upstream.send(method, url, headers, content)
            end = stream_end(responses=_is_responses(named), anthropic=anthropic)
            await relay(send, response, [], end.see, error_event=end.event)

        try:
            await until_disconnect(exchange(), receive, stream.done)
        except ProxyError:
            if stream.error is not None:
                raise stream.error from None
            raise

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket upgrade under /v1 (the Responses API's WebSocket mode), relayed
        untouched to the path's upstream (`proxy.wire.websocket`)."""
        sub_path = _sub_path(scope)
        anthropic = is_anthropic(sub_path, scope["headers"])
        upstream = self.anthropic if anthropic and self.anthropic is not None else self.upstream
        gate = self.anthropic_gate if anthropic and self.anthropic_gate is not None else self.gate
        try:
            url = ws_url(str(upstream.url(sub_path, scope.get("query_string", b""))))
            gate.authorize(list(scope["headers"]))
        except ProxyError:
            await receive()  # the connect event, then refuse the handshake
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        await relay_websocket(scope, receive, send, url=url, gate=gate, max_message=self.max_body)

    async def _chat(
        self, scope: Scope, receive: Receive, send: Send, url: httpx.URL, route: Route
    ) -> None:
        if self.chat_rate is not None:
            self._check_rate(self.chat_rate, scope)
        raw = await read_body(receive, self.max_body, content_length(scope))
        headers = route.gate.authorize(list(scope["headers"]))
        # The request value is read once, from the client's own headers (its key is its tenant).
        request = await self.compactor.read(raw, scope["headers"], route.api.dialect)
        if route.upstream is not self.upstream:
            # Summaries are asked of `upstream.url`: another provider's key is never sent there.
            keyless = dataclasses.replace(request.identity, api_key=None)
            request = dataclasses.replace(request, identity=keyless)
        outcome = await self.compactor.decide(
            request, confirm=self._confirm(route, headers, request)
        )
        exchange = ChatExchange(
            self._exchanging, send, url, headers=headers, request=request, outcome=outcome,
            route=route,
        )  # fmt: skip
        cancelled = await until_disconnect(self._exchange(exchange, outcome), receive)
        exchange.finish(cancelled=cancelled)

    async def _exchange(self, exchange: ChatExchange, outcome: Outcome) -> None:
        """The decision sent upstream; after a context overflow, decided again under the window
        the upstream reported and sent once more; the answer relayed."""
        try:
            answer = await exchange.send(outcome)
            if answer.overflow is not None:
                retry = await self._replan(exchange.request, outcome, answer.overflow)
                if retry is not None:
                    await answer.response.aclose()
                    answer = await exchange.send(retry)
            answer = await exchange.expanded(answer)
        except ProxyError as exc:
            await exchange.refuse(exc)
            return
        await exchange.relay(answer)

    async def _replan(
        self, request: ChatRequest, first: Outcome, overflow: Overflow
    ) -> Outcome | None:
        """The decision made again after the upstream refused `first` as too long (None: no
        retry is due, the refusal is relayed)."""
        retry = await self.compactor.after_overflow(request, first, overflow.message)
        self.metrics.context_overflow(overflow.where, "relayed" if retry is None else "retried")
        if retry is not None:
            where, model = overflow.where, request.model
            log.info("retrying after context overflow", extra={"model": model, "where": where})
        return retry

    def _check_rate(self, rate: RateLimiter, scope: Scope) -> None:
        """429 before the body is read, for a tenant past its rate (no credential: one bucket)."""
        tenant = self.compactor.tenancy.identify(raw_header_map(scope["headers"])).tenant
        try:
            rate.check(tenant or ANONYMOUS, "limits.chat_rate_per_minute")
        except RateLimitedError:
            self.metrics.rate_limited("chat")
            raise

    def _confirm(self, route: Route, headers: RawHeaders, request: ChatRequest) -> Confirm | None:
        """How the upstream counts this request, where it can and the config asks for it."""
        if not route.api.anthropic or self.count_tokens_band <= 0 or request.body is None:
            return None
        return confirmer(route.upstream, headers, request.body, timeout=self.count_tokens_timeout)


def _sub_path(scope: Scope) -> bytes:
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
    return raw_path[len(b"/v1") :]


def _is_responses(named: bytes) -> bool:
    """A Responses API path (a response created, or a stored one's stream resumed)."""
    return named == b"/responses" or named.startswith(b"/responses/")
