"""Small ASGI helpers: bounded body reading, disconnect watching, OpenAI-shaped error responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from proxy.errors import BodyTooLargeError, ClientDisconnectedError, ProxyError


def content_length(scope: Scope) -> int | None:
    """The request's declared Content-Length, if it has a valid one."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


async def read_body(receive: Receive, limit: int, declared: int | None) -> bytes:
    """The whole request body, refusing (413) before buffering more than `limit` bytes."""
    if declared is not None and declared > limit:
        raise BodyTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError
        body: bytes = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise BodyTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


class BodyStream:
    """The request body as an async iterator that is relayed without buffering it."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self._limit = limit
        self.done = asyncio.Event()
        self.error: Exception | None = None
        """Why the body stopped early; the transport wraps it, so the handler re-raises this."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    self.error = ClientDisconnectedError()
                    raise self.error
                body: bytes = message.get("body", b"")
                size += len(body)
                if size > self._limit:
                    self.error = BodyTooLargeError(
                        f"Request body exceeds the limit of {self._limit} bytes."
                    )
                    raise self.error
                if body:
                    yield body
                if not message.get("more_body", False):
                    return
        finally:
            self.done.set()


async def wait_for_disconnect(receive: Receive, body_done: asyncio.Event | None = None) -> None:
    """Return when the client disconnects (only listens once the body has been read)."""
    if body_done is not None:
        await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(
    work: Coroutine[Any, Any, None], receive: Receive, body_done: asyncio.Event | None = None
) -> bool:
    """Run `work`, cancelling it if the client disconnects first; True if it was cancelled.

    Covers every phase, including the wait for the upstream's first byte, where a response
    stream alone would not notice the client is gone. `work` runs in the calling task and only
    the watcher has a task of its own: a second task plus `asyncio.wait` cost ~10 % of a small
    request's CPU.
    """
    current = asyncio.current_task()
    assert current is not None
    flags = {"done": False, "disconnected": False}

    def on_watcher_done(watcher: asyncio.Future[None]) -> None:
        # The callback may run after `work` finished: then there is nothing left to cancel.
        if flags["done"] or watcher.cancelled() or watcher.exception() is not None:
            return
        flags["disconnected"] = True
        current.cancel()

    watcher = asyncio.ensure_future(wait_for_disconnect(receive, body_done))
    watcher.add_done_callback(on_watcher_done)
    try:
        await work
    except asyncio.CancelledError:
        if not flags["disconnected"]:
            raise
        current.uncancel()
        return True
    finally:
        flags["done"] = True
        watcher.cancel()
    return False


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """A complete JSON response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, exc: ProxyError, headers: list[tuple[bytes, bytes]]) -> None:
    """An OpenAI-shaped error response."""
    await send_json(send, exc.status, error_body(exc.message, exc.type, exc.code), headers)


def error_body(message: str, type_: str, code: str | None) -> bytes:
    """`{"error": {"message", "type", "param", "code"}}` as OpenAI sends it."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def sse_error_event(
    message: str, type_: str = "server_error", code: str = "upstream_error"
) -> bytes:
    """An SSE event the openai SDK raises as APIError; never followed by a fake [DONE]."""
    return b"data: " + error_body(message, type_, code) + b"\n\n"
