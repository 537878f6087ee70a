"""Usage aggregates in Redis: one hash per (day, tenant), HINCRBY per counter."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.store import codec
from proxy.store.base import UsageRecord
from proxy.store.redis_client import Client
from proxy.store.redis_keys import KeyLayout

USAGE_TTL_SECONDS = 400 * 86400


async def record_usage(r: Client, keys: KeyLayout, record: UsageRecord) -> None:
    """Add one request's counters to its day's hash (kept 400 days), atomically."""
    key = keys.usage(record.day, record.tenant)
    tenants = keys.usage_tenants(record.day)
    async with r.pipeline(transaction=True) as p:
        for name, n in codec.usage_increments(record).items():
            p.hincrby(key, orjson.dumps([record.policy, record.model, name]), n)
        p.sadd(tenants, record.tenant)
        p.expire(key, USAGE_TTL_SECONDS)
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
