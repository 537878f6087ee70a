"""One chat request's exchange with its upstream: each send, with a first answer looked at for a
context overflow (an upstream 400, or a Responses stream that reports one as it opens, see
`proxy.chat.stream_overflow`), the relay with its usage tap, and the request's metrics, log line
and accounting. The exchange is handed its settings and collaborators (`ExchangeContext`); the
chat endpoint (`proxy.chat.handler`) runs its steps, the re-plan after an overflow among them."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
from starlette.types import Send

from proxy.chat.expand import Expander, ExpandPlan, add_usage
from proxy.chat.refscope import resolve_within
from proxy.chat.request import ChatRequest, Outcome
from proxy.chat.stream_overflow import read_opening
from proxy.dialects.apis import RESPONSES_API, Api
from proxy.dialects.errors import Feed, send_api_error, stream_end
from proxy.errors import ProxyError
from proxy.store.base import ActivityDelta, Store, UsageRecord
from proxy.telemetry.accounting import Accountant
from proxy.telemetry.logs import log_request, request_log
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.stats import fail_open_reason
from proxy.tokens.budget import context_overflow_message
from proxy.tokens.calibration import Calibration
from proxy.wire.forward import Upstream, is_event_stream, peek, relay
from proxy.wire.headers import RawHeaders, compactd_headers, header, response_headers
from proxy.wire.rewrite import upstream_headers
from proxy.wire.tenant import ANONYMOUS
from proxy.wire.upstream_keys import Gate
from proxy.wire.usage import MAX_EVENT_BYTES, SSEUsageTap, Usage, inflated, usage_from_json

# An upstream 400 is read (to look for a context-length error) only up to this size.
OVERFLOW_BODY_LIMIT = 64 * 1024
# A Responses stream's opening events are held (to look for an overflow reported inside it) up
# to this size: `response.created` repeats the request's instructions and tools.
OPENING_LIMIT = 1 << 20
# ... and only when what was sent is at least this share of the model's input window: no
# count of the upstream's is that far above ours.
NEAR_WINDOW = 0.5
JSON_USAGE_LIMIT = 4 * 1024 * 1024


@dataclass
class _Copy:
    """Keeps a bounded copy of a JSON response body, for reading `usage` afterwards."""

    limit: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0

    def feed(self, chunk: bytes) -> bytes:
        if self.size <= self.limit:
            self.chunks.append(chunk)
            self.size += len(chunk)
        return chunk


@dataclass(frozen=True)
class ExchangeSettings:
    """How an exchange treats the upstream's answers (from `[accounting]` and `[upstream]`)."""

    strip_usage_null: bool = True
    max_sse_event_bytes: int = MAX_EVENT_BYTES
    retry_context_errors: bool = True
    stream_overflow_wait: float = 2.0
    """Seconds a Responses stream near its window may be held for an overflow it reports."""


@dataclass(frozen=True)
class ExchangeContext:
    """What every chat exchange is handed: its settings and the collaborators it uses."""

    settings: ExchangeSettings
    metrics: Metrics
    store: Store
    """Where the expand tool's refs resolve."""
    accountant: Accountant | None
    """Usage aggregation (None: accounting off)."""
    calibration: Calibration | None
    """Taught what the upstream counted for what was sent (None: off)."""
    input_window: Callable[[ChatRequest], int]
    """The most input tokens a request's model takes, as far as compactd knows."""


@dataclass(frozen=True)
class Route:
    """Where a compacted request goes and in which API's shapes it is answered."""

    api: Api
    upstream: Upstream
    gate: Gate


@dataclass(frozen=True)
class Overflow:
    """The upstream refused the request as longer than its model's window."""

    message: str
    """The upstream's own words (a window and a count, often)."""
    where: str
    """"response" (a 400's body) or "stream" (a Responses stream's opening)."""


@dataclass(frozen=True)
class Answer:
    """The upstream's answer to one send, with what compactd read of it before relaying."""

    response: httpx.Response
    body: AsyncIterator[bytes] | None = None
    """Its chunks, those read already included, when some were read (for `relay`)."""
    buffered: bytes | None = None
    """Its whole body, when it was read whole (an upstream 400, looked at for an overflow)."""
    overflow: Overflow | None = None
    """Set when it refuses the request as too long (only for a send that was no retry)."""


