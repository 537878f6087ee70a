"""Issue 32, rows 4 and 7: upstream-key mode gates compactd's own API as it gates chat, and the
shared anonymous tenant answers only to the configured host names."""

from __future__ import annotations

from pathlib import Path

import httpx

from proxy.wire.tenant import host_name, key_fingerprint
from tests.inprocess import running

SECRET = "attack-suite-secret"
ADMIN = "admin-key-of-the-attack-suite"
API = ("/compactd/v1/me", "/compactd/v1/conversations", "/compactd/v1/savings")


async def test_a_key_the_gateway_never_admitted_gets_401_on_the_api_too(
    upstream, make_proxy
) -> None:
    good = key_fingerprint(SECRET.encode(), "sk-admitted")
    async with make_proxy(
        upstream[1],
        server={"secret": SECRET, "admin_key": ADMIN},
        upstream={"api_key": "sk-REAL-UPSTREAM", "allowed_keys": [good]},
    ) as url:
        async with httpx.AsyncClient(base_url=url) as http:

            async def get(path: str, key: str | None) -> httpx.Response:
                headers = {"authorization": f"Bearer {key}"} if key else {}
                return await http.get(path, headers=headers)

            chat = await http.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": []},
                headers={"authorization": "Bearer sk-made-up"},
            )
            refused = [await get(path, "sk-made-up") for path in API]
            bare = [await get(path, None) for path in API]
            admitted = [await get(path, "sk-admitted") for path in API]
            admin = await get(API[1], ADMIN)
    assert chat.status_code == 401
    for r in (*refused, *bare):
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert [r.status_code for r in admitted] == [200, 200, 200]
    assert admin.status_code == 200


async def test_the_shared_anonymous_tenant_checks_the_host(tmp_path: Path) -> None:
    server = {"shared_anonymous_tenant": True}
    async with running(tmp_path, server=server) as proxy:
        listing = "/compactd/v1/conversations"
        rebound = await proxy.client.get(listing, headers={"host": "attacker.example"})
        rebound_port = await proxy.client.get(listing, headers={"host": "attacker.example:8787"})
        local = await proxy.client.get(listing, headers={"host": "localhost:8787"})
        loopback = await proxy.client.get(listing, headers={"host": "127.0.0.1"})
    assert rebound.status_code == 401
    assert rebound_port.status_code == 401
    assert local.status_code == 200
    assert loopback.status_code == 200


async def test_the_anonymous_hosts_are_configurable(tmp_path: Path) -> None:
    server = {"shared_anonymous_tenant": True, "anonymous_hosts": ["compactd.internal"]}
    async with running(tmp_path, server=server) as proxy:
        listing = "/compactd/v1/conversations"
        named = await proxy.client.get(listing, headers={"host": "compactd.internal:80"})
        local = await proxy.client.get(listing, headers={"host": "localhost"})
    assert (named.status_code, local.status_code) == (200, 401)


def test_a_host_name_is_read_without_its_port() -> None:
    assert host_name("LocalHost:8787") == "localhost"
    assert host_name("[::1]:8787") == "[::1]"
    assert host_name("[::1]") == "[::1]"
    assert host_name("example.com") == "example.com"
    assert host_name("") == ""
