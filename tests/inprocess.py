"""compactd in-process: the real app (create_app, its lifespan, the store, the providers) called
through httpx's ASGI transport, in front of an upstream that is an `httpx.MockTransport`.

For decisions, sequences and state machines: no sockets, no uvicorn. Streaming, disconnects and
timeouts are tested on real sockets (tests/upstream.py) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from proxy.app.application import CompactdApp, create_app
from proxy.app.services import Services
from proxy.config import load_settings
from proxy.providers.registry import ProviderRegistry
from proxy.store.base import Store
from tests.upstream import chat_completion

Reply = Callable[[httpx.Request], httpx.Response]


class _Body(httpx.AsyncByteStream):
    """A response body the proxy reads as a stream (as from a real transport)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.raw


def reply(status: int = 200, body: dict[str, Any] | None = None) -> Reply:
    """An upstream answer: JSON `body` (a chat completion by default) with `status`."""
    raw = json.dumps(body or chat_completion()).encode()

    def answer(request: httpx.Request) -> httpx.Response:
        del request
        headers = {"content-type": "application/json", "content-length": str(len(raw))}
        return httpx.Response(status, stream=_Body(raw), headers=headers)

    return answer


def context_length_error(window: int) -> Reply:
    """OpenAI's 400 for a request over the model's context window."""
    return reply(
        400,
        {
            "error": {
                "message": f"This model's maximum context length is {window} tokens. However, "
                "your messages resulted in more tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


@dataclass
class MockUpstream:
    """Records every request the proxy sends upstream; answers from a script, else `default`."""

    received: list[httpx.Request] = field(default_factory=list)
    script: deque[Reply] = field(default_factory=deque)
    default: Reply = field(default_factory=reply)

    def then(self, *replies: Reply) -> MockUpstream:
        self.script.extend(replies)
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.received.append(request)
        answer = self.script.popleft() if self.script else self.default
        return answer(request)

    @property
    def last(self) -> httpx.Request:
        return self.received[-1]

    def last_json(self) -> Any:
        return json.loads(self.last.content)


@dataclass
class Proxy:
    """A running in-process compactd."""

    app: CompactdApp
    client: httpx.AsyncClient
    upstream: MockUpstream
    conversations: list[str] = field(default_factory=list)
    """The `x-compactd-conversation` of every chat response, in order."""

    @property
    def services(self) -> Services:
        services: Services = self.app.router.state.services
        return services

    async def chat(
        self, body: dict[str, Any] | bytes, key: str = "sk-alpha", **headers: str
    ) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await self.client.post(
            "/v1/chat/completions",
            content=content,
            headers={
                "authorization": f"Bearer {key}",
                "content-type": "application/json",
                **{k.replace("_", "-"): v for k, v in headers.items()},
            },
        )
        self.conversations.append(response.headers.get("x-compactd-conversation", ""))
        return response

    async def uncompress(
        self,
        messages: list[dict[str, Any]],
        key: str = "sk-alpha",
        *,
        recursive: bool = True,
        conversation: str | None = None,
    ) -> httpx.Response:
        """Restore `messages` in `conversation` (by default the last chat's)."""
        named = conversation or next((c for c in reversed(self.conversations) if c), None)
        body: dict[str, Any] = {"messages": messages, "recursive": recursive}
        if named:
            body["conversation"] = named
        return await self.client.post(
            "/compactd/v1/uncompress", json=body, headers={"authorization": f"Bearer {key}"}
        )

    def metric(self, name: str, **labels: str) -> float:
        """The current value of one sample of the proxy's Prometheus metrics (0 if absent)."""
        body, _ = self.services.metrics.render()
        want = name + (
            "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
        )
        for line in body.decode().splitlines():
            if line.startswith("#"):
                continue
            sample, _, value = line.rpartition(" ")
            if _sorted_labels(sample) == want:
                return float(value)
        return 0.0


def _sorted_labels(sample: str) -> str:
    if "{" not in sample:
        return sample
    name, _, rest = sample.partition("{")
    labels = sorted(rest.rstrip("}").split(","))
    return name + "{" + ",".join(labels) + "}"


@contextlib.asynccontextmanager
async def lifespan(app: CompactdApp) -> AsyncIterator[None]:
    """Drive the ASGI lifespan protocol (what uvicorn does at start-up and shut-down)."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.ensure_future(app(scope, inbox.get, outbox.put))  # type: ignore[arg-type]
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        await task
        raise RuntimeError(f"start-up failed: {started}")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task


EMBEDDED_STORE_TIMEOUT_MS = 20_000
"""store.timeout_ms of a test that does not choose its store (the embedded SQLite file): a shared
2-core machine can stall a SQLite write past the 200 ms default, and the request fails open
('error' where the test expects 'compacted'; test_expand failed a land so). A store outage is
tested where a test chooses its store and timeout (tests/faults, tests/store)."""


def embedded_store(store: dict[str, Any]) -> dict[str, Any]:
    """The `store` section with the roomy timeout, unless the test names a store or a timeout."""
    if "url" in store or "timeout_ms" in store:
        return store
    return {**store, "timeout_ms": EMBEDDED_STORE_TIMEOUT_MS}


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path,
    upstream: MockUpstream | None = None,
    *,
    registry: ProviderRegistry | None = None,
    backend: Store | None = None,
    **sections: Any,
) -> AsyncIterator[Proxy]:
    """compactd with config `sections` (e.g. default_policy={...}, store={...}) in front of
    `upstream`; `backend` replaces the configured store."""
    upstream = upstream or MockUpstream()
    overrides: dict[str, Any] = {
        **sections,
        "upstream": {"url": "http://upstream.test/v1", **sections.get("upstream", {})},
        "server": {"data_dir": str(tmp_path / "data"), **sections.get("server", {})},
        "store": embedded_store(sections.get("store", {})),
    }
    settings = load_settings(None, env={}, overrides=overrides)
    app = create_app(
        settings, transport=httpx.MockTransport(upstream.handle), registry=registry, store=backend
    )
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
            yield Proxy(app, client, upstream)
