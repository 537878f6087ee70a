"""A Redis compaction is one atomic write, or it is not acknowledged (issue 11, item 6).

The write is two steps: index pointers (another slot), then the data in one script. These tests
stop it between the two, by cutting the connection and by SIGKILLing a private redis-server at
that very moment, and check that every acknowledged compaction still resolves; and they check
`min_replicas_ack`, the ref index's sharing and trimming, and the cluster URL.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
import redis

from proxy.errors import StoreError
from proxy.store.redis.client import cluster_seeds
from proxy.store.redis.keys import KeyLayout
from proxy.store.redis.save import CLOCK_SKEW_SECONDS
from proxy.store.redis.store import RedisStore
from tests.store.cutting_proxy import CuttingProxy
from tests.store.redis_cluster import LocalCluster
from tests.store.redis_server import RedisServer
from tests.store.test_contract import A, compaction, history, prefixes

TTL = 1000
PREFIX = "t:"


async def open_store(url: str, *, timeout_ms: int = 2000, min_replicas_ack: int = 0) -> RedisStore:
    return await RedisStore.open(
        url, timeout_ms=timeout_ms, pool_size=8, prefix=PREFIX, min_replicas_ack=min_replicas_ack
    )


def killing_proxy(server: RedisServer, spare: int = 0) -> CuttingProxy:
    """A proxy that SIGKILLs the redis-server behind it when a save's data arrives (after
    `spare` saves went through): that save's pointers were written (and fsync'd: appendfsync
    always), its data never was."""
    return CuttingProxy(server.port, spare=spare, on_cut=lambda: server.stop(signal.SIGKILL))


async def test_a_redis_killed_between_the_index_and_the_data_leaves_every_ack_resolvable(
    private_redis: RedisServer,
) -> None:
    msgs = history(20)
    direct = await open_store(private_redis.url)
    # Acknowledged before the crash: conversation "base", and its fork "fork-0" sharing refs.
    acked = [await direct.save_compaction(compaction(A, "base", msgs, 9), TTL)]
    acked.append(await direct.save_compaction(compaction(A, "fork-0", msgs, 9), TTL))

    proxy = killing_proxy(private_redis)
    port = await proxy.start()
    doomed = await RedisStore.open(f"redis://127.0.0.1:{port}/0", timeout_ms=2000, prefix=PREFIX)
    with pytest.raises(StoreError):  # the fork's write dies between its two steps
        await doomed.save_compaction(compaction(A, "fork-1", msgs, 9), TTL)
    await doomed.close()
    await proxy.close()
    assert proxy.cuts == 1

    private_redis.start()  # AOF replayed: the pointers of fork-1 are there, its data is not
    raw = redis.Redis(port=private_redis.port)
    refs = raw.zrange(KeyLayout(PREFIX).tenant_refs(A), 0, -1)
    raw.close()
    store = await open_store(private_redis.url)
    resolved = await store.resolve_refs(A, ["0009abcdef"])
    fork = await store.find_checkpoint(A, "fork-1", prefixes(msgs))
    listed = {i.conversation for i in await store.list_conversations(A)}
    for cp in acked:
        found = await store.find_checkpoint(A, cp.conversation, prefixes(msgs))
        assert found == cp
    retried = await store.save_compaction(compaction(A, "fork-1", msgs, 9), TTL)
    await store.close()
    await direct.close()

    assert b"0009abcdef\tfork-1" in refs  # a pointer to nothing survived the crash...
    assert resolved["0009abcdef"] == msgs[:10]  # ...and the shared ref still resolves
    assert fork is None
    assert listed == {"base", "fork-0"}
    assert retried.covered_through == 9


async def test_saves_under_load_with_the_server_killed_mid_write_lose_no_acknowledged_ref(
    private_redis: RedisServer,
) -> None:
    msgs = history(30)
    proxy = killing_proxy(private_redis, spare=15)
    port = await proxy.start()
    store = await RedisStore.open(
        f"redis://127.0.0.1:{port}/0", timeout_ms=2000, pool_size=4, prefix=PREFIX
    )
    results = await asyncio.gather(
        *(store.save_compaction(compaction(A, f"c{i}", msgs, 5 + i % 20), TTL) for i in range(40)),
        return_exceptions=True,
    )
    await store.close()
    await proxy.close()
    private_redis.start()

    acked = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    check = await open_store(private_redis.url)
    for cp in acked:
        ref = f"{cp.covered_through:04x}abcdef"
        assert await check.find_checkpoint(A, cp.conversation, prefixes(msgs)) == cp
        assert (await check.resolve_refs(A, [ref]))[ref] == msgs[: cp.covered_through + 1]
    await check.close()
    assert proxy.cuts >= 1  # every connection that carried a save's data after the kill
    assert len(acked) >= 10  # 15 writes got through; a few were in flight at the kill
    assert failed, "the kill must have cut some write"
    assert all(isinstance(f, StoreError) for f in failed)


async def test_min_replicas_ack_refuses_a_write_no_replica_confirmed(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis.url, min_replicas_ack=1, timeout_ms=200)

    with pytest.raises(StoreError, match="0 of 1 replicas"):
        await store.save_compaction(compaction(A, "c1", history(8), 4), TTL)
    warnings = await store.check_config()
    await store.close()

    assert any("min_replicas_ack" in w for w in warnings)


async def test_min_replicas_ack_acknowledges_once_a_replica_has_the_write(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "replica").mkdir()
    replica = RedisServer(
        tmp_path / "replica", extra=("--replicaof", "127.0.0.1", str(private_redis.port))
    )
    replica.start()
    try:
        probe = redis.Redis(port=private_redis.port)
        deadline = time.monotonic() + 20
        while probe.info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica never connected"
            await asyncio.sleep(0.05)
        probe.close()
        # Generous: WAIT gets a third of it, and the machine may be busy (no timing asserted).
        store = await open_store(private_redis.url, min_replicas_ack=1, timeout_ms=6000)
        msgs = history(8)
        saved = await store.save_compaction(compaction(A, "c1", msgs, 4), TTL)
        warnings = await store.check_config()
        await store.close()
        on_replica = await open_store(replica.url)
        found = await on_replica.find_checkpoint(A, "c1", prefixes(msgs))
        resolved = await on_replica.resolve_refs(A, ["0004abcdef"])
        await on_replica.close()
    finally:
        replica.stop(signal.SIGKILL)

    assert found == saved  # the replica had it when the write was acknowledged
    assert resolved["0004abcdef"] == msgs[:5]
    assert not any("min_replicas_ack" in w for w in warnings)


async def test_min_replicas_ack_on_the_cluster(redis_cluster: LocalCluster) -> None:
    store = await RedisStore.open(
        redis_cluster.url, timeout_ms=6000, prefix="atomic:", min_replicas_ack=1
    )
    msgs = history(10)
    saved = [
        await store.save_compaction(compaction(A, f"c{i}", msgs, 3 + i), TTL) for i in range(6)
    ]
    warnings = await store.check_config()
    found = [await store.find_checkpoint(A, f"c{i}", prefixes(msgs)) for i in range(6)]
    await store.close()

    assert found == saved
    assert warnings == []  # AOF on, noeviction, a replica behind every master


async def saved(server: RedisServer, *convs: str) -> tuple[RedisStore, list[dict[str, object]]]:
    """A store on `server` where each conversation has compacted messages 0..5 of one history."""
    store = await open_store(server.url)
    msgs = history(12)
    for conv in convs:
        await store.save_compaction(compaction(A, conv, msgs, 5), TTL)
    return store, msgs


async def test_a_ref_shared_by_two_conversations_resolves_while_either_lives(
    private_redis: RedisServer,
) -> None:
    store, msgs = await saved(private_redis, "one", "two")

    await store.purge(A, "one")
    after_one = await store.resolve_refs(A, ["0005abcdef"])
    await store.purge(A, "two")
    after_both = await store.resolve_refs(A, ["0005abcdef"])
    raw = redis.Redis(port=private_redis.port)
    left = raw.zcard(KeyLayout(PREFIX).tenant_refs(A))
    raw.close()
    await store.close()

    assert after_one["0005abcdef"] == msgs[:6]
    assert after_both == {}
    assert left == 0  # purge took its pointers with it


async def test_expired_ref_pointers_are_trimmed_and_refreshed_ones_kept(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis.url)
    keys = KeyLayout(PREFIX)
    msgs = history(12)
    await store.save_compaction(compaction(A, "old", msgs, 3), TTL)
    await store.save_compaction(compaction(A, "used", msgs, 4), TTL)
    raw = redis.Redis(port=private_redis.port)
    # "old" expired long ago (its data is gone, its pointer lingers); "used" is due a refresh.
    long_ago = time.time() - CLOCK_SKEW_SECONDS - 10
    raw.zadd(keys.tenant_ref_expiry(A), {"0003abcdef\told": long_ago})
    raw.delete(*keys.conversation(A, "old").data())
    for key in keys.conversation(A, "used").data():
        raw.expire(key, 100)
    raw.zadd(keys.tenant_ref_expiry(A), {"0004abcdef\tused": time.time() + 100}, xx=True)

    await store.find_checkpoint(A, "used", prefixes(msgs))  # refreshes: pointers first
    await store.save_compaction(compaction(A, "new", msgs, 6), TTL)  # trims
    members = {m.decode() for m in raw.zrange(keys.tenant_refs(A), 0, -1)}
    used_expiry = raw.zscore(keys.tenant_ref_expiry(A), "0004abcdef\tused")
    data_ttl = raw.ttl(keys.conversation(A, "used").meta)
    raw.close()
    await store.close()

    assert members == {"0004abcdef\tused", "0006abcdef\tnew"}
    assert data_ttl > 900
    assert used_expiry is not None
    assert used_expiry >= time.time() + data_ttl - 5  # the pointer outlives the data


@pytest.mark.parametrize(
    ("url", "seeds", "options"),
    [
        ("redis+cluster://h1:7000,h2:7001", [("h1", 7000), ("h2", 7001)], {}),
        ("redis+cluster://h1", [("h1", 6379)], {}),
        ("redis+cluster://:s%40crt@h1:7000/0", [("h1", 7000)], {"password": "s@crt"}),
        (
            "rediss+cluster://app:pw@10.0.0.1:7000,10.0.0.2:7000",
            [("10.0.0.1", 7000), ("10.0.0.2", 7000)],
            {"ssl": True, "username": "app", "password": "pw"},
        ),
        ("redis+cluster://[::1]:7000", [("::1", 7000)], {}),
    ],
)
def test_cluster_urls_name_seed_nodes_and_credentials(
    url: str, seeds: list[tuple[str, int]], options: dict[str, object]
) -> None:
    assert cluster_seeds(url) == (seeds, options)


@pytest.mark.parametrize("url", ["redis+cluster://h1:7000/2", "redis+cluster://h1:7000,,h2"])
def test_malformed_cluster_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"[Cc]luster"):
        cluster_seeds(url)


async def test_refs_indexed_the_way_earlier_builds_did_still_resolve(
    private_redis: RedisServer,
) -> None:
    store, msgs = await saved(private_redis, "old")
    keys = KeyLayout(PREFIX)
    raw = redis.Redis(port=private_redis.port)
    # What an earlier build left: the conversation's data, a hash index, no zset entries.
    raw.delete(keys.tenant_refs(A), keys.tenant_ref_expiry(A))
    raw.hset(keys.legacy_tenant_refs(A), "0005abcdef", "old")
    resolved = await store.resolve_refs(A, ["0005abcdef"])
    await store.purge(A, "old")
    left = raw.hlen(keys.legacy_tenant_refs(A))
    raw.close()
    await store.close()

    assert resolved["0005abcdef"] == msgs[:6]
    assert left == 0
