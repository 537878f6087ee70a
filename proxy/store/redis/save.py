"""A compaction's write to Redis: the indexes that find it, then its data in one atomic script.

Step 1 points at the data before it exists: the tenant's conversation listing, its ref index
(`ref\\tconversation` members, so a ref id that two conversations share, as a fork does, finds
both) and the admin listing. Step 2 is one Lua script over the conversation's own slot: the
originals, refs, checkpoint, index and metadata, all or nothing. A compaction is acknowledged only
when step 2 returned (and, with `min_replicas_ack`, when that many replicas have it): a crash
between the steps leaves only pointers to nothing, which every reader skips, never an
acknowledged compaction whose refs cannot be resolved. Pointers also outlive their data: an index
key's expiry is pushed to at least the conversation's, and each ref entry records the expiry it
points under (a second zset), so trimming expired refs (with a margin for clock skew between
instances) never drops one whose conversation lives.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, TryAgainError

from proxy.errors import StoreError
from proxy.store import codec
from proxy.store.base import Compaction, Message
from proxy.store.redis.client import Client
from proxy.store.redis.keys import ConversationKeys, KeyLayout
from proxy.store.redis.ops import expire_at_least


def _write_lua(first: int, tenant: int) -> str:
    """Lua writing ARGV's digest/original pairs (from `first`, their number just before it)
    and then ref/digests pairs, and the meta hash (tenant and conversation at `tenant`,
    `tenant` + 1); every key of the conversation then lives `ttl` more seconds."""
    return f"""local i, last = {first}, {first - 1} + 2 * tonumber(ARGV[{first - 1}])
while i < last do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i < #ARGV do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSETNX', KEYS[5], 'created_at', now)
redis.call('HSET', KEYS[5], 'tenant', ARGV[{tenant}], 'conversation', ARGV[{tenant + 1}],
  'updated_at', now, 'ttl', ttl)
for k = 1, 5 do redis.call('EXPIRE', KEYS[k], ttl) end
"""


# KEYS: originals, refs, checkpoints, index, meta (ConversationKeys.data()).
# ARGV: ttl, now, source digest, covered_through, checkpoint, tenant, conversation, the number
# of originals, then digest/original pairs, then ref/digests pairs. Returns the stored
# checkpoint (the first writer's), whose version (redis_find) it records in the metadata.
# `#!lua`: Redis refuses it up front when out of memory, so it never stops half-way through
# its writes.
SAVE_SCRIPT = f"""#!lua
local ttl, now, d = ARGV[1], ARGV[2], ARGV[3]
redis.call('HSETNX', KEYS[3], d, ARGV[5])
if redis.call('HEXISTS', KEYS[5], 'v:' .. d) == 0 then
  local stored = redis.call('HGET', KEYS[3], d)
  redis.call('HSET', KEYS[5], 'v:' .. d, redis.sha1hex(stored) .. ':' .. #stored)
end
redis.call('HSET', KEYS[4], d, ARGV[4], '~ttl', ttl)
{_write_lua(9, 6)}return redis.call('HGET', KEYS[3], d)
"""

# KEYS as above; ARGV: ttl, now, tenant, conversation, the number of originals, then
# digest/original pairs, then ref/digests pairs. Originals and refs without a checkpoint (what
# the lossless tier forwards outside every checkpoint); pushes every key's expiry back.
ORIGINALS_SCRIPT = f"""#!lua
local ttl, now = ARGV[1], ARGV[2]
{_write_lua(6, 3)}return 1
"""

# KEYS as above; ARGV: ttl, now. Pushes a conversation's expiry back (if it still exists).
REFRESH_SCRIPT = """#!lua
if redis.call('EXISTS', KEYS[5]) == 0 then return 0 end
for k = 1, 5 do redis.call('EXPIRE', KEYS[k], ARGV[1]) end
redis.call('HSET', KEYS[5], 'updated_at', ARGV[2])
return 1
"""

# KEYS: the tenant's listing, ref index and ref expiries (one slot); ARGV: conversation, now,
# ttl, trim cutoff, then ref index members. Points at a conversation's data (before it is
# written or refreshed), trims a bounded batch of expired refs, and keeps every key at least
# as long as the data.
POINTERS_SCRIPT = """#!lua
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local expiry = tonumber(ARGV[2]) + ttl
for i = 5, #ARGV do
  redis.call('ZADD', KEYS[2], 0, ARGV[i])
  redis.call('ZADD', KEYS[3], 'GT', expiry, ARGV[i])
end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[4], 'LIMIT', 0, 100)
if #old > 0 then
  redis.call('ZREM', KEYS[2], unpack(old))
  redis.call('ZREM', KEYS[3], unpack(old))
