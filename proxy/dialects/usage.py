"""The upstream's own `usage` in the Responses and Messages shapes (see `proxy.wire.usage`).

- Responses: a response object's `usage` (`input_tokens`, `input_tokens_details.cached_tokens`,
  `output_tokens`), in a JSON body or in the `response.completed` (`.incomplete`, `.failed`)
  event of a stream.
- Messages: `usage` counts the uncached input apart: the prompt is `input_tokens` +
  `cache_creation_input_tokens` + `cache_read_input_tokens`. A stream carries it in
  `message_start` and updates it (output, and cumulative input fields) in `message_delta`.
  `server_tool_use` counts the web searches and fetches the upstream ran for the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.wire.usage import Usage, usage_of

_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _n(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def responses_usage(obj: object, previous: Usage | None) -> Usage | None:
    """The usage of a response object or of its final stream event."""
    del previous
    if not isinstance(obj, dict):
        return None
    if obj.get("type") in _RESPONSE_EVENTS and isinstance(obj.get("response"), dict):
        obj = obj["response"]
    return usage_of(obj, "input_tokens", "output_tokens")


def messages_usage(obj: object, previous: Usage | None) -> Usage | None:
    """The usage of a message, of `message_start`, or `message_delta`'s update of it."""
    if not isinstance(obj, Mapping):
        return None
    kind = obj.get("type")
    if kind == "message_start" and isinstance(obj.get("message"), Mapping):
        obj = obj["message"]
    usage = obj.get("usage") if isinstance(obj, Mapping) else None
    if not isinstance(usage, Mapping):
        return None
    base = previous if kind == "message_delta" and previous is not None else Usage()
    uncached = _field(
        usage, "input_tokens", base.prompt_tokens - base.cached_tokens - base.cache_write_tokens
    )
    written = _field(usage, "cache_creation_input_tokens", base.cache_write_tokens)
    read = _field(usage, "cache_read_input_tokens", base.cached_tokens)
    tools = usage.get("server_tool_use")
    return Usage(
        prompt_tokens=uncached + written + read,
        completion_tokens=_field(usage, "output_tokens", base.completion_tokens),
        cached_tokens=read,
        cache_write_tokens=written,
        server_tool_uses=(
            sum(map(_n, tools.values())) if isinstance(tools, Mapping) else base.server_tool_uses
        ),
    )


def _field(usage: Mapping[str, Any], key: str, default: int) -> int:
    """A counter the event carries, else what was known before (deltas may omit them)."""
    return _n(usage[key]) if usage.get(key) is not None else default
