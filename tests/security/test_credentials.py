"""Issue 11, item 1: every credential form is a tenant of its own; no credential stores nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from tests.security.conftest import SMALL, history

# One client per credential form a real SDK or gateway sends.
FORMS = {
    "bearer": {"authorization": "Bearer sk-bearer"},
    "azure": {"api-key": "azure-key"},
    "anthropic": {"x-api-key": "sk-ant-key"},
    "basic": {"authorization": "Basic dXNlcjpwYXNz"},
    "token": {"authorization": "Token tok-123"},
}


@asynccontextmanager
async def _proxied(make_proxy, base: str, store_url: str, **extra: Any) -> AsyncIterator[Any]:
    """compactd on `store_url` with a 600-token budget, and an HTTP client: (url, client)."""
    async with make_proxy(base, store={"url": store_url}, **SMALL, **extra) as url:
        async with httpx.AsyncClient() as http:
            yield url, http


async def _chat(http: httpx.AsyncClient, url: str, headers: dict[str, str], tag: str) -> Any:
    body = {"model": "gpt-4o", "messages": history(6, tag)}
    return await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)


async def test_each_credential_form_sees_only_its_own_conversations(
    upstream, make_proxy, store_url: str
) -> None:
    async with _proxied(make_proxy, upstream[1], store_url) as (url, http):
        convs = {}
        for name, headers in FORMS.items():
            r = await _chat(http, url, headers, name)
            assert r.headers["x-compactd-action"] == "compacted", name
            convs[name] = r.headers["x-compactd-conversation"]
        listed = {
            name: await http.get(f"{url}/compactd/v1/conversations", headers=headers)
            for name, headers in FORMS.items()
        }
        foreign = await http.get(
            f"{url}/compactd/v1/conversations/{convs['azure']}", headers=FORMS["anthropic"]
        )
        purge = await http.delete(
            f"{url}/compactd/v1/conversations/{convs['basic']}", headers=FORMS["token"]
        )
    for name, r in listed.items():
        assert [c["conversation"] for c in r.json()["data"]] == [convs[name]], name
    assert foreign.status_code == 404
    assert purge.status_code == 404


async def test_a_client_without_credentials_is_never_stored_and_gets_401(
    upstream, make_proxy, store_url: str
) -> None:
    fake, base = upstream
    async with _proxied(make_proxy, base, store_url) as (url, http):
        owner = await _chat(http, url, FORMS["azure"], "owned")
        conv = owner.headers["x-compactd-conversation"]
        sent = fake.last.json()["messages"]
        body = orjson.dumps({"model": "gpt-4o", "messages": history(6, "anon")})
        anon = await http.post(f"{url}/v1/chat/completions", content=body)
        forwarded = fake.last.body
        calls = [
            await http.get(f"{url}/compactd/v1/conversations"),
            await http.get(f"{url}/compactd/v1/conversations/{conv}"),
            await http.post(f"{url}/compactd/v1/uncompress", json={"messages": sent}),
            await http.delete(f"{url}/compactd/v1/conversations/{conv}"),
        ]
        still_there = await http.get(
            f"{url}/compactd/v1/conversations/{conv}", headers=FORMS["azure"]
        )
    assert anon.status_code == 200
    assert anon.headers["x-compactd-action"] == "passthrough"
    assert anon.headers["x-compactd-store"] == "no-credential"
    assert forwarded == body  # the original bytes, uncompacted
    for r in calls:
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert still_there.status_code == 200


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_the_shared_anonymous_tenant_is_one_bucket_when_turned_on(
    upstream, make_proxy, store_url: str
) -> None:
    server = {"shared_anonymous_tenant": True}
    async with _proxied(make_proxy, upstream[1], store_url, server=server) as (url, http):
        r = await _chat(http, url, {}, "shared")
        listed = await http.get(f"{url}/compactd/v1/conversations")
        keyed = await http.get(f"{url}/compactd/v1/conversations", headers=FORMS["bearer"])
    assert r.headers["x-compactd-action"] == "compacted"
    assert [c["tenant"] for c in listed.json()["data"]] == ["anonymous"]
    assert keyed.json()["data"] == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_the_configured_credential_headers_are_the_only_ones_read(
    upstream, make_proxy, store_url: str
) -> None:
    # A gateway: one shared upstream key for everyone, each user named by a header of its own.
    shared = {"authorization": "Bearer sk-gateway"}
    alice = {**shared, "x-team-key": "alice"}
    bob = {**shared, "x-team-key": "bob"}
    server = {"credential_headers": ["x-team-key"]}
    async with _proxied(make_proxy, upstream[1], store_url, server=server) as (url, http):
        convs = [
            (await _chat(http, url, who, tag)).headers for who, tag in ((alice, "a"), (bob, "b"))
        ]
        only_shared = await _chat(http, url, shared, "s")
        listed = [
            await http.get(f"{url}/compactd/v1/conversations", headers=who)
            for who in (alice, bob, shared)
        ]
    assert [h["x-compactd-action"] for h in convs] == ["compacted", "compacted"]
    assert only_shared.headers["x-compactd-store"] == "no-credential"
    assert [c["conversation"] for c in listed[0].json()["data"]] == [
        convs[0]["x-compactd-conversation"]
    ]
    assert [c["conversation"] for c in listed[1].json()["data"]] == [
        convs[1]["x-compactd-conversation"]
    ]
    assert listed[2].status_code == 401
