"""Issue 32, row 11: a Redis turned to evict keys (allkeys-lru) after compactd started was noticed
only by the start-up log; /readyz and a metric now say so while it runs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from proxy.telemetry import storecheck
from tests.store.redis_server import RedisServer


async def test_an_evicting_policy_set_while_running_shows_in_readyz(
    upstream, make_proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storecheck, "EVERY_SECONDS", 0.0)
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    try:
        async with make_proxy(upstream[1], store={"url": server.url}) as url:
            async with httpx.AsyncClient() as http:
                before = (await http.get(f"{url}/readyz")).json()
                redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lru")
                after = (await http.get(f"{url}/readyz")).json()
                metrics = (await http.get(f"{url}/metrics")).text
    finally:
        server.stop()
    assert not any("maxmemory-policy" in w for w in before["store_warnings"])
    assert any("allkeys-lru" in w for w in after["store_warnings"])
    assert "compactd_store_config_warnings 1.0" in metrics
