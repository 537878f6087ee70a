"""Every request is logged and counted; every chat response says what compactd did."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from pathlib import Path

import httpx
import pytest

from proxy.telemetry.access import route_class
from tests.conftest import ProxyFactory
from tests.live.test_compaction_e2e import history
from tests.upstream import FakeUpstream, serve_raw

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
# The README's header table says on which responses each header appears; these are the ones it
# promises on every readable chat request that is not a bypass.
_ROWS = re.findall(r"^\| `x-compactd-([a-z-]+)` \| [^|]+ \| ([^|]+) \|$", README, re.MULTILINE)
KEY = {"authorization": "Bearer sk-test-key"}
ALWAYS = tuple(name for name, on in _ROWS if on.strip().startswith("every"))


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _records(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


def test_the_readme_promises_the_decision_headers_on_every_chat_response() -> None:
    assert set(ALWAYS) >= {"action", "provider", "policy", "tokens-before", "conversation"}


@pytest.mark.parametrize(
    ("method", "path", "route"),
    [
        ("POST", "/v1/chat/completions", "chat"),
        ("GET", "/v1/chat/completions", "v1"),
        ("POST", "/v1/embeddings", "v1"),
        ("GET", "/compactd/v1/conversations", "api"),
        ("GET", "/compactd/ui/", "ui"),
        ("GET", "/compactd/ui", "ui"),
        ("GET", "/healthz", "health"),
        ("GET", "/metrics", "metrics"),
        ("GET", "/compactd/uix", "other"),
        ("GET", "/", "other"),
    ],
)
def test_route_classes_are_a_small_fixed_set(method: str, path: str, route: str) -> None:
    assert route_class(method, path) == route


async def test_every_route_gets_one_log_line_and_one_metric(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _, url = upstream
    small = {"max_body_bytes": 2000}
    async with (
        make_proxy(url, server=small) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        chat = {"model": "gpt-4o", "messages": history(2)}
        assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await http.get("/v1/models")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/nowhere")).status_code == 404
        assert (await http.request("PROPFIND", "/healthz")).status_code == 405
        big = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 3000}]}
        too_big = await http.post("/v1/chat/completions", content=json.dumps(big))
        assert too_big.status_code == 413
        metrics = (await http.get("/metrics")).text

    access = [(r.method, r.route, r.status, r.path) for r in _records(caplog, "compactd.access")]  # type: ignore[attr-defined]
    assert ("GET", "v1", 200, "/v1/models") in access
    assert ("GET", "health", 200, "/healthz") in access
    assert ("GET", "other", 404, "/nowhere") in access
    assert ("other", "health", 405, "/healthz") in access
    # The 413 was ours, before any chat decision: it still gets a line.
    assert ("POST", "chat", 413, "/v1/chat/completions") in access
    chats = _records(caplog, "compactd.request")
    assert len(chats) == 1  # the chat request's own line carries the access fields ...
    assert (chats[0].method, chats[0].route, chats[0].status) == ("POST", "chat", 200)  # type: ignore[attr-defined]
    assert chats[0].duration_ms > 0  # type: ignore[attr-defined]
    assert ("POST", "chat", 200) not in [a[:3] for a in access]  # ... so it has no second one
    counted = {
        ("POST", "chat", "200"): 1,
        ("POST", "chat", "413"): 1,
        ("GET", "v1", "200"): 1,
        ("GET", "health", "200"): 1,
        ("GET", "other", "404"): 1,
        ("other", "health", "405"): 1,
    }
    for (method, route, status), n in counted.items():
        labels = {"method": method, "route": route, "status": status}
        assert _metric(metrics, "compactd_http_requests_total", **labels) == n, labels
    assert _metric(metrics, "compactd_http_request_seconds_count", route="chat") == 2


async def test_a_passthrough_chat_response_carries_every_header_with_provider_none(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    _, url = upstream
    async with make_proxy(url) as proxy, httpx.AsyncClient(base_url=proxy, headers=KEY) as http:
        response = await http.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": history(2)}
        )
    got = {k.removeprefix("x-compactd-"): v for k, v in response.headers.items()}
    assert got["action"] == "passthrough"
    assert got["provider"] == "none"
    for name in ALWAYS:
        assert got.get(name), f"x-compactd-{name} missing on passthrough"
    assert got["tokens-before"] == got["tokens-after"]


async def test_a_compacted_chat_response_names_its_providers(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    _, url = upstream
    async with (
        make_proxy(url, default_policy={"budget_tokens": 300}) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        response = await http.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": history(30)}
        )
    assert response.headers["x-compactd-action"] == "compacted"
    assert response.headers["x-compactd-provider"] not in ("", "none")
    for name in ALWAYS:
        assert response.headers.get(f"x-compactd-{name}"), name


def closing_upstream() -> contextlib.AbstractAsyncContextManager[str]:
    """An upstream that reads the request, then closes the connection without a byte."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
        await writer.wait_closed()

    return serve_raw(handle)


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_an_upstream_that_closes_without_answering_is_reported_as_that(
    make_proxy: ProxyFactory, transport: str
) -> None:
    async with (
        closing_upstream() as url,
        make_proxy(url, upstream={"transport": transport}) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        chat = await http.post(
            "/v1/chat/completions", json={"model": "gpt-4o", "messages": history(2)}
        )
        models = await http.get("/v1/models")
    for response in (chat, models):
        assert response.status_code == 502
        message = response.json()["error"]["message"]
        assert "closed the connection without answering" in message
        assert not re.search("timeout", message, re.IGNORECASE)


BYPASS = ("action", "provider", "policy", "overhead-ms")  # bypass counts nothing, by design


@pytest.mark.parametrize(
    ("policy", "headers", "action", "expected"),
    [
        ({"allow_bypass": True}, {"x-compactd-bypass": "1"}, "bypass", BYPASS),
        ({"mode": "shadow", "budget_tokens": 300}, {}, "shadow", (*ALWAYS, "shadow-action")),
        ({"mode": "off"}, {}, "passthrough", ALWAYS),
    ],
)
async def test_every_decision_carries_every_listed_header(
    upstream: tuple[FakeUpstream, str],
    make_proxy: ProxyFactory,
    policy: dict[str, object],
    headers: dict[str, str],
    action: str,
    expected: tuple[str, ...],
) -> None:
    _, url = upstream
    async with (
        make_proxy(url, default_policy=policy) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        response = await http.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o", "messages": history(30)},
            headers=headers,
        )
    assert response.headers["x-compactd-action"] == action
    for name in expected:
        assert response.headers.get(f"x-compactd-{name}"), f"x-compactd-{name} missing"


async def test_a_body_compactd_cannot_read_still_says_what_happened(
    upstream: tuple[FakeUpstream, str], make_proxy: ProxyFactory
) -> None:
    _, url = upstream
    async with make_proxy(url) as proxy, httpx.AsyncClient(base_url=proxy, headers=KEY) as http:
        response = await http.post("/v1/chat/completions", content=b"{not json")
    assert response.headers["x-compactd-action"] == "passthrough"
    assert response.headers["x-compactd-provider"] == "none"
    assert response.headers["x-compactd-overhead-ms"]
