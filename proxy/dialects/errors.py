"""The APIs' own error shapes, where they are not OpenAI's chat shape (`proxy.errors`).

Anthropic's: what compactd answers on `/v1/messages*` when the failure is its own.
`{"type": "error", "error": {"type": ..., "message": ...}}`, the type named by status as the
Messages API names it, so the anthropic SDK raises its usual exception classes; in a stream, an
`event: error` the SDK raises as well (never a fake `message_stop`).

The Responses API's: a stream that fails after it started ends with its typed `error` event
(`ResponsesStreamError`), never a fake `response.completed`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from starlette.types import Send

from proxy.errors import ProxyError
from proxy.wire.asgi import send_error, send_json

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


_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


class ResponsesStreamError:
    """The `error` event ending a Responses stream that failed after it started.

    In the API's shape: `type`, `code`, `message`, `param` and the `sequence_number` after the
    last event relayed (`see` is shown every chunk that went out), as the API reference has it,
    and the same fields under `error`, as the API itself sends them: typed clients read the
    first, the openai SDK raises APIError on the second.
    """

    def __init__(self, message: str) -> None:
        self._message = message
        self._next = 0

    def see(self, chunk: bytes) -> bytes:
        """Note the last sequence number a relayed chunk carries; the chunk, unchanged."""
        at = chunk.rfind(b'"sequence_number"')
        found = _SEQUENCE.match(chunk, at) if at >= 0 else None
        if found is not None and found.end() < len(chunk):  # not cut off by the chunk's end
            self._next = int(found[1]) + 1
        return chunk

    def event(self) -> bytes:
        """The event, numbered after what the client has seen."""
        fields = {"code": "upstream_error", "message": self._message, "param": None}
        error = {"type": "server_error", **fields}
        data = {"type": "error", **fields, "sequence_number": self._next, "error": error}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


async def send_api_error(
    send: Send, exc: ProxyError, headers: list[tuple[bytes, bytes]], *, anthropic: bool
) -> None:
    """compactd's own error in the shape of the API the client called."""
    if not anthropic:
        await send_error(send, exc, headers)
        return
    await send_json(send, exc.status, anthropic_error_body(exc.status, exc.message), headers)


_MID_STREAM = "The upstream connection failed mid-stream."
Feed = Callable[[bytes], bytes]
"""What the relay passes every chunk through (`relay`'s `tap`)."""


@dataclass(frozen=True)
class StreamEnd:
    """How a stream that fails mid-way ends: `event` in its API's shape (None: OpenAI's chat
    shape), made when needed from what `see` was shown of the relayed bytes."""

    event: bytes | Callable[[], bytes] | None = None
    see: Feed | None = None


def stream_end(*, responses: bool, anthropic: bool) -> StreamEnd:
    """How a stream of this API that fails mid-way ends."""
    if anthropic:
        return StreamEnd(anthropic_sse_error(_MID_STREAM))
    if responses:
        error = ResponsesStreamError(_MID_STREAM)
        return StreamEnd(error.event, error.see)
    return StreamEnd()
