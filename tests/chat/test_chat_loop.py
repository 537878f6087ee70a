"""The chat endpoint's loop: decide, send, re-plan once after a context overflow, relay.

The handler runs the steps; the exchange (`proxy.chat.exchange`) is handed its settings and
collaborators and never decides again by itself. The upstream is an `httpx.MockTransport`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message as AsgiMessage

from proxy.chat.exchange import ChatExchange, ExchangeContext, ExchangeSettings, Route
from proxy.chat.request import ChatRequest, Outcome
from proxy.dialects.apis import CHAT_API
from proxy.wire.forward import Timeouts, Upstream
from proxy.wire.upstream_keys import Gate
from tests.chat.test_decision import body, history
from tests.inprocess import MockUpstream, Proxy, Reply, context_length_error, reply, running
from tests.tiny_model import tiny_model
from tests.upstream import chat_completion

POLICY = {"budget_tokens": 100000}
RAW = body(history(8), model="tiny-1")


def count_replans(proxy: Proxy) -> list[str]:
    """The upstream messages the compactor is asked to re-plan after, as they come."""
    compactor = proxy.services.compactor
    replan = compactor.after_overflow
    asked: list[str] = []

    async def counted(request: ChatRequest, first: Outcome, message: str) -> Outcome | None:
        asked.append(message)
        return await replan(request, first, message)

    compactor.after_overflow = counted  # type: ignore[method-assign,assignment]
    return asked


@dataclass
class Chat:
    """What one long chat request met: the client's answer, the upstream's requests, and the
    re-plans the handler asked the compactor for."""

    response: httpx.Response
    received: list[httpx.Request]
    replans: list[str]
    retried: float


async def chat(tmp_path: Path, *answers: Reply) -> Chat:
    """A request of 8 turns to a 4,000-token model, the upstream answering with `answers`."""
    upstream = MockUpstream().then(*answers)
    async with running(
        tmp_path, upstream, default_policy=POLICY, tokens=tiny_model(tmp_path)
    ) as proxy:
        replans = count_replans(proxy)
        response = await proxy.chat(RAW)
        retried = proxy.metric(
            "compactd_context_overflows_total", where="response", outcome="retried"
        )
    return Chat(response, upstream.received, replans, retried)


async def test_an_overflow_is_replanned_once_and_the_second_answer_is_relayed(
    tmp_path: Path,
) -> None:
    second = chat_completion("the answer to the compacted retry")
    seen = await chat(tmp_path, context_length_error(1100), reply(200, second))
    assert len(seen.replans) == 1
    assert "maximum context length is 1100" in seen.replans[0]
    first, resent = seen.received
    assert first.content == RAW
    assert len(resent.content) < len(RAW)
    assert seen.response.status_code == 200
    assert seen.response.json() == second
    assert seen.response.headers["x-compactd-retried"] == "context-length"
    assert seen.retried == 1


async def test_an_overflow_of_the_retry_is_relayed_without_another_replan(tmp_path: Path) -> None:
    seen = await chat(tmp_path, context_length_error(1100), context_length_error(900))
    assert len(seen.replans) == 1
    assert len(seen.received) == 2
    assert seen.response.status_code == 400
    assert "maximum context length is 900" in seen.response.json()["error"]["message"]
    assert seen.response.headers["x-compactd-retried"] == "context-length"


class Client:
    """An ASGI `send` that keeps what the client would get."""

    def __init__(self) -> None:
        self.messages: list[AsgiMessage] = []

    async def __call__(self, message: AsgiMessage) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


@contextlib.asynccontextmanager
async def overflowing(
    tmp_path: Path, settings: ExchangeSettings, outcome: Outcome
) -> AsyncIterator[tuple[ChatExchange, Client]]:
    """An exchange built without a handler, handed its settings and collaborators, in front of
    an upstream that answers every request with a context-length 400."""
    upstream = Upstream(
        httpx.MockTransport(context_length_error(1100)), "http://upstream.test/v1", Timeouts()
    )
    async with running(tmp_path) as proxy:
        services = proxy.services
        headers = [(b"authorization", b"Bearer sk-alpha")]
        request = await services.compactor.read(outcome.content, headers)
        context = ExchangeContext(
            settings=settings,
            metrics=services.metrics,
            store=services.store,
            accountant=None,
            calibration=None,
            input_window=lambda request: 128_000,
        )
        route = Route(CHAT_API, upstream, Gate(services.tenancy, "", frozenset()))
        client = Client()
        url = upstream.url(b"/chat/completions", b"")
        yield (
            ChatExchange(
                context, client, url, headers=headers, request=request, outcome=outcome,
                route=route,
            ),
            client,
        )  # fmt: skip


def decided(**kw: Any) -> Outcome:
    return Outcome(action="passthrough", content=body(history(2)), **kw)


@pytest.mark.parametrize(
    ("retry_context_errors", "retried", "looked_at"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
async def test_an_exchange_looks_for_an_overflow_only_where_its_settings_and_outcome_say(
    tmp_path: Path, retry_context_errors: bool, retried: bool, looked_at: bool
) -> None:
    settings = ExchangeSettings(retry_context_errors=retry_context_errors)
    outcome = decided(retried=retried)
    async with overflowing(tmp_path, settings, outcome) as (exchange, client):
        answer = await exchange.send(outcome)
        assert (answer.overflow is not None) is looked_at
        if answer.overflow is not None:
            assert "maximum context length is 1100" in answer.overflow.message
            assert answer.overflow.where == "response"
        # Looked at or not, the client gets the upstream's own 400.
        await exchange.relay(answer)
    assert client.status == 400
    assert json.loads(client.body)["error"]["code"] == "context_length_exceeded"
    assert exchange.status == 400
