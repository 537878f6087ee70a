"""Conversation activity in Redis: a hash per conversation and a recency index per tenant.

`{a:<tenant>}` tags every key of a tenant's activity (one slot: a batch of one tenant is one
MULTI/EXEC, on a cluster too): `conv:<id>` (hash: api, model, first_seen, last_seen and the
counters, expiring `ttl` after its last request) and `recent` (zset: conversation -> last seen).
The admin's index of tenants (`{a}:tenants`, zset: tenant -> last seen) is written after them.
Index entries past their time are trimmed on write and skipped on read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from proxy.store.base import ACTIVITY_FIELDS, ActivityDelta
from proxy.store.redis.client import Client
from proxy.store.redis.keys import KeyLayout
from proxy.store.redis.ops import text


def _conv(keys: KeyLayout, tenant: str, conversation: str) -> str:
    return f"{keys.prefix}{{a:{tenant}}}:conv:{conversation}"


def _recent(keys: KeyLayout, tenant: str) -> str:
    return f"{keys.prefix}{{a:{tenant}}}:recent"


def _tenants(keys: KeyLayout) -> str:
    return f"{keys.prefix}{{a}}:tenants"


async def add(r: Client, keys: KeyLayout, deltas: Sequence[ActivityDelta], ttl: int) -> None:
    """Add a batch: one MULTI/EXEC per tenant, then the admin's index."""
    now = time.time()
    latest: dict[str, float] = {}
    for tenant, group in groupby(sorted(deltas, key=lambda d: d.tenant), key=lambda d: d.tenant):
        recent = _recent(keys, tenant)
        async with r.pipeline(transaction=True) as p:
            for d in group:
                key = _conv(keys, tenant, d.conversation)
                for name in ACTIVITY_FIELDS:
                    p.hincrby(key, name, d.counters.get(name, 0))
                p.hsetnx(key, "first_seen", d.seen_at)
                p.hset(key, mapping={"api": d.api, "model": d.model, "last_seen": d.seen_at})
                # From its last request, as SQLite counts it (in the past: gone at once).
                p.expireat(key, int(d.seen_at + ttl) + 1)
                p.zadd(recent, {d.conversation: d.seen_at}, gt=True)
                latest[tenant] = max(latest.get(tenant, 0.0), d.seen_at)
            p.zremrangebyscore(recent, "-inf", now - ttl)
            p.expire(recent, ttl)
            await p.execute()
    if latest:
        async with r.pipeline(transaction=True) as p:
            p.zadd(_tenants(keys), latest, gt=True)
            p.zremrangebyscore(_tenants(keys), "-inf", now - ttl)
            await p.execute()


async def recent(
    r: Client, keys: KeyLayout, tenant: str | None, limit: int
) -> list[dict[str, Any]]:
    """The most recently active conversations, newest first."""
    tenants = [tenant] if tenant is not None else await _all_tenants(r, keys)
    found: list[tuple[float, str, str]] = []
    for t in tenants:
        ranked: Any = await r.zrevrange(_recent(keys, t), 0, limit - 1, withscores=True)
        found.extend((float(score), t, text(conv)) for conv, score in ranked)
    found.sort(reverse=True)
    out: list[dict[str, Any]] = []
    for _, t, conv in found[:limit]:
        stored: Any = await r.hgetall(_conv(keys, t, conv))
        fields = {text(k): text(v) for k, v in stored.items()}
        if not fields:  # expired since the index was written
            continue
        row: dict[str, Any] = {"tenant": t, "conversation": conv}
        row.update(api=fields.get("api", ""), model=fields.get("model", ""))
        row.update(first_seen=float(fields.get("first_seen", 0)))
        row.update(last_seen=float(fields.get("last_seen", 0)))
        row.update({name: int(fields.get(name, 0)) for name in ACTIVITY_FIELDS})
        out.append(row)
    return out


async def purge(r: Client, keys: KeyLayout, tenant: str | None, conversation: str) -> None:
    """Forget a conversation's activity (admin: every tenant's of that id)."""
    for t in [tenant] if tenant is not None else await _all_tenants(r, keys):
        async with r.pipeline(transaction=True) as p:
            p.delete(_conv(keys, t, conversation))
            p.zrem(_recent(keys, t), conversation)
            await p.execute()


async def _all_tenants(r: Client, keys: KeyLayout) -> list[str]:
    members: Any = await r.zrevrange(_tenants(keys), 0, -1)
    return [text(t) for t in members]
