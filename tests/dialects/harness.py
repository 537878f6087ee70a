"""compactd in-process in front of the fake Responses and Messages upstreams.

One transport serves both upstreams, as in production (one pool): requests to
`http://openai.test/v1` reach the fake Responses API, those to `http://anthropic.test` the fake
Messages API, both through httpx's ASGI transport.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from proxy.app.application import CompactdApp, create_app
from proxy.app.services import Services
from proxy.config import APIS, load_settings
from proxy.providers.registry import ProviderRegistry
from tests.api_fakes import FakeMessages, FakeResponses
from tests.inprocess import lifespan

KEY = "sk-alpha"


class _ByHost:
    def __init__(self, responses: FakeResponses, messages: FakeMessages) -> None:
        self.responses = responses
        self.messages = messages

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        host = dict(scope["headers"]).get(b"host", b"")
        app = self.messages if host.startswith(b"anthropic.test") else self.responses
        await app(scope, receive, send)


@dataclass
class Harness:
    app: CompactdApp
    client: httpx.AsyncClient
    responses: FakeResponses
    messages: FakeMessages
    sent: list[bytes] = field(default_factory=list)
    """Every body posted through `chat`, `create` and `message`, as sent."""

    @property
    def services(self) -> Services:
        services: Services = self.app.router.state.services
        return services

    async def chat(self, body: dict[str, Any], key: str = KEY, **headers: str) -> httpx.Response:
        """POST /v1/chat/completions (to the same fake upstream as the Responses API)."""
        return await self._post(
            "/v1/chat/completions", body, {"authorization": f"Bearer {key}"}, headers
        )

    async def _post(
        self, path: str, body: dict[str, Any], auth: dict[str, str], headers: dict[str, str]
    ) -> httpx.Response:
        self.sent.append(json.dumps(body).encode())
        return await self.client.post(
            path,
            content=self.sent[-1],
            headers={**auth, "content-type": "application/json", **headers},
        )

    async def create(self, body: dict[str, Any], key: str = KEY, **headers: str) -> httpx.Response:
        """POST /v1/responses."""
        return await self._post("/v1/responses", body, {"authorization": f"Bearer {key}"}, headers)

    async def message(self, body: dict[str, Any], key: str = KEY, **headers: str) -> httpx.Response:
        """POST /v1/messages, as the anthropic SDK sends it (x-api-key, anthropic-version)."""
        auth = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        return await self._post("/v1/messages", body, auth, headers)

    async def uncompress(self, body: dict[str, Any], key: str = KEY) -> httpx.Response:
        return await self.client.post(
            "/compactd/v1/uncompress", json=body, headers={"authorization": f"Bearer {key}"}
        )

    async def compacted(self, api: str, body: dict[str, Any]) -> list[Any]:
        """Send an over-budget request; assert it was compacted into a request the fake
        upstream accepted; the history it received (`input` or `messages`)."""
        send, fake, key = (
            (self.create, self.responses, "input")
            if api == "responses"
            else (self.message, self.messages, "messages")
        )
        response = await send(body)
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-action"] == "compacted"
        assert fake.refused == []
        sent: list[Any] = fake.last.json()[key]
        assert len(json.dumps(sent)) < len(json.dumps(body[key])) * 0.8
        return sent

    def metric(self, name: str, **labels: str) -> float:
        body, _ = self.services.metrics.render()
        for line in body.decode().splitlines():
            if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rpartition(" ")[2])
        return 0.0


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path, registry: ProviderRegistry | None = None, **sections: Any
) -> AsyncIterator[Harness]:
    """compactd with config `sections` (and providers from `registry`) in front of both fakes."""
    responses, messages = FakeResponses(), FakeMessages()
    if "default_policy" in sections:
        # A test's cap makes compaction happen on every API; the shipped default leaves the
        # Messages API uncapped (`cap_apis`).
        sections["default_policy"] = {"cap_apis": list(APIS), **sections["default_policy"]}
    overrides: dict[str, Any] = {
        **sections,
        "upstream": {
            "url": "http://openai.test/v1",
            "anthropic_url": "http://anthropic.test",
            **sections.get("upstream", {}),
        },
        "server": {"data_dir": str(tmp_path / "data"), **sections.get("server", {})},
    }
    settings = load_settings(None, env={}, overrides=overrides)
    transport = httpx.ASGITransport(app=_ByHost(responses, messages))  # type: ignore[arg-type]
    app = create_app(settings, transport=transport, registry=registry)
    async with lifespan(app):
        asgi = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=asgi, base_url="http://compactd") as client:
            yield Harness(app, client, responses, messages)
