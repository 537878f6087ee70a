"""Multi-step Redis reads used by RedisStore: a conversation, listings, refs, index upkeep.

Every pipeline here may span slots: on a cluster, redis-py sends each node its share."""

from __future__ import annotations

import time
from typing import Any

from proxy.errors import TenantMismatchError
from proxy.store import codec
from proxy.store.base import ConversationInfo, Message
from proxy.store.redis.client import Client
from proxy.store.redis.keys import ConversationKeys, KeyLayout

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
FORGET_AFTER_SECONDS = 600
"""A listing entry whose conversation is gone is dropped only once it is this old: a save
writes the entry just before the data, and a listing must not drop one in between."""


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
    r: Client, keys: KeyLayout, tenant: str, conversation: str
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
    loaded = codec.load_conversation(
        tenant, *(((text(k), v) for k, v in h.items()) for h in (cps, origs, refs))
    )
    size = sum(len(v) for h in (cps, origs, refs) for v in h.values())
    return ConversationInfo(
        tenant=tenant,
        conversation=conversation,
        created_at=float(meta.get("created_at", 0)),
        updated_at=float(meta.get("updated_at", 0)),
        checkpoints=loaded.checkpoints,
        originals=loaded.originals,
        refs=loaded.refs,
        size_bytes=size,
        expires_at=_expires_at(int(pttl)),
        checkpoint_count=len(cps),
        original_count=len(origs),
        unreadable=loaded.unreadable,
    )


async def admin_tenants(r: Client, keys: KeyLayout, conversation: str) -> list[str]:
    """Tenants that have a conversation with this id (the admin index is ordered by id): in
    its shard, and in the unsharded key of builds before."""
    low = b"[" + conversation.encode() + b"\t"
    async with r.pipeline(transaction=False) as p:
        for key in (keys.all_conversations(conversation), keys.legacy_all()):
            p.zrangebylex(key, low, low + b"\xff")
        found = await p.execute()
    return list(dict.fromkeys(text(m).split("\t", 1)[1] for ms in found for m in ms))


async def _pairs(r: Client, keys: KeyLayout, tenant: str | None) -> list[tuple[str, str]]:
    if tenant is not None:
        convs = await r.zrevrange(keys.tenant_conversations(tenant), 0, -1)
        return [(tenant, text(c)) for c in convs]  # type: ignore[arg-type]
    async with r.pipeline(transaction=False) as p:
        for key in keys.all_conversation_shards():
            p.zrange(key, 0, -1)
        shards = await p.execute()
    members = dict.fromkeys(text(m) for ms in shards for m in ms)
    return [(t, c) for c, t in (m.split("\t", 1) for m in members)]


async def list_pairs(r: Client, keys: KeyLayout, tenant: str | None) -> list[ConversationInfo]:
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


async def _forget(r: Client, keys: KeyLayout, gone: list[tuple[str, str]]) -> None:
    """Drop listing entries of expired conversations (not of ones being written right now)."""
    async with r.pipeline(transaction=False) as p:
        for t, c in gone:
            p.zscore(keys.tenant_conversations(t), c)
        scores = await p.execute()
    cutoff = time.time() - FORGET_AFTER_SECONDS
    old = [pair for pair, score in zip(gone, scores, strict=True) if not score or score < cutoff]
    if not old:
        return
    async with r.pipeline(transaction=False) as p:
        for t, c in old:
            p.zrem(keys.tenant_conversations(t), c)
            p.zrem(keys.all_conversations(c), f"{c}\t{t}")
            p.zrem(keys.legacy_all(), f"{c}\t{t}")
        await p.execute()


async def purge(r: Client, keys: KeyLayout, tenant: str | None, conversation: str) -> bool:
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
        async with r.pipeline(transaction=False) as p:
            p.zrem(keys.tenant_conversations(t), conversation)
            p.zrem(keys.all_conversations(conversation), f"{conversation}\t{t}")
            p.zrem(keys.legacy_all(), f"{conversation}\t{t}")
            if refs:
                members = [f"{text(ref)}\t{conversation}" for ref in refs]
                p.zrem(keys.tenant_refs(t), *members)
                p.zrem(keys.tenant_ref_expiry(t), *members)
                p.hdel(keys.legacy_tenant_refs(t), *refs)
                # The LLM summaries of its spans (in the tenant's slot, like the indexes).
                p.delete(*[keys.summary(t, text(ref)) for ref in refs])
            await p.execute()
    return existed


async def ref_candidates(
    r: Client, keys: KeyLayout, tenant: str, ref_ids: list[str]
) -> list[tuple[str, str]]:
    """(ref, conversation) for every conversation the tenant's ref index lists for the ids (in
    one round trip; an entry may point at a conversation that has expired since)."""
    index = keys.tenant_refs(tenant)
    async with r.pipeline(transaction=False) as p:
        for ref in ref_ids:
            low = f"[{ref}\t".encode()
            p.zrangebylex(index, low, low + b"\xff")
        # Refs written before the index was a zset (same slot: no extra round trip).
        p.hmget(keys.legacy_tenant_refs(tenant), ref_ids)
        *members, legacy = await p.execute()
    candidates = [
        (ref, text(m).split("\t", 1)[1])
        for ref, ms in zip(ref_ids, members, strict=True)
        for m in ms
    ]
    candidates += [
        (ref, text(conv)) for ref, conv in zip(ref_ids, legacy, strict=True) if conv is not None
    ]
    return candidates


async def resolve_refs(
    r: Client, keys: KeyLayout, tenant: str, ref_ids: list[str]
) -> dict[str, list[Message]]:
    """Reference id -> originals, in three round trips: the ref index (every conversation that
    stores the id), those conversations' refs, then their originals. The first conversation
    that still holds every original of a ref answers; entries pointing at nothing are skipped."""
    candidates = await ref_candidates(r, keys, tenant, ref_ids)
    if not candidates:
        return {}
    async with r.pipeline(transaction=False) as p:
        for ref, conv in candidates:
            p.hget(keys.conversation(tenant, conv).refs, ref)
        ref_rows = await p.execute()
    found = [
        (ref, conv, codec.load_ref(raw, tenant))
        for (ref, conv), raw in zip(candidates, ref_rows, strict=True)
        if raw is not None
    ]
    async with r.pipeline(transaction=False) as p:
        for _, conv, digests in found:
            p.hmget(keys.conversation(tenant, conv).originals, digests)
        originals = await p.execute()
    out: dict[str, list[Message]] = {}
    for (ref, _, _), rows in zip(found, originals, strict=True):
        if ref not in out and rows and all(row is not None for row in rows):
            out[ref] = [codec.load_original(row, tenant) for row in rows]
    return out