end
for k = 1, 3 do
  redis.call('EXPIRE', KEYS[k], ttl, 'NX')
  redis.call('EXPIRE', KEYS[k], ttl, 'GT')
end
return 1
"""

CLOCK_SKEW_SECONDS = 3600
"""Refs whose expiry passed more than this long ago (by this instance's clock) are trimmed."""


def ref_member(ref: str, conversation: str) -> str:
    """A ref index member: sorted by ref id, so ZRANGEBYLEX finds every conversation of a ref."""
    return f"{ref}\t{conversation}"


def queue_pointers(
    p: Any,
    keys: KeyLayout,
    *,
    tenant: str,
    conversation: str,
    ref_ids: list[str],
    ttl: int,
    now: float,
) -> None:
    """Queue the index writes that must precede (and outlive) a conversation's data."""
    tenant_keys = (
        keys.tenant_conversations(tenant),
        keys.tenant_refs(tenant),
        keys.tenant_ref_expiry(tenant),
    )
    members = [ref_member(ref, conversation) for ref in ref_ids]
    p.eval(
        POINTERS_SCRIPT,
        3,
        *tenant_keys,
        conversation,
        now,
        ttl,
        now - CLOCK_SKEW_SECONDS,
        *members,
    )
    admin = keys.all_conversations(conversation)
    p.zadd(admin, {f"{conversation}\t{tenant}": 0})
    expire_at_least(p, admin, ttl)


def save_args(compaction: Compaction, ttl: int, now: float) -> list[Any]:
    """ARGV of SAVE_SCRIPT."""
    cp = compaction.checkpoint
    tenant = cp.tenant
    args: list[Any] = [ttl, now, cp.source_digest, cp.covered_through, codec.dump_checkpoint(cp)]
    args += [tenant, cp.conversation]
    return args + _pair_args(tenant, compaction.originals, compaction.refs)


def _pair_args(
    tenant: str, originals: Mapping[str, Message], refs: Mapping[str, list[str]]
) -> list[Any]:
    """The number of originals, digest/original pairs, then ref/digests pairs."""
    args: list[Any] = [len(originals)]
    for digest, message in originals.items():
        args += [digest, codec.dump_original(tenant, message)]
    for ref, digests in refs.items():
        args += [ref, codec.dump_ref(tenant, digests)]
    return args


async def durable_pipeline(
    r: Client, key: str, queue: Any, *, min_acks: int, wait_ms: int
) -> list[Any]:
    """Run the commands `queue(pipeline)` adds, all for `key`'s slot; with `min_acks`, then WAIT
    on the same connection until that many replicas have them (StoreError if they do not).

    WAIT counts the replicas that acknowledged this connection's writes, so on a cluster the
    pipeline must not be redirected half-way to another connection: a MOVED is followed by
    re-sending the whole pipeline to the new master; an ASK or TRYAGAIN (the slot is being
    migrated) fails the write, and the caller fails open."""
    if min_acks <= 0:
        async with r.pipeline(transaction=False) as p:
            queue(p)
            return list(await p.execute())
    for _ in range(3):
        if isinstance(r, RedisCluster):
            async with r.pipeline(transaction=False) as cp:
                queue(cp)
                cp.execute_command("WAIT", min_acks, wait_ms, target_nodes=r.get_node_from_key(key))
                try:
                    replies = list(await cp.execute(allow_redirections=False))
                except MovedError as exc:
                    await r.nodes_manager.move_slot(exc)
                    continue
                except (AskError, TryAgainError) as exc:
                    raise StoreError(f"slot of {key[:40]!r} is migrating; write not made") from exc
        else:
            async with r.pipeline(transaction=False) as p:
                queue(p)
                p.execute_command("WAIT", min_acks, wait_ms)
                replies = list(await p.execute())
        acked = int(replies[-1])
        if acked < min_acks:
            raise StoreError(f"{acked} of {min_acks} replicas acknowledged within {wait_ms} ms")
        return replies[:-1]
    raise StoreError(f"slot of {key[:40]!r} kept moving; write not made")


async def _write(
    r: Client,
    keys: KeyLayout,
    *,
    tenant: str,
    conversation: str,
    ref_ids: list[str],
    script: str,
    args: list[Any],
    ttl: int,
    now: float,
    min_acks: int,
    wait_ms: int,
) -> Any:
    """Pointers first, then the data in one script over the conversation's keys; its reply."""
    k: ConversationKeys = keys.conversation(tenant, conversation)
    await durable_pipeline(
        r,
        keys.tenant_refs(tenant),
        lambda p: queue_pointers(
            p, keys, tenant=tenant, conversation=conversation, ref_ids=ref_ids, ttl=ttl, now=now
        ),
        min_acks=min_acks,
        wait_ms=wait_ms,
    )
    (reply,) = await durable_pipeline(
        r,
        k.meta,
        lambda p: p.eval(script, 5, *k.data(), *args),
        min_acks=min_acks,
        wait_ms=wait_ms,
    )
    return reply


async def save(
    r: Client,
    keys: KeyLayout,
    compaction: Compaction,
    ttl: int,
    *,
    min_acks: int = 0,
    wait_ms: int = 0,
) -> bytes:
    """Pointers first, then the data in one script; returns the stored checkpoint."""
    cp = compaction.checkpoint
    now = time.time()
    stored = await _write(
        r,
        keys,
        tenant=cp.tenant,
        conversation=cp.conversation,
        ref_ids=list(compaction.refs),
        script=SAVE_SCRIPT,
        args=save_args(compaction, ttl, now),
        ttl=ttl,
        now=now,
        min_acks=min_acks,
        wait_ms=wait_ms,
    )
    if stored is None:
        raise StoreError("the checkpoint was not stored")
    return bytes(stored)


async def save_originals(
    r: Client,
    keys: KeyLayout,
    *,
    tenant: str,
    conversation: str,
    originals: Mapping[str, Message],
    refs: Mapping[str, list[str]],
    ttl: int,
    min_acks: int = 0,
    wait_ms: int = 0,
) -> None:
    """Pointers first (as for a compaction), then originals and refs in one script."""
    now = time.time()
    await _write(
        r,
        keys,
        tenant=tenant,
        conversation=conversation,
        ref_ids=list(refs),
        script=ORIGINALS_SCRIPT,
        args=[ttl, now, tenant, conversation, *_pair_args(tenant, originals, refs)],
        ttl=ttl,
        now=now,
        min_acks=min_acks,
        wait_ms=wait_ms,
    )


async def refresh(
    r: Client,
    keys: KeyLayout,
    *,
    tenant: str,
    conversation: str,
    ref_ids: list[str],
    ttl: int,
) -> None:
    """Push a conversation's expiry back by `ttl`: its pointers first, then its data."""
    now = time.time()
    k = keys.conversation(tenant, conversation)
    async with r.pipeline(transaction=False) as p:
        queue_pointers(
            p, keys, tenant=tenant, conversation=conversation, ref_ids=ref_ids, ttl=ttl, now=now
        )
        await p.execute()
    await r.eval(REFRESH_SCRIPT, 5, *k.data(), ttl, now)
