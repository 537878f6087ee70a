"""Issue 11, item 4: a context window is learned only from a trustworthy upstream error, never
below a sane floor, and it is shared per upstream + model through the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.security.conftest import history
from tests.tiny_model import tiny_model
from tests.upstream import FakeUpstream, respond, serve

A = {"authorization": "Bearer sk-attacker"}
B = {"authorization": "Bearer sk-victim"}


def _overflow(message: str) -> Any:
    error = {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}
    return respond(400, {"error": error})


async def _post(http: httpx.AsyncClient, url: str, model: str, msgs: list[Any], key: Any) -> Any:
    body = {"model": model, "messages": msgs}
    return await http.post(f"{url}/v1/chat/completions", json=body, headers=key)


async def test_an_echoed_tiny_window_does_not_reach_other_tenants(upstream, make_proxy) -> None:
    fake, base = upstream
    msgs = history(68)  # ~8,800 tokens: far under gpt-4o's 128k window
    async with make_proxy(base) as url, httpx.AsyncClient() as http:
        sent = int((await _post(http, url, "gpt-4o", msgs, A)).headers["x-compactd-tokens-before"])
        # An upstream validation error echoing client text, once bare, once with figures that
        # match the request exactly (the attacker knows what it sent).
        fake.then(_overflow("Invalid 'x': This model's maximum context length is 64 tokens."))
        await _post(http, url, "gpt-4o", history(68, "a"), A)
        fake.then(
            _overflow(
                f"This model's maximum context length is 64 tokens. However, your messages "
                f"resulted in {sent} tokens."
            )
        )
        await _post(http, url, "gpt-4o", msgs, A)
        victim = await _post(http, url, "gpt-4o", history(68, "victim"), B)
    assert victim.status_code == 200
    assert victim.headers["x-compactd-action"] == "passthrough"
    assert int(victim.headers["x-compactd-tokens-before"]) > 8000


async def test_a_learned_window_is_shared_by_instances_of_the_same_upstream_only(
    upstream, make_proxy, tmp_path: Path
) -> None:
    fake, base = upstream
    store = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    tokens = tiny_model(tmp_path)
    msgs = history(8)
    async with make_proxy(base, store=store, tokens=tokens) as first, httpx.AsyncClient() as http:
        sent = int(
            (await _post(http, first, "tiny-1", msgs, A)).headers["x-compactd-tokens-before"]
        )
        fake.then(
            _overflow(
                f"This model's maximum context length is {sent - 200} tokens. However, your "
                f"messages resulted in {sent} tokens."
            )
        )
        learned = await _post(http, first, "tiny-1", msgs, A)
    other_fake = FakeUpstream()
    async with (
        serve(other_fake) as other_base,
        make_proxy(base, store=store, tokens=tokens) as second,
        make_proxy(f"{other_base}/v1", store=store, tokens=tokens) as elsewhere,
        httpx.AsyncClient() as http,
    ):
        same = await _post(http, second, "tiny-1", history(8, "b"), B)
        other = await _post(http, elsewhere, "tiny-1", history(8, "c"), B)
    assert learned.headers["x-compactd-retried"] == "context-length"
    assert same.headers["x-compactd-action"] == "compacted"  # before it was ever refused
    assert other.headers["x-compactd-action"] == "passthrough"
