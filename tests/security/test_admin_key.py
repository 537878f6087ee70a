"""Issue 11, item 12 (admin key): the admin key is compared in constant time, and a key that
differs in its last byte is an ordinary tenant, not the admin."""

from __future__ import annotations

import hmac

import httpx
import pytest

ADMIN = "adm-0123456789abcdef"


async def test_the_admin_key_is_compared_in_constant_time(
    upstream, make_proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    server = {"admin_key": ADMIN}
    async with make_proxy(upstream[1], server=server) as url, httpx.AsyncClient() as http:
        near = await http.get(
            f"{url}/compactd/v1/stats", headers={"authorization": f"Bearer {ADMIN[:-1]}g"}
        )
        admin = await http.get(
            f"{url}/compactd/v1/stats", headers={"authorization": f"Bearer {ADMIN}"}
        )
    assert near.status_code == 401
    assert admin.status_code == 200
    assert (f"{ADMIN[:-1]}g".encode(), ADMIN.encode()) in compared  # not `==`
    assert (ADMIN.encode(), ADMIN.encode()) in compared
