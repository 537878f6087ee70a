"""The Redis store: redis-py asyncio over a blocking connection pool, one MULTI/EXEC per write.

Every call runs in its own task behind `asyncio.shield`, bounded by the configured timeout: a
request cancelled by a client disconnect never interrupts a command half-way, which is how a
pooled connection got out of step and leaked chats across users in 2023 (CVE-2023-28858/9).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from proxy.store import codec, redis_find, redis_usage
from proxy.store.base import (
    INSPECTION_TIMEOUT_SECONDS,
    Checkpoint,
    Compaction,
    ConversationInfo,
    Message,
    StoreError,
    UsageRecord,
    check_ids,
)
from proxy.store.redis_keys import KeyLayout
from proxy.store.redis_ops import (
    admin_tenants,
    expire_at_least,
    fetch_conversation,
    list_pairs,
    purge,
    text,
)

T = TypeVar("T")

# Kept in the checkpoint index (whose other fields are hex digests) so that the find script
# also learns the retention to refresh; redis_find.FIND_SCRIPT names the same field.
TTL_FIELD = b"~ttl"


class RedisStore:
    """The Store protocol over Redis (standalone, or one shard per conversation on Cluster)."""

    def __init__(self, client: Redis, *, timeout: float, keys: KeyLayout) -> None:
        self._client = client
        self._timeout = timeout
        self._keys = keys
        self._find_script = client.register_script(redis_find.FIND_SCRIPT)
        # Strong references to shielded calls still running after their caller gave up.
        self._inflight: set[asyncio.Task[Any]] = set()

    @classmethod
    async def open(
        cls, url: str, *, timeout_ms: int = 200, pool_size: int = 50, prefix: str = "compactd:"
    ) -> RedisStore:
        """Create the pool and pre-open a few connections (a burst then finds them ready)."""
        timeout = timeout_ms / 1000
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # One immediate retry on a broken connection only: after a Redis restart every pooled
            # connection is dead, and the first use of each would otherwise fail a request. Not on
            # timeouts: a slow Redis must fail open at the deadline, not twice as late.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        store = cls(Redis.from_pool(pool), timeout=timeout, keys=KeyLayout(prefix))
        warm = [store.ping() for _ in range(min(pool_size, 4))]
        await asyncio.gather(*warm, return_exceptions=True)
        return store

    async def _io(self, op: Callable[[Redis], Awaitable[T]], *, slow: bool = False) -> T:
        """Run `op` shielded from cancellation, bounded by the timeout (`slow`: the inspection
        timeout), errors as StoreError."""
        timeout = max(self._timeout, INSPECTION_TIMEOUT_SECONDS) if slow else self._timeout
        task: asyncio.Task[T] = asyncio.ensure_future(op(self._client))
        self._inflight.add(task)
        task.add_done_callback(self._settle)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(task)
        except TimeoutError as exc:
            raise StoreError(f"redis did not answer within {timeout * 1000:.0f} ms") from exc
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis: {type(exc).__name__}: {exc}") from exc

    def _settle(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late failure was already reported to the caller

    async def find_checkpoint(
        self, tenant: str, conversation: str, prefix_digests: list[str]
    ) -> Checkpoint | None:
        """Longest matching checkpoint in one round trip (a script); refreshes retention when used
        (at most about once a minute per conversation, plus one round trip for the index)."""
        k = self._keys.conversation(tenant, conversation)
        if not prefix_digests:
            return None

        async def op(r: Redis) -> bytes | None:
            body, refreshed_to = await redis_find.find(r, self._find_script, k, prefix_digests)
            if refreshed_to:
                # The tenant's listing index lives in another slot: a second, rare round trip.
                index = self._keys.tenant_conversations(tenant)
                async with r.pipeline(transaction=False) as p:
                    p.zadd(index, {conversation: time.time()})
                    expire_at_least(p, index, refreshed_to)
                    await p.execute()
            return body

        raw = await self._io(op)
        return None if raw is None else codec.load_checkpoint(raw, tenant)

    async def save_compaction(self, compaction: Compaction, ttl_seconds: int) -> Checkpoint:
        """One MULTI/EXEC for the conversation's keys, then the cross-slot indexes."""
        cp = compaction.checkpoint
        tenant, conv = cp.tenant, cp.conversation
        k = self._keys.conversation(tenant, conv)
        originals = {d: codec.dump_original(tenant, m) for d, m in compaction.originals.items()}
        refs = {ref: codec.dump_ref(tenant, ds) for ref, ds in compaction.refs.items()}
        body = codec.dump_checkpoint(cp)
        now = time.time()

        async def op(r: Redis) -> bytes:
            async with r.pipeline(transaction=True) as p:
                if originals:
                    p.hset(k.originals, mapping=originals)  # type: ignore[arg-type]
                if refs:
                    p.hset(k.refs, mapping=refs)  # type: ignore[arg-type]
                p.hsetnx(k.checkpoints, cp.source_digest, body)
                p.hset(
                    k.index, mapping={cp.source_digest: cp.covered_through, TTL_FIELD: ttl_seconds}
                )
                p.hsetnx(k.meta, "created_at", now)
                meta: dict[str | bytes, str | float | int] = {
                    "tenant": tenant,
                    "conversation": conv,
                    "updated_at": now,
                    "ttl": ttl_seconds,
                }
                p.hset(k.meta, mapping=meta)  # type: ignore[arg-type]
                for key in k.data():
                    p.expire(key, ttl_seconds)
                p.hget(k.checkpoints, cp.source_digest)
                stored: bytes = (await p.execute())[-1]
            async with r.pipeline(transaction=False) as p:
                p.zadd(self._keys.tenant_conversations(tenant), {conv: now})
                expire_at_least(p, self._keys.tenant_conversations(tenant), ttl_seconds)
                p.zadd(self._keys.all_conversations(), {f"{conv}\t{tenant}": 0})
                expire_at_least(p, self._keys.all_conversations(), ttl_seconds)
                if refs:
                    p.hset(self._keys.tenant_refs(tenant), mapping=dict.fromkeys(refs, conv))
                    expire_at_least(p, self._keys.tenant_refs(tenant), ttl_seconds)
                await p.execute()
            return stored

        return codec.load_checkpoint(await self._io(op), tenant)

    async def resolve_refs(self, tenant: str, ref_ids: list[str]) -> dict[str, list[Message]]:
        """Reference id -> originals: ref index, then refs, then originals (three round trips)."""
        if not ref_ids:
            return {}

        async def op(r: Redis) -> list[tuple[str, bytes, list[bytes | None]]]:
            convs = await r.hmget(self._keys.tenant_refs(tenant), ref_ids)
            owners = [(ref, text(c)) for ref, c in zip(ref_ids, convs, strict=True) if c]
            async with r.pipeline(transaction=False) as p:
                for ref, conv in owners:
                    p.hget(self._keys.conversation(tenant, conv).refs, ref)
                ref_rows = await p.execute()
            found = [(ref, conv, raw) for (ref, conv), raw in zip(owners, ref_rows, strict=True)]
            found = [(ref, conv, raw) for ref, conv, raw in found if raw is not None]
            async with r.pipeline(transaction=False) as p:
                for _, conv, raw in found:
                    p.hmget(
                        self._keys.conversation(tenant, conv).originals, codec.load_ref(raw, tenant)
                    )
                originals = await p.execute()
            return [(ref, raw, o) for (ref, _, raw), o in zip(found, originals, strict=True)]

        out: dict[str, list[Message]] = {}
        for ref, raw, rows in await self._io(op, slow=True):
            codec.load_ref(raw, tenant)
            if rows and all(row is not None for row in rows):
                out[ref] = [codec.load_original(row, tenant) for row in rows if row is not None]
        return out

    async def get_conversation(
        self, tenant: str | None, conversation: str
    ) -> ConversationInfo | None:
        """Everything stored for one conversation (admin: the most recently used of that id)."""
        check_ids(tenant, conversation)
        if tenant is not None:
            return await self._io(
                lambda r: fetch_conversation(r, self._keys, tenant, conversation), slow=True
            )
        infos = [
            await self.get_conversation(t, conversation)
            for t in await self._io(lambda r: admin_tenants(r, self._keys, conversation), slow=True)
        ]
        found = [i for i in infos if i is not None]
        return max(found, key=lambda i: i.updated_at) if found else None

    async def list_conversations(self, tenant: str | None) -> list[ConversationInfo]:
        """Conversations with sizes and counts, most recently used first (no originals)."""
        return await self._io(lambda r: list_pairs(r, self._keys, tenant), slow=True)

    async def purge(self, tenant: str | None, conversation: str) -> bool:
        """Delete the conversation's keys and its index entries."""
        check_ids(tenant, conversation)

        return await self._io(lambda r: purge(r, self._keys, tenant, conversation), slow=True)

    async def get_summary(self, tenant: str, digest: str) -> str | None:
        """A cached summary by source digest."""
        raw = await self._io(lambda r: r.get(self._keys.summary(tenant, digest)))
        return None if raw is None else codec.load_summary(raw, tenant)

    async def put_summary(self, tenant: str, digest: str, summary: str, ttl_seconds: int) -> None:
        """Cache a summary, expiring after `ttl_seconds`."""
        raw = codec.dump_summary(tenant, summary)
        await self._io(lambda r: r.set(self._keys.summary(tenant, digest), raw, ex=ttl_seconds))

    async def record_usage(self, record: UsageRecord) -> None:
        """HINCRBY the request's counters into its day's hash (kept 400 days)."""
        await self._io(lambda r: redis_usage.record_usage(r, self._keys, record))

    async def usage(self, tenant: str | None, since_day: str) -> list[dict[str, Any]]:
        """Aggregates per (tenant, policy, model, day) from `since_day` on."""
        return await self._io(
            lambda r: redis_usage.usage(r, self._keys, tenant, since_day), slow=True
        )

    async def ping(self) -> None:
        """Raise StoreError unless Redis answers PING."""
        await self._io(lambda r: r.ping())

    async def check_config(self) -> list[str]:
        """Warn about no persistence or an evicting maxmemory-policy; tolerate disabled CONFIG."""
        try:
            cfg = await self._io(lambda r: r.config_get("appendonly", "save", "maxmemory-policy"))
        except StoreError as exc:
            if not isinstance(exc.__cause__, ResponseError):
                raise
            return await self._io(self._check_info)
        warnings = []
        if cfg.get("appendonly") != "yes" and not cfg.get("save"):
            warnings.append(
                "redis has no persistence (appendonly no, save ''): a restart loses every "
                "stored original; run with appendonly yes, appendfsync everysec"
            )
        policy = cfg.get("maxmemory-policy") or "noeviction"
        if policy != "noeviction":
            warnings.append(_eviction_warning(policy))
        return warnings

    async def _check_info(self, r: Redis) -> list[str]:
        info = await r.info("persistence")
        memory = await r.info("memory")
        warnings = ["redis CONFIG is disabled; RDB snapshot settings could not be checked"]
        if not int(info.get("aof_enabled", 0)):
            warnings.append("redis runs without AOF (appendonly no): recent originals may be lost")
        policy = str(memory.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            warnings.append(_eviction_warning(policy))
        return warnings

    async def close(self) -> None:
        """Let shielded calls finish (bounded), then close the pool."""
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self._timeout * 2)
        await self._client.aclose()


def _eviction_warning(policy: str) -> str:
    return (
        f"redis maxmemory-policy is {policy}: under memory pressure Redis deletes stored "
        "originals; set maxmemory-policy noeviction"
    )
