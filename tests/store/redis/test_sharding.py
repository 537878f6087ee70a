"""No hot keys: the admin listing and the daily accounting are sharded, their writes spread over
a cluster's masters, and readers merge the shards with what builds before the shards wrote."""

from __future__ import annotations

import orjson
from redis.crc import key_slot

from proxy.store.base import UsageDelta
from proxy.store.redis.keys import SHARDS, shard_of
from tests.store.backends import ClusterBackend, RedisBackend
from tests.store.redis_cluster import LocalCluster
from tests.store.test_contract import TTL, compaction, history

DAY = "2026-12-07"
TENANTS = [f"tenant{i:03d}aaaaaaaaaaaaaaaa" for i in range(24)]


def test_shards_are_stable_and_all_used() -> None:
    assert shard_of("abc") == shard_of("abc")
    assert {shard_of(t) for t in [f"t{i}" for i in range(200)]} == set(range(SHARDS))


async def test_listing_and_accounting_writes_land_on_every_master(
    cluster_backend: ClusterBackend, redis_cluster: LocalCluster
) -> None:
    store, keys = cluster_backend.store, cluster_backend.keys
    msgs = history(8)
    for i, tenant in enumerate(TENANTS):
        await store.save_compaction(compaction(tenant, f"conv{i}", msgs, 4), TTL)
    deltas = [UsageDelta(t, "default", "gpt-4.1", DAY, {"requests": 1}) for t in TENANTS]
    await store.add_usage(deltas)

    admin = {keys.all_conversations(f"conv{i}") for i in range(len(TENANTS))}
    usage = {keys.usage(DAY, t) for t in TENANTS}
    masters = {
        kind: {redis_cluster.master_of_slot(key_slot(k.encode())) for k in found}
        for kind, found in (("admin", admin), ("usage", usage))
    }
    listed = await store.list_conversations(None)
    rows = await store.usage(None, DAY)

    assert masters["admin"] == masters["usage"] == set(redis_cluster.master_ports())
    assert {(c.tenant, c.conversation) for c in listed} == {
        (t, f"conv{i}") for i, t in enumerate(TENANTS)
    }
    assert sorted(r["tenant"] for r in rows) == sorted(TENANTS)
    assert all(r["requests"] == 1 for r in rows)


async def test_what_builds_before_the_shards_wrote_is_still_read(
    redis_backend: RedisBackend,
) -> None:
    store, keys, raw = redis_backend.store, redis_backend.keys, redis_backend.raw
    tenant = TENANTS[0]
    # A conversation and a day of accounting as the unsharded layout held them.
    await store.save_compaction(compaction(tenant, "old", history(8), 4), TTL)
    await raw.zrem(keys.all_conversations("old"), f"old\t{tenant}")
    await raw.zadd(keys.legacy_all(), {f"old\t{tenant}": 0})
    field = orjson.dumps(["default", "gpt-4.1", "requests"])
    await raw.hset(keys.legacy_usage(DAY, tenant), field, 5)
    await raw.sadd(keys.legacy_usage_tenants(DAY), tenant)
    # Then the same day goes on under the shards.
    await store.add_usage([UsageDelta(tenant, "default", "gpt-4.1", DAY, {"requests": 2})])

    listed = await store.list_conversations(None)
    found = await store.get_conversation(None, "old")
    admin_rows = await store.usage(None, DAY)
    tenant_rows = await store.usage(tenant, DAY)
    purged = await store.purge(None, "old")

    assert [(c.tenant, c.conversation) for c in listed] == [(tenant, "old")]
    assert found is not None
    assert [r["requests"] for r in admin_rows] == [r["requests"] for r in tenant_rows] == [7]
    assert purged
    assert await raw.zcard(keys.legacy_all()) == 0
