"""Usage aggregates in Redis: one hash per (day, tenant), HINCRBY per counter, each day's
tenants spread over SHARDS hash tags (`redis_keys`), so accounting is not one master's load."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import orjson

from proxy.store import codec
from proxy.store.base import UsageDelta
from proxy.store.redis.client import Client
from proxy.store.redis.keys import SHARDS, KeyLayout, shard_of
from proxy.store.redis.ops import text

USAGE_TTL_SECONDS = 400 * 86400
# Aggregates per MULTI/EXEC: a batch never holds Redis for more than a few milliseconds.
BATCH = 500


async def add_usage(r: Client, keys: KeyLayout, deltas: Sequence[UsageDelta]) -> None:
    """Add a batch of aggregates: one MULTI/EXEC per day and tenant shard (its keys share one
    hash slot) and at most BATCH aggregates, so each step is all or nothing."""
    ordered = sorted(deltas, key=lambda d: (d.day, shard_of(d.tenant)))
    for (day, shard), group in groupby(ordered, key=lambda d: (d.day, shard_of(d.tenant))):
        items = list(group)
        for start in range(0, len(items), BATCH):
            await _add_day(r, keys, day, shard, items[start : start + BATCH])


async def _add_day(
    r: Client, keys: KeyLayout, day: str, shard: int, deltas: Sequence[UsageDelta]
) -> None:
    tenants = keys.usage_tenants(day, shard)
    day_tenants = {d.tenant for d in deltas}
    async with r.pipeline(transaction=True) as p:
        for d in deltas:
            key = keys.usage(day, d.tenant)
            for name, n in d.counters.items():
                if n:
                    p.hincrby(key, orjson.dumps([d.policy, d.model, name]), n)
        for tenant in day_tenants:  # after the increments: EXPIRE on a missing key does nothing
            p.expire(keys.usage(day, tenant), USAGE_TTL_SECONDS)
        p.sadd(tenants, *day_tenants)
        p.expire(tenants, USAGE_TTL_SECONDS)
        await p.execute()


async def _tenants(r: Client, keys: KeyLayout, days: list[str]) -> list[tuple[str, str]]:
    """(day, tenant) of every tenant with usage on those days, from every shard's set and the
    unsharded one of builds before."""
    async with r.pipeline(transaction=False) as p:
        for day in days:
            for shard in range(SHARDS):
                p.smembers(keys.usage_tenants(day, shard))
            p.smembers(keys.legacy_usage_tenants(day))
        members = await p.execute()
    per_day = SHARDS + 1
    pairs = {
        (day, text(t)): None
        for i, day in enumerate(days)
        for ts in members[i * per_day : (i + 1) * per_day]
        for t in ts
    }
    return list(pairs)


async def usage(
    r: Client, keys: KeyLayout, tenant: str | None, since_day: str
) -> list[dict[str, Any]]:
    """Aggregates per (tenant, policy, model, day) from `since_day` on: a tenant's day is its
    shard's hash plus, for days before the shards, the unsharded one."""
    days = codec.days_since(since_day)
    pairs = await _tenants(r, keys, days) if tenant is None else [(d, tenant) for d in days]
    async with r.pipeline(transaction=False) as p:
        for day, t in pairs:
            p.hgetall(keys.usage(day, t))
            p.hgetall(keys.legacy_usage(day, t))
        hashes = await p.execute()
    rows: dict[tuple[str, str, str, str], dict[str, int]] = {}
    for i, (day, t) in enumerate(pairs):
        for fields in hashes[2 * i : 2 * i + 2]:
            for field, n in fields.items():
                policy, model, name = orjson.loads(field)
                counters = rows.setdefault((t, policy, model, day), {})
                counters[name] = counters.get(name, 0) + int(n)
    return [codec.usage_row(*key, counters) for key, counters in sorted(rows.items())]
