"""Store fixtures: the machine's Redis (random key prefix per test), private redis-servers, and
SQLite files; `backend` runs the contract suite against each."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis

from proxy.store.redis.keys import KeyLayout
from proxy.store.redis.store import RedisStore
from proxy.store.sqlite.store import SqliteStore
from tests.store.backends import (
    Backend,
    ClusterBackend,
    RedisBackend,
    SqliteBackend,
    open_cluster_backend,
)
from tests.store.redis_cluster import LocalCluster
from tests.store.redis_server import RedisServer

MACHINE_REDIS = os.environ.get("COMPACTD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TEST_TIMEOUT_MS = 2000  # generous: the machine is shared; timeouts are tested on their own


@pytest.fixture(scope="session")
def machine_redis_url() -> str:
    """The machine's Redis; unreachable fails under CI=true and skips (with a reason) otherwise."""
    client = redis.Redis.from_url(MACHINE_REDIS, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        message = f"Redis at {MACHINE_REDIS} is unreachable: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    finally:
        client.close()
    return MACHINE_REDIS


@pytest.fixture
async def redis_backend(machine_redis_url: str) -> AsyncIterator[RedisBackend]:
    """A RedisStore under a fresh key prefix; its keys are deleted afterwards."""
    prefix = f"compactd-test-{uuid.uuid4().hex[:12]}:"
    store = await RedisStore.open(machine_redis_url, timeout_ms=TEST_TIMEOUT_MS, prefix=prefix)
    raw = Redis.from_url(machine_redis_url)
    port = raw.connection_pool.connection_kwargs.get("port", 6379)
    try:
        yield RedisBackend(store, raw, KeyLayout(prefix), machine_redis_url, int(port))
    finally:
        await store.close()
        keys = [k async for k in raw.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await raw.delete(*keys)
        await raw.aclose()


@pytest.fixture
async def sqlite_backend(tmp_path: Path) -> AsyncIterator[SqliteBackend]:
    """A SqliteStore on a fresh file."""
    path = tmp_path / "compactd.db"
    store = await SqliteStore.open(path, timeout_ms=TEST_TIMEOUT_MS)
    try:
        yield SqliteBackend(store, path)
    finally:
        await store.close()


@pytest.fixture
async def cluster_backend(redis_cluster: LocalCluster) -> AsyncIterator[ClusterBackend]:
    """A RedisStore on the local cluster under a fresh key prefix; its keys deleted afterwards."""
    prefix = f"compactd-test-{uuid.uuid4().hex[:12]}:"
    backend = await open_cluster_backend(redis_cluster, prefix)
    try:
        yield backend
    finally:
        await backend.store.close()
        for node in backend.raw.get_primaries():
            keys = [k async for k in backend.raw.scan_iter(match=f"{prefix}*", target_nodes=node)]
            for key in keys:
                await backend.raw.delete(key)
        await backend.raw.aclose()


@pytest.fixture(params=["redis", "cluster", "sqlite"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend in turn, for the contract suite."""
    fixture: Backend = request.getfixturevalue(f"{request.param}_backend")
    return fixture


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A six-node Redis Cluster (3 masters, 3 replicas) on loopback, for the whole session.

    Tests that kill or move nodes leave it healthy again (every slot served, replicas in sync)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
    except (OSError, subprocess.SubprocessError, TimeoutError, RuntimeError) as exc:
        cluster.stop()
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the local Redis Cluster did not start: {exc}")
        pytest.skip(f"the local Redis Cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with AOF (appendfsync always) this test may stop and restart."""
    server = RedisServer(tmp_path, appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
