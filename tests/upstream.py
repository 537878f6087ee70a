"""A scriptable fake OpenAI upstream, served by a real uvicorn socket in tests.

It records every request it receives (method, path, headers, body bytes) and answers with the
next scripted behaviour: JSON, slow SSE, a mid-stream failure, a hang, an error status or binary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Received:
    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.decode().lower() == name.lower():
                return v.decode()
        return None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Ctx:
    request: Received
    receive: Receive
    send: Send
    upstream: FakeUpstream


Behaviour = Callable[[Ctx], Awaitable[None]]


def chat_completion(content: str = "Hello!", n: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-4o-2024-08-06",
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
            for i in range(n)
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        **extra,
    }


def sse_chunks(words: list[str], usage: bool = False) -> list[bytes]:
    """OpenAI-shaped chat.completion.chunk events, ending in [DONE]."""
    events = []
    for i, w in enumerate(words):
        delta: dict[str, Any] = {"content": w}
        if i == 0:
            delta["role"] = "assistant"
        chunk = {
            "id": "chatcmpl-s",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-4o",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    if usage:
        u = {
            "id": "chatcmpl-s",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-4o",
            "choices": [],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": len(words),
                "total_tokens": 9 + len(words),
            },
        }
        events.append(b"data: " + json.dumps(u).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def respond(
    status: int = 200,
    body: bytes | dict[str, Any] | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: bytes = b"application/json",
) -> Behaviour:
    async def run(ctx: Ctx) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body or chat_completion()).encode()
        await ctx.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(raw)).encode()),
                    *(headers or []),
                ],
            }
        )
        await ctx.send({"type": "http.response.body", "body": raw})

    return run


def stream(
    events: list[bytes],
    *,
    delay: float = 0.0,
    gate: asyncio.Event | None = None,
    fail_after: int | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    gate_at: int = 1,
) -> Behaviour:
    """SSE: `gate` (if given) must be set before events after the first `gate_at` are sent;
    `fail_after` breaks the connection after that many events."""

    async def run(ctx: Ctx) -> None:
        watcher = asyncio.ensure_future(ctx.upstream.watch_disconnect(ctx.receive))
        await ctx.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    *(headers or []),
                ],
            }
        )
        try:
            for i, ev in enumerate(events):
                if ctx.upstream.disconnected.is_set():
                    return
                if fail_after is not None and i == fail_after:
                    raise ConnectionAbortedError("scripted mid-stream failure")
                if i == gate_at and gate is not None:
                    await gate.wait()
                await ctx.send({"type": "http.response.body", "body": ev, "more_body": True})
                if delay:
                    await asyncio.sleep(delay)
            await ctx.send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()

    return run


def hang() -> Behaviour:
    """Never answer; record when the proxy gives up the connection."""

    async def run(ctx: Ctx) -> None:
        await ctx.upstream.watch_disconnect(ctx.receive)

    return run


@dataclass
class FakeUpstream:
    received: list[Received] = field(default_factory=list)
    script: deque[Behaviour] = field(default_factory=deque)
    default: Behaviour = field(default_factory=respond)
    request_seen: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    body_chunks: list[int] = field(default_factory=list)
    first_body_chunk: asyncio.Event = field(default_factory=asyncio.Event)

    def then(self, *behaviours: Behaviour) -> FakeUpstream:
        self.script.extend(behaviours)
        return self

    @property
    def last(self) -> Received:
        return self.received[-1]

    async def watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                return
            if message.get("body"):
                self.body_chunks.append(len(message["body"]))
                self.first_body_chunk.set()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        path = scope["raw_path"].decode() + (
            ("?" + scope["query_string"].decode()) if scope["query_string"] else ""
        )
        req = Received(scope["method"], path, list(scope["headers"]), b"".join(chunks))
        self.received.append(req)
        self.request_seen.set()
        behaviour = self.script.popleft() if self.script else self.default
        await behaviour(Ctx(req, receive, send, self))


@contextlib.asynccontextmanager
async def serve(app: Any, *, lifespan: str = "off", **options: Any) -> AsyncIterator[str]:
    """Serve an ASGI app on a free loopback port with a real uvicorn server (`options`: more
    uvicorn.Config arguments, e.g. compactd's own HTTP protocol)."""
    import socket

    import uvicorn

    from proxy.app.server import KEEP_ALIVE_SECONDS

    # Idle connections are kept as `compactd serve` keeps them, longer than the clients here keep
    # theirs (the tests' httpx 5 s, compactd's upstream pool 30 s). uvicorn's own 5 s equals
    # httpx's expiry: a request sent on a connection the instant it closes met a reset.
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_SECONDS)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, access_log=False, **options
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server did not start")
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        sock.close()


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serve_raw(handle: RawHandler) -> AsyncIterator[str]:
    """A bare asyncio server for upstreams no HTTP server would be (misbehaving on purpose):
    yields its base URL ending in /v1."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        await server.wait_closed()
