"""Near the trigger, Anthropic's own count: `POST /v1/messages/count_tokens` (free).

compactd's Messages API counts are estimates (`proxy.tokens.calibration`). Where a wrong estimate
changes the decision, a request whose estimate is within `tokens.count_tokens_band` of its
trigger is counted by the upstream first, with the client's own credential and headers and the
fields the endpoint takes. The decision then uses that count (the budget scaled by the
request's own ratio), and the calibration learns from it. Anything but a prompt, well-formed
answer (an error, a timeout, a body that is not `{"input_tokens": N}`) leaves the estimate as it
was: the confirmation can only make a decision better informed, never block one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import orjson

from proxy.errors import ProxyError
from proxy.wire.forward import Upstream, peek
from proxy.wire.headers import RawHeaders
from proxy.wire.rewrite import upstream_headers

log = logging.getLogger("compactd.confirm")

PATH = b"/messages/count_tokens"
FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "mcp_servers",
        "context_management",
        "output_format",
    }
)
"""What `count_tokens` takes of a Messages request (it refuses `max_tokens`, `stream`, …)."""
ANSWER_LIMIT = 16 * 1024

Confirm = Callable[[], Awaitable[int | None]]
"""The upstream's count of one request's input, or None."""


def count_body(body: Mapping[str, Any]) -> bytes:
    """The `count_tokens` request for a Messages request body."""
    return orjson.dumps({k: v for k, v in body.items() if k in FIELDS})


def near(tokens: int, trigger: int, band: float) -> bool:
    """Whether an estimate is close enough to the trigger for its error to matter."""
    return band > 0 and abs(tokens - trigger) <= band * trigger


def confirmer(
    upstream: Upstream, headers: RawHeaders, body: Mapping[str, Any], *, timeout: float
) -> Confirm:
    """A `Confirm` for this request (sent only when called)."""

    async def confirm() -> int | None:
        try:
            return await asyncio.wait_for(_count(upstream, headers, body), timeout)
        except (ProxyError, TimeoutError, httpx.HTTPError) as exc:
            log.info("count_tokens not confirmed", extra={"error": type(exc).__name__})
            return None

    return confirm


async def _count(upstream: Upstream, headers: RawHeaders, body: Mapping[str, Any]) -> int | None:
    url = upstream.url(PATH, b"")
    response = await upstream.send(
        "POST", url, upstream_headers(headers, injected_usage=True), count_body(body)
    )
    try:
        raw, longer = await peek(response, ANSWER_LIMIT)
    finally:
        await response.aclose()
    if response.status_code != 200 or longer is not None:
        log.info("count_tokens not confirmed", extra={"status": response.status_code})
        return None
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = answer.get("input_tokens") if isinstance(answer, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    return value
