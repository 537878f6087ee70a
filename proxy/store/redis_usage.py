"""Usage aggregates in Redis: one hash per (day, tenant), HINCRBY per counter."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import orjson

from proxy.store import codec
from proxy.store.base import UsageDelta
from proxy.store.redis_client import Client
from proxy.store.redis_keys import KeyLayout

USAGE_TTL_SECONDS = 400 * 86400
# Aggregates per MULTI/EXEC: a batch never holds Redis for more than a few milliseconds.
BATCH = 500


async def add_usage(r: Client, keys: KeyLayout, deltas: Sequence[UsageDelta]) -> None:
    """Add a batch of aggregates: one MULTI/EXEC per day (its keys share one hash slot) and at
    most BATCH aggregates, so each step is all or nothing."""
    ordered = sorted(deltas, key=lambda d: d.day)
    for day, group in groupby(ordered, key=lambda d: d.day):
        items = list(group)
        for start in range(0, len(items), BATCH):
            await _add_day(r, keys, day, items[start : start + BATCH])


async def _add_day(r: Client, keys: KeyLayout, day: str, deltas: Sequence[UsageDelta]) -> None:
    tenants = keys.usage_tenants(day)
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


async def usage(
    r: Client, keys: KeyLayout, tenant: str | None, since_day: str
) -> list[dict[str, Any]]:
    """Aggregates per (tenant, policy, model, day) from `since_day` on."""
    days = codec.days_since(since_day)
    if tenant is None:
        async with r.pipeline(transaction=False) as p:
            for day in days:
                p.smembers(keys.usage_tenants(day))
            members = await p.execute()
        pairs = [(d, t.decode()) for d, ts in zip(days, members, strict=True) for t in ts]
    else:
        pairs = [(d, tenant) for d in days]
    async with r.pipeline(transaction=False) as p:
        for day, t in pairs:
            p.hgetall(keys.usage(day, t))
        hashes = await p.execute()
    rows: dict[tuple[str, str, str, str], dict[str, int]] = {}
    for (day, t), fields in zip(pairs, hashes, strict=True):
        for field, n in fields.items():
            policy, model, name = orjson.loads(field)
            rows.setdefault((t, policy, model, day), {})[name] = int(n)
    return [codec.usage_row(*key, counters) for key, counters in sorted(rows.items())]
