"""The opening of a Responses stream, read before any of it is relayed: an overflow in a 200.

OpenAI's Responses API refuses a streamed request whose input exceeds the model's context window
not with a 400 but inside the stream it has begun: `response.created` and `response.in_progress`,
then an `error` event (code `context_length_exceeded`) and `response.failed`, whose
`response.error` says the same. A 400 of that kind is retried compacted under the window (the
chat endpoint's loop re-plans with `Compactor.after_overflow`); to do the same for a stream, its
opening events are read before any is relayed. Events that only announce the response
(created, in progress, queued) are held; the first other event decides: an overflow, and
nothing has reached the client, so the request can be retried; anything else, and what was read
goes out first, then the rest as it arrives.

The hold is bounded in time (the API checks the input's length before it runs the model, so an
overflow is told at once; a response that is merely slow to start is not held past `seconds`)
and in bytes (`limit`): past either, what was read is relayed as it is. The relayed bytes are
the upstream's own, chunk for chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from proxy.tokens.budget import overflow_message

PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
"""Events that announce a response and say nothing of its fate."""


@dataclass
class Opening:
    overflow: str | None
    """The API's message, when the stream's first telling event reports a context overflow."""
    body: AsyncIterator[bytes]
    """Every chunk of the response, those read already included (for `relay`)."""


async def read_opening(response: httpx.Response, *, seconds: float, limit: int) -> Opening:
    """Read `response` (an uncompressed SSE stream) up to its first telling event, for at most
    `seconds` and `limit` bytes."""
    chunks = response.aiter_raw()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    read: list[bytes] = []
    events = _Events()
    while events.size <= limit:
        # Waited for without cancelling: a read cut off by the deadline is handed on whole.
        pending = asyncio.ensure_future(anext(chunks))
        pending.add_done_callback(_retrieved)
        done, _ = await asyncio.wait({pending}, timeout=max(0.0, deadline - loop.time()))
        if not done:
            return Opening(None, _chain(read, pending, chunks))
        error = pending.exception()
        if isinstance(error, StopAsyncIteration):
            break
        if error is not None:  # raised again where the relay reads it, and reported there
            return Opening(None, _chain(read, pending, chunks))
        chunk = pending.result()
        read.append(chunk)
        verdict = events.feed(chunk)
        if verdict is not None:
            return Opening(verdict or None, _chain(read, None, chunks))
    return Opening(None, _chain(read, None, chunks))


def _retrieved(future: asyncio.Future[bytes]) -> None:
    """Marks a read's failure as seen: a stream the relay never reads again (the request
    retried, the client gone) ends its last read with one, which is nobody's to report."""
    if not future.cancelled():
        future.exception()


class _Events:
    """SSE parsed as it is read: the verdict of the first event that is no announcement.

    Each byte is looked at once, however the upstream cuts its stream (a long event sent in
    small pieces is not copied again with each one)."""

    def __init__(self) -> None:
        self.size = 0
        self._text = bytearray()
        """What is read of the unfinished event, its line ends made LF."""
        self._cr = False
        """The last chunk ended with CR: the LF a next one may open it with belongs to it."""

    def feed(self, chunk: bytes) -> str | None:
        """ "" once an event that reports no overflow is read, the API's message once one that
        does is, None while only announcements have been."""
        self.size += len(chunk)
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._cr = chunk.endswith(b"\r")
        # Parsed with line ends made alike; the bytes relayed are the upstream's.
        start = max(0, len(self._text) - 1)  # a blank line may end with the first new byte
        self._text += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        while (end := self._text.find(b"\n\n", start)) >= 0:
            event = bytes(self._text[:end])
            del self._text[: end + 2]
            start = 0
            kind, payload = _parse(event)
            if kind is None:  # comment lines only (a keep-alive)
                continue
            if kind not in PREAMBLE:
                return _overflow(kind, payload) or ""
        return None


def _parse(event: bytes) -> tuple[str | None, Any]:
    """(the event's type, its data as JSON or None); (None, None) for comment lines alone."""
    name, data, seen = "", [], False
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        seen = True
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"data":
            data.append(value)
    if not seen:
        return None, None
    try:
        payload = orjson.loads(b"\n".join(data))
    except orjson.JSONDecodeError:
        return name or "message", None
    if isinstance(payload, Mapping) and isinstance(payload.get("type"), str):
        name = payload["type"]
    return name or "message", payload


def _overflow(kind: str, payload: Any) -> str | None:
    """The overflow message an `error` or `response.failed` event carries, if it does."""
    if not isinstance(payload, Mapping):
        return None
    error: Any
    if kind == "error":
        nested = payload.get("error")
        error = nested if isinstance(nested, Mapping) else payload
    elif kind == "response.failed":
        response = payload.get("response")
        error = response.get("error") if isinstance(response, Mapping) else None
    else:
        return None
    return overflow_message(error) if isinstance(error, Mapping) else None


async def _chain(
    read: list[bytes], pending: asyncio.Future[bytes] | None, rest: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    try:
        for chunk in read:
            yield chunk
        if pending is not None:
            try:
                chunk = await pending
            except StopAsyncIteration:
                return
            pending = None
            yield chunk
        async for chunk in rest:
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
