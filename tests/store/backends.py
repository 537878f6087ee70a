"""What the contract suite needs from each backend beyond the Store protocol: ways to age a
conversation, forge a cross-tenant value, and make the next save fail half-way."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from proxy.store.base import Store
from proxy.store.redis.client import open_client
from proxy.store.redis.keys import KeyLayout
from proxy.store.redis.store import RedisStore
from proxy.store.sqlite.store import SqliteStore
from tests.store.cutting_proxy import CuttingProxy
from tests.store.redis_cluster import LocalCluster

UNREADABLE = b"{not json"


class Backend(Protocol):
    store: Store

    async def age(self, tenant: str, conversation: str, remaining: int) -> None:
        """Make the conversation expire in `remaining` seconds (0: now)."""

    async def graft(self, owner: str, thief: str, conversation: str) -> None:
        """Copy owner's stored values under thief's keys, as a desynced read would see them."""

    def failing_saves(self) -> Any:
        """Async context manager yielding a store whose saves fail in the middle of the write."""

    async def corrupt(self, tenant: str, conversation: str, kind: str, key: str) -> None:
        """Overwrite one stored value (kind: checkpoints, originals or refs) with bytes that do
        not decode."""

    def another(self) -> Any:
        """Async context manager yielding a second store on the same data (another instance)."""


@dataclass
class _RedisKeys:
    """age and graft over any redis-py client (DUMP/RESTORE: it crosses cluster slots)."""

    store: RedisStore
    raw: Redis | RedisCluster
    keys: KeyLayout

    async def age(self, tenant: str, conversation: str, remaining: int) -> None:
        for key in self.keys.conversation(tenant, conversation).data():
            if remaining > 0:
                await self.raw.expire(key, remaining)
            else:
                await self.raw.delete(key)

    async def graft(self, owner: str, thief: str, conversation: str) -> None:
        src = self.keys.conversation(owner, conversation).data()
        dst = self.keys.conversation(thief, conversation).data()
        for s, d in zip(src, dst, strict=True):
            dumped = await self.raw.dump(s)
            if dumped is not None:
                await self.raw.restore(d, 0, dumped, replace=True)

    async def corrupt(self, tenant: str, conversation: str, kind: str, key: str) -> None:
        await self.raw.hset(
            getattr(self.keys.conversation(tenant, conversation), kind), key, UNREADABLE
        )


@dataclass
class RedisBackend(_RedisKeys):
    url: str
    port: int

    @asynccontextmanager
    async def another(self) -> AsyncIterator[RedisStore]:
        store = await RedisStore.open(self.url, timeout_ms=2000, prefix=self.keys.prefix)
        try:
            yield store
        finally:
            await store.close()

    @asynccontextmanager
    async def failing_saves(self) -> AsyncIterator[RedisStore]:
        proxy = CuttingProxy(self.port)
        port = await proxy.start()
        store = await RedisStore.open(
            f"redis://127.0.0.1:{port}/0", timeout_ms=2000, prefix=self.keys.prefix
        )
        try:
            yield store
        finally:
            await store.close()
            await proxy.close()
        assert proxy.cuts > 0, "the proxy never saw a save to cut"


@dataclass
class ClusterBackend(_RedisKeys):
    """A RedisStore on the local Redis Cluster."""

    cluster: LocalCluster

    @asynccontextmanager
    async def another(self) -> AsyncIterator[RedisStore]:
        store = await RedisStore.open(self.cluster.url, timeout_ms=2000, prefix=self.keys.prefix)
        try:
            yield store
        finally:
            await store.close()

    @asynccontextmanager
    async def failing_saves(self) -> AsyncIterator[RedisStore]:
        # A cutting proxy in front of every master; the client is told (address_remap) to
        # reach each node through its proxy, as a load balancer or NAT would.
        proxies = {port: CuttingProxy(port) for port in self.cluster.master_ports()}
        remap = {port: await proxy.start() for port, proxy in proxies.items()}
        seed = next(iter(self.cluster.master_ports()))
        client = RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", seed)],
            address_remap=lambda addr: ("127.0.0.1", remap.get(addr[1], addr[1])),
            socket_timeout=2,
        )
        store = RedisStore(client, timeout=2.0, keys=self.keys)
        try:
            yield store
        finally:
            await store.close()
            for proxy in proxies.values():
                await proxy.close()
        assert sum(p.cuts for p in proxies.values()) > 0, "no proxy saw a save to cut"


async def open_cluster_backend(cluster: LocalCluster, prefix: str) -> ClusterBackend:
    """A ClusterBackend under a key prefix."""
    store = await RedisStore.open(cluster.url, timeout_ms=2000, prefix=prefix)
    raw = open_client(cluster.url, timeout=5.0, pool_size=8)
    assert isinstance(raw, RedisCluster)
    return ClusterBackend(store, raw, KeyLayout(prefix), cluster)


@dataclass
class SqliteBackend:
    store: Store
    path: Path

    @asynccontextmanager
    async def another(self) -> AsyncIterator[Store]:
        store = await SqliteStore.open(self.path, timeout_ms=2000)
        try:
            yield store
        finally:
            await store.close()

    def _sql(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        con = sqlite3.connect(self.path, isolation_level=None)
        try:
            for sql, params in statements:
                con.execute(sql, params)
        finally:
            con.close()

    async def age(self, tenant: str, conversation: str, remaining: int) -> None:
        self._sql(
            (
                "UPDATE conversations SET expires_at = ? WHERE tenant = ? AND conversation = ?",
                (time.time() + remaining, tenant, conversation),
            )
        )

    async def graft(self, owner: str, thief: str, conversation: str) -> None:
        self._sql(
            *[
                (
                    f"INSERT OR REPLACE INTO {table} SELECT ?, conversation, {_rest(table)}"
                    f" FROM {table} WHERE tenant = ? AND conversation = ?",
                    (thief, owner, conversation),
                )
                for table in ("conversations", "checkpoints", "originals", "refs")
            ]
        )

    async def corrupt(self, tenant: str, conversation: str, kind: str, key: str) -> None:
        column = {"checkpoints": "source_digest", "originals": "digest", "refs": "ref_id"}[kind]
        self._sql(
            (
                f"UPDATE {kind} SET body = ? WHERE tenant = ? AND conversation = ? AND {column} = ?",
                (UNREADABLE, tenant, conversation, key),
            )
        )

    @asynccontextmanager
    async def failing_saves(self) -> AsyncIterator[Store]:
        # A trigger aborts the checkpoint insert after originals and refs were inserted.
        self._sql(
            (
                "CREATE TRIGGER inject_failure BEFORE INSERT ON checkpoints"
                " BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
                (),
            )
        )
        try:
            yield self.store
        finally:
            self._sql(("DROP TRIGGER inject_failure", ()))


def _rest(table: str) -> str:
    return {
        "conversations": "created_at, updated_at, ttl, expires_at",
        "checkpoints": "source_digest, covered_through, body",
        "originals": "digest, body",
        "refs": "ref_id, body",
    }[table]