def _watched(feed: Feed | None, see: Feed | None) -> Feed | None:
    """`feed`, with `see` shown what it lets out."""
    if feed is None or see is None:
        return feed or see
    return lambda chunk: see(feed(chunk))


class ChatExchange:
    """One chat request's exchange with its upstream: each send, the relay, the accounting.

    The chat endpoint runs the steps (`proxy.chat.handler`): `send` the decision's bytes, and
    after an overflow the new decision's; `expanded`, then `relay` the answer (or `refuse` with
    our own error); `finish` once it is over."""

    def __init__(
        self,
        context: ExchangeContext,
        send: Send,
        url: httpx.URL,
        *,
        headers: RawHeaders,
        request: ChatRequest,
        outcome: Outcome,
        route: Route,
    ) -> None:
        self.context = context
        self.settings = context.settings
        self.route = route
        self.client = send
        self.url = url
        self.client_headers = headers
        self.request = request
        self.outcome = outcome
        self.status: int | None = None
        self.ttfb: float | None = None
        self.overhead: float = 0.0
        self.usage: Usage | None = None
        self.error: str | None = outcome.error
        self.expander: Expander | None = None

    async def send(self, outcome: Outcome) -> Answer:
        """Send `outcome`'s bytes upstream (it becomes the outcome this exchange reports). The
        answer to a first send is looked at for a context overflow a retry could fix: an
        upstream 400's body, a Responses stream's opening (`proxy.chat.stream_overflow`)."""
        self.outcome, self.error = outcome, outcome.error
        response = await self._post(outcome)
        if outcome.retried:
            return Answer(response)
        if (
            response.status_code == 400
            and self.request.body is not None
            and self.settings.retry_context_errors
        ):
            return await self._refusal(response)
        if self._holds_opening(response):
            return await self._opening(response)
        return Answer(response)

    async def expanded(self, answer: Answer) -> Answer:
        """The answer the client gets: where the model may call the expand tool, the one after
        its calls (`proxy.chat.expand`); `answer` otherwise."""
        plan = self.outcome.expand
        if plan is None or answer.response.status_code != 200:
            return answer
        return Answer(await self._expanded(answer.response, plan))

    async def refuse(self, exc: ProxyError) -> None:
        """Answer with our own error: nothing reached the client yet, so it carries our
        headers."""
        self.status, self.error = exc.status, exc.message
        anthropic = self.route.api.anthropic
        await send_api_error(self.client, exc, self._our_headers(), anthropic=anthropic)

    async def relay(self, answer: Answer) -> None:
        """Relay `answer` to the client as it arrives, its usage read on the side."""
        if answer.buffered is not None:
            await _send_buffered(self.client, answer.response, answer.buffered, self._our_headers())
            return
        await self._relay(answer.response, answer.body)

    def _holds_opening(self, response: httpx.Response) -> bool:
        """Whether this answer may be a Responses stream reporting an overflow that a retry
        could fix (`proxy.chat.stream_overflow`): a stream of a request near its window that
        compactd would decide again (not bypassed, shadowed or holding server-side history)."""
        out, raw = self.outcome, response.headers.raw
        if (
            self.route.api is not RESPONSES_API
            or not self.settings.retry_context_errors
            or self.settings.stream_overflow_wait <= 0
            or response.status_code != 200
            or self.request.body is None
            or self.request.body.get("stream") is not True
            or out.retried
            or out.expand is not None
            or out.action in ("bypass", "shadow", "server-history")
            or not is_event_stream(raw)
            or header(raw, b"content-encoding")
        ):
            return False
        return out.tokens_sent >= NEAR_WINDOW * self.context.input_window(self.request)

    async def _opening(self, response: httpx.Response) -> Answer:
        """A Responses stream with its opening read: the same stream, and the overflow it
        reports if it does."""
        opening = await read_opening(
            response, seconds=self.settings.stream_overflow_wait, limit=OPENING_LIMIT
        )
        overflow = Overflow(opening.overflow, "stream") if opening.overflow else None
        return Answer(response, body=opening.body, overflow=overflow)

    async def _refusal(self, response: httpx.Response) -> Answer:
        """An upstream 400, read (up to a bound) to see whether it is a context-length error."""
        body, longer = await peek(response, OVERFLOW_BODY_LIMIT)
        if longer is not None:  # too long for a context-length error: relayed whole, as it is
            return Answer(response, body=longer)
        # Read decoded (an SDK accepts gzip, so an upstream's edge may compress its 400); the
        # client still gets the bytes the upstream sent.
        encoding = (header(response.headers.raw, b"content-encoding") or b"").decode("latin-1")
        decoded = inflated(body, encoding, OVERFLOW_BODY_LIMIT)
        message = context_overflow_message(decoded) if decoded is not None else None
        overflow = Overflow(message, "response") if message else None
        return Answer(response, buffered=body, overflow=overflow)

    async def _post(self, outcome: Outcome) -> httpx.Response:
        self.overhead = time.perf_counter() - self.request.started
        # An answer that may call the expand tool is read by us: asked for uncompressed.
        identity = outcome.injected_usage or outcome.expand is not None
        headers = upstream_headers(self.client_headers, injected_usage=identity)
        t0 = time.perf_counter()
        response = await self.route.upstream.send("POST", self.url, headers, outcome.content)
        self.ttfb = time.perf_counter() - t0
        self.status = response.status_code
        self.context.metrics.observe_upstream(response.status_code, self.ttfb)
        return response

    async def _expanded(self, response: httpx.Response, plan: ExpandPlan) -> httpx.Response:
        """The answer the client gets when the model may call the expand tool."""
        headers = upstream_headers(self.client_headers, injected_usage=True)

        async def send(content: bytes) -> httpx.Response:
            t0 = time.perf_counter()
            answer = await self.route.upstream.send("POST", self.url, headers, content)
            self.context.metrics.observe_upstream(answer.status_code, time.perf_counter() - t0)
            return answer

        options = plan.body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        store, metrics = self.context.store, self.context.metrics
        self.expander = Expander(
            plan,
            send=send,
            resolve=functools.partial(resolve_within, store, conversation=plan.conversation),
            observe=metrics.expand_call,
            stream=plan.body.get("stream") is True,
            client_wants_usage=asked or self.outcome.injected_usage,
        )
        return await self.expander.respond(response)

    async def _relay(
        self, response: httpx.Response, body: AsyncIterator[bytes] | None = None
    ) -> None:
        raw = response.headers.raw
        encoding = (header(raw, b"content-encoding") or b"").decode("latin-1")
        tap: SSEUsageTap | _Copy | None = None
        read = self.route.api.read_usage
        stripping = self.outcome.injected_usage and is_event_stream(raw) and not encoding
        if stripping:
            tap = SSEUsageTap(
                strip_usage_chunk=True,
                strip_usage_null=self.settings.strip_usage_null,
                max_event_bytes=self.settings.max_sse_event_bytes,
            )
        elif self.context.accountant is not None or self._calibrated():
            tap = (
                SSEUsageTap(
                    content_encoding=encoding,
                    max_event_bytes=self.settings.max_sse_event_bytes,
                    read=read,
                )
                if is_event_stream(raw)
                else _Copy(JSON_USAGE_LIMIT)
            )
        flush = tap.close if isinstance(tap, SSEUsageTap) else None
        api = self.route.api
        end = stream_end(responses=api is RESPONSES_API, anthropic=api.anthropic)
        result = await relay(
            self.client,
            response,
            self._our_headers(),
            _watched(tap.feed if tap else None, end.see),
            flush,
            body=body,
            error_event=end.event,
            reframed=stripping,
        )
        self.error = self.error or result.error
        if isinstance(tap, SSEUsageTap):
            self.usage = tap.usage
        elif isinstance(tap, _Copy) and tap.size <= tap.limit:
            self.usage = usage_from_json(b"".join(tap.chunks), encoding, read)

    def _calibrate(self, usage: Usage) -> None:
        """Teach the calibration what the upstream counted for what we estimated we sent."""
        calibration, out = self.context.calibration, self.outcome
        if calibration is None or out.action == "server-history" or usage.server_tool_uses:
            return  # the upstream counted history (or search results) the request does not carry
        sent = out.tokens_sent
        if sent:
            api, model, body = self.route.api.name, self.request.model, self.request.body
            calibration.observe(api, model, sent, usage.prompt_tokens, body)

    def _calibrated(self) -> bool:
        calibration = self.context.calibration
        return calibration is not None and self.route.api.name in calibration.apis

    def _our_headers(self) -> RawHeaders:
        values = self.outcome.headers()
        values["overhead-ms"] = f"{self.overhead * 1000:.3f}"
        values["api"] = self.route.api.name
        if self.outcome.retried:
            values["retried"] = "context-length"
        return compactd_headers(values)

    def _activity(self, model: str) -> ActivityDelta:
        """This request as its conversation's activity (the conversation list's figures)."""
        out, req = self.outcome, self.request
        before = out.tokens_before or 0
        return ActivityDelta(
            tenant=req.tenant or ANONYMOUS,
            conversation=out.conversation,
            api=req.dialect.name,
            model=model,
            seen_at=time.time(),
            counters={
                "requests": 1,
                "compactions": int(out.action == "compacted"),
                "tokens_before": before,
                "tokens_after": out.tokens_sent or before,
            },
        )

    def finish(self, *, cancelled: bool) -> None:
        """Metrics now; the log line and the store's accounting off the request path."""
        out, req = self.outcome, self.request
        model = req.model or "unknown"
        accepted = self.status is not None and 200 <= self.status < 300
        if accepted and self.usage is not None and out.answered is not None:
            out.answered(self.usage.prompt_tokens, self.usage.cached_tokens)  # this request's own
        if self.expander is not None and self.expander.usage is not None:
            self.usage = add_usage(self.usage, self.expander.usage)  # the continuations' too
        before = out.tokens_before or 0
        after = out.tokens_after if out.tokens_after is not None else before
        self.context.metrics.observe_request(
            action=out.action,
            model=model,
            policy=out.policy or "none",
            tokens_before=before,
            tokens_after=after,
            overhead_seconds=self.overhead,
            api=req.dialect.name,
        )
        if self.usage is not None:
            self.context.metrics.observe_usage(
                model=model,
                prompt_tokens=self.usage.prompt_tokens,
                cached_tokens=self.usage.cached_tokens,
                completion_tokens=self.usage.completion_tokens,
                cache_write_tokens=self.usage.cache_write_tokens,
                api=req.dialect.name,
            )
        log_request(
            request_log(
                request_id=uuid.uuid4().hex[:16],
                tenant=req.key_id,
                model=req.model or None,
                policy=out.policy or None,
                action=out.action,
                tokens_before=out.tokens_before,
                tokens_after=out.tokens_after,
                upstream_status=self.status,
                overhead_ms=self.overhead * 1000,
                ttfb_ms=None if self.ttfb is None else self.ttfb * 1000,
                error="client disconnected" if cancelled else self.error,
                conversation=out.conversation or None,
                prompt_tokens=self.usage.prompt_tokens if self.usage else None,
                cached_tokens=self.usage.cached_tokens if self.usage else None,
                completion_tokens=self.usage.completion_tokens if self.usage else None,
            )
        )
        # Only requests the upstream accepted: a client with a made-up key or model name must
        # not be able to create rows that live for months.
        if accepted and self.usage is not None:
            self._calibrate(self.usage)
        if self.context.accountant is not None and req.body is not None and accepted:
            if out.conversation:
                self.context.accountant.add_activity(self._activity(model))
            self.context.accountant.add(
                UsageRecord(
                    tenant=req.tenant or ANONYMOUS,
                    policy=out.policy or "none",
                    model=model,
                    day=self.context.accountant.today(),
                    action=out.action,
                    tokens_before=before,
                    tokens_after=after,
                    prompt_tokens=self.usage.prompt_tokens if self.usage else 0,
                    cached_tokens=self.usage.cached_tokens if self.usage else 0,
                    completion_tokens=self.usage.completion_tokens if self.usage else 0,
                    cache_write_tokens=self.usage.cache_write_tokens if self.usage else 0,
                    api=req.dialect.name,
                    fail_open=fail_open_reason(out.error) if out.action == "error" else "",
                )
            )


async def _send_buffered(
    send: Send, response: httpx.Response, body: bytes, extra: RawHeaders
) -> None:
    """Relay a response we already read (the upstream's own 400)."""
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": response_headers(response.headers.raw) + extra,
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
