"""Issue 11, item 11: with the store down, compactd's own API answers OpenAI-shaped 503s."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

from proxy.store.sqlite import store as sqlite_store
from tests.inprocess import running
from tests.store.redis_server import RedisServer
from tests.store.test_contract import A, compaction, history

KEY = {"authorization": "Bearer sk-owner"}
HANG_GUARD = 30  # seconds: only stops a hung test; no assertion on elapsed time


def _is_503(r: httpx.Response) -> bool:
    return r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"


async def test_every_api_endpoint_answers_503_while_redis_is_down(
    upstream, make_proxy, private_redis: RedisServer
) -> None:
    _, base = upstream
    admin = {"authorization": "Bearer admin-secret"}
    server = {"admin_key": "admin-secret"}
    async with make_proxy(base, store={"url": private_redis.url}, server=server) as url:
        private_redis.stop(signal.SIGKILL)
        async with httpx.AsyncClient(headers=KEY) as http, asyncio.timeout(HANG_GUARD):
            calls = [
                await http.get(f"{url}/compactd/v1/conversations"),
                await http.get(f"{url}/compactd/v1/conversations/c1"),
                await http.delete(f"{url}/compactd/v1/conversations/c1"),
                await http.post(
                    f"{url}/compactd/v1/uncompress",
                    json={"messages": [{"role": "user", "content": "[compactd:ref=0123abcdef]"}]},
                ),
                await http.get(f"{url}/compactd/v1/stats", headers=admin),
                await http.get(f"{url}/compactd/v1/savings"),  # what the dashboard reads
                await http.get(f"{url}/compactd/v1/conversations/c1/inspect"),
            ]
            ready = await http.get(f"{url}/readyz")
    assert [r.status_code for r in calls] == [503] * len(calls)
    assert all(_is_503(r) for r in calls)
    assert all(r.headers["retry-after"] for r in calls)
    assert ready.json()["store"] == "unavailable"


async def test_a_locked_sqlite_store_answers_503_not_500(
    upstream, make_proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A purge waits for the lock as long as restore and inspection may take: shortened here, as
    # a lock held past it is what this test is about.
    monkeypatch.setattr(sqlite_store, "INSPECTION_TIMEOUT_SECONDS", 0.2)
    _, base = upstream
    path = tmp_path / "locked.db"
    async with make_proxy(base, store={"url": f"sqlite:///{path}", "timeout_ms": 50}) as url:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            async with httpx.AsyncClient(headers=KEY) as http, asyncio.timeout(HANG_GUARD):
                purge = await http.delete(f"{url}/compactd/v1/conversations/c1")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    assert _is_503(purge)


async def test_an_admin_delete_waits_out_a_write_lock_held_past_the_store_timeout(
    tmp_path: Path,
) -> None:
    # Another worker (or process) writing the same file holds the lock a while: the operator's
    # DELETE waits for it, as restore and inspection do, instead of answering 503 at 50 ms.
    path = tmp_path / "busy.db"
    store = {"url": f"sqlite:///{path}", "timeout_ms": 50}
    async with running(tmp_path, server={"admin_key": "admin-secret"}, store=store) as proxy:
        await proxy.services.store.save_compaction(compaction(A, "c1", history(8), 4), 1000)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            delete = asyncio.ensure_future(
                proxy.client.delete(
                    "/compactd/v1/conversations/c1",
                    headers={"authorization": "Bearer admin-secret"},
                )
            )
            await asyncio.wait([delete], timeout=0.5)  # the lock stays held well past 50 ms
        finally:
            other.execute("ROLLBACK")
            other.close()
        async with asyncio.timeout(HANG_GUARD):
            deleted = await delete
        left = await proxy.services.store.get_conversation(None, "c1")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"deleted": True, "id": "c1"}
    assert left is None
