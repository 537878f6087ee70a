"""Multi-step Redis reads used by RedisStore: a conversation, listings, index upkeep."""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from proxy.store import codec
from proxy.store.base import ConversationInfo, TenantMismatchError
from proxy.store.redis_keys import ConversationKeys, KeyLayout

# Sums the value lengths of hashes server-side (one slot: every key is the same conversation's),
# so a listing reports the bytes stored without moving them.
_SIZE_SCRIPT = """
local n = 0
for _, key in ipairs(KEYS) do
  for _, v in ipairs(redis.call('HVALS', key)) do n = n + #v end
end
return n
"""
_BATCH = 500


def text(value: bytes | str) -> str:
    """A reply item as str (replies are bytes: the pool does not decode)."""
    return value.decode() if isinstance(value, bytes) else value


def expire_at_least(p: Any, key: str, ttl: int) -> None:
    """Queue commands making `key` live at least `ttl` more seconds (never shortening it)."""
    p.expire(key, ttl, nx=True)
    p.expire(key, ttl, gt=True)


def _meta(raw: dict[bytes, bytes], tenant: str) -> dict[str, str]:
    meta = {k.decode(): v.decode() for k, v in raw.items()}
    if meta.get("tenant") != tenant:
        raise TenantMismatchError("conversation metadata belongs to another tenant")
    return meta


def _expires_at(pttl: int) -> float:
    return time.time() + pttl / 1000 if pttl > 0 else 0.0


async def fetch_conversation(
    r: Redis, keys: KeyLayout, tenant: str, conversation: str
) -> ConversationInfo | None:
    """Metadata, checkpoints, originals and refs of one conversation in one round trip."""
    k = keys.conversation(tenant, conversation)
    async with r.pipeline(transaction=False) as p:
        p.hgetall(k.meta)
        p.hgetall(k.checkpoints)
        p.hgetall(k.originals)
        p.hgetall(k.refs)
        p.pttl(k.meta)
        raw_meta, cps, origs, refs, pttl = await p.execute()
    if not raw_meta:
        return None
    meta = _meta(raw_meta, tenant)
    checkpoints = sorted(
        (codec.load_checkpoint(v, tenant) for v in cps.values()),
        key=lambda c: (c.covered_through, c.created_at),
    )
    size = sum(len(v) for h in (cps, origs, refs) for v in h.values())
    return ConversationInfo(
        tenant=tenant,
        conversation=conversation,
        created_at=float(meta.get("created_at", 0)),
        updated_at=float(meta.get("updated_at", 0)),
        checkpoints=checkpoints,
        originals={d.decode(): codec.load_original(v, tenant) for d, v in origs.items()},
        refs={ref.decode(): codec.load_ref(v, tenant) for ref, v in refs.items()},
        size_bytes=size,
        expires_at=_expires_at(int(pttl)),
        checkpoint_count=len(checkpoints),
        original_count=len(origs),
    )


async def admin_tenants(r: Redis, keys: KeyLayout, conversation: str) -> list[str]:
    """Tenants that have a conversation with this id (the admin index is ordered by id)."""
    low = b"[" + conversation.encode() + b"\t"
    members = await r.zrangebylex(keys.all_conversations(), low, low + b"\xff")
    return [text(m).split("\t", 1)[1] for m in members]


async def _pairs(r: Redis, keys: KeyLayout, tenant: str | None) -> list[tuple[str, str]]:
    if tenant is not None:
        convs = await r.zrevrange(keys.tenant_conversations(tenant), 0, -1)
        return [(tenant, text(c)) for c in convs]  # type: ignore[arg-type]
    members = await r.zrange(keys.all_conversations(), 0, -1)
    return [(t, c) for c, t in (text(m).split("\t", 1) for m in members)]  # type: ignore[arg-type]


async def list_pairs(r: Redis, keys: KeyLayout, tenant: str | None) -> list[ConversationInfo]:
    """Conversation summaries (sizes, counts, expiry); drops index entries that expired."""
    pairs = await _pairs(r, keys, tenant)
    out: list[ConversationInfo] = []
    for start in range(0, len(pairs), _BATCH):
        batch = pairs[start : start + _BATCH]
        async with r.pipeline(transaction=False) as p:
            for t, c in batch:
                k: ConversationKeys = keys.conversation(t, c)
                p.hgetall(k.meta)
                p.hlen(k.checkpoints)
                p.hlen(k.originals)
                p.pttl(k.meta)
                p.eval(_SIZE_SCRIPT, 3, k.checkpoints, k.originals, k.refs)
            rows = await p.execute()
        gone: list[tuple[str, str]] = []
        for i, (t, c) in enumerate(batch):
            raw_meta, n_cp, n_orig, pttl, n_bytes = rows[i * 5 : i * 5 + 5]
            if not raw_meta:
                gone.append((t, c))
                continue
            meta = _meta(raw_meta, t)
            out.append(
                ConversationInfo(
                    tenant=t,
                    conversation=c,
                    created_at=float(meta.get("created_at", 0)),
                    updated_at=float(meta.get("updated_at", 0)),
                    size_bytes=int(n_bytes),
                    expires_at=_expires_at(int(pttl)),
                    checkpoint_count=int(n_cp),
                    original_count=int(n_orig),
                )
            )
        if gone:
            await _forget(r, keys, gone)
    return sorted(out, key=lambda i: i.updated_at, reverse=True)


async def _forget(r: Redis, keys: KeyLayout, gone: list[tuple[str, str]]) -> None:
    async with r.pipeline(transaction=False) as p:
        for t, c in gone:
            p.zrem(keys.tenant_conversations(t), c)
            p.zrem(keys.all_conversations(), f"{c}\t{t}")
        await p.execute()


async def purge(r: Redis, keys: KeyLayout, tenant: str | None, conversation: str) -> bool:
    """Delete a conversation's keys (admin: of every tenant) and its index entries."""
    tenants = [tenant] if tenant else await admin_tenants(r, keys, conversation)
    existed = False
    for t in tenants:
        k = keys.conversation(t, conversation)
        async with r.pipeline(transaction=False) as p:
            p.hget(k.meta, "tenant")
            p.hkeys(k.refs)
            owner, refs = await p.execute()
        if owner is not None and text(owner) != t:
            raise TenantMismatchError("conversation metadata names another tenant")
        existed = existed or owner is not None
        async with r.pipeline(transaction=True) as p:
            p.delete(*k.data())
            await p.execute()
        refidx = keys.tenant_refs(t)
        owners = await r.hmget(refidx, refs) if refs else []
        mine = [ref for ref, c in zip(refs, owners, strict=True) if c == conversation.encode()]
        async with r.pipeline(transaction=False) as p:
            p.zrem(keys.tenant_conversations(t), conversation)
            p.zrem(keys.all_conversations(), f"{conversation}\t{t}")
            if mine:
                p.hdel(refidx, *mine)
            await p.execute()
    return existed
