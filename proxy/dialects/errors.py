"""Anthropic-shaped errors: what compactd answers on `/v1/messages*` when the failure is its own.

`{"type": "error", "error": {"type": ..., "message": ...}}`, the type named by status as the
Messages API names it, so the anthropic SDK raises its usual exception classes; in a stream, an
`event: error` the SDK raises as well (never a fake `message_stop`).
"""

from __future__ import annotations

import orjson
from starlette.types import Send

from proxy.asgi import send_error, send_json
from proxy.errors import ProxyError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "invalid_request_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(status: int, message: str) -> bytes:
    """The Messages API's error body for this status."""
    kind = _TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def anthropic_sse_error(message: str) -> bytes:
    """An `error` event ending an Anthropic stream that failed after it started."""
    return b"event: error\ndata: " + anthropic_error_body(502, message) + b"\n\n"


async def send_api_error(
    send: Send, exc: ProxyError, headers: list[tuple[bytes, bytes]], *, anthropic: bool
) -> None:
    """compactd's own error in the shape of the API the client called."""
    if not anthropic:
        await send_error(send, exc, headers)
        return
    await send_json(send, exc.status, anthropic_error_body(exc.status, exc.message), headers)
