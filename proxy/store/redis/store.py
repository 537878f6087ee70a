"""The Redis store: redis-py asyncio on one server (a blocking connection pool) or a Redis
Cluster; a compaction is its index pointers, then one atomic script (see redis_save).

Every call runs in its own task behind `asyncio.shield`, bounded by the configured timeout: a
request cancelled by a client disconnect never interrupts a command half-way, which is how a
pooled connection got out of step and leaked chats across users in 2023 (CVE-2023-28858/9).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from proxy.errors import StoreError
from proxy.store import codec, windows_ops
from proxy.store.base import (
    INSPECTION_TIMEOUT_SECONDS,
    ActivityDelta,
    Checkpoint,
    Compaction,
    ConversationInfo,
    Message,
    UsageDelta,
    UsageRecord,
    check_ids,
)
from proxy.store.decoded import DecodedCheckpoints
from proxy.store.redis import activity as redis_activity
from proxy.store.redis import find as redis_find
from proxy.store.redis import save as redis_save
from proxy.store.redis import usage as redis_usage
from proxy.store.redis.client import Client, open_client
from proxy.store.redis.keys import ConversationKeys, KeyLayout
from proxy.store.redis.ops import (
    admin_tenants,
    fetch_conversation,
    list_pairs,
    purge,
    ref_candidates,
    resolve_refs,
)

T = TypeVar("T")

# Accounting's own connections (per node on a cluster): usage batches never take one that a
# compaction write waits for.
USAGE_POOL_SIZE = 2
MAX_UNVERSIONED = 4096
"""Checkpoints known to be stored without a version (written before versions were)."""


def raised_in_client(exc: BaseException) -> bool:
    """Whether `exc` came from inside redis-py rather than from our code around it.

    redis-py's asyncio cluster client has races that surface as plain Python errors: while a
    slot migrates or a node fails, a connection one command uses is closed by another, and the
    next write meets `AttributeError: 'NoneType' object has no attribute 'writelines'` (seen in
    tests/store/test_cluster.py; redis-py #3546, #3835 report the same family). To compactd that
    is the store failing, to be answered like any other store fault (fail open, "store")."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module == "redis" or module.startswith("redis."):
            return True
        tb = tb.tb_next
    return False


class RedisStore:
    """The Store protocol over Redis (one server, or a cluster: one slot per conversation)."""

    def __init__(
        self,
        client: Client,
        *,
        timeout: float,
        keys: KeyLayout,
        min_replicas_ack: int = 0,
        usage_client: Client | None = None,
        slow_client: Client | None = None,
    ) -> None:
        self._client = client
        # Accounting has its own small pool: a batch of counters never takes a connection a
        # compaction write is waiting for.
        self._usage_client = usage_client or client
        # Calls given the inspection timeout need sockets that wait as long: a socket of the
        # main pool gives up at the store timeout (200 ms), whatever the call may take.
        self._slow_client = slow_client or client
        self._timeout = timeout
        self._over_budget_timeout = timeout
        self._keys = keys
        self._min_acks = min_replicas_ack
        self._find_script = client.register_script(redis_find.FIND_SCRIPT)
        self._decoded = DecodedCheckpoints()
        self._unversioned: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        # Strong references to shielded calls still running after their caller gave up.
        self._inflight: set[asyncio.Task[Any]] = set()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        timeout_ms: int = 200,
        over_budget_timeout_ms: int = 0,
        pool_size: int = 50,
        prefix: str = "compactd:",
        min_replicas_ack: int = 0,
    ) -> RedisStore:
        """Create the client and pre-open a few connections (a burst then finds them ready).

        `min_replicas_ack`: a compaction is acknowledged only once that many replicas have it
        (WAIT, within the timeout); otherwise the write fails and the request fails open."""
        timeout = timeout_ms / 1000
        client = open_client(url, timeout=timeout, pool_size=pool_size)
        usage_client = open_client(
            url, timeout=INSPECTION_TIMEOUT_SECONDS, pool_size=USAGE_POOL_SIZE
        )
        # Connections are made on first use: a pool as large as the main one costs nothing idle.
        slow_client = open_client(url, timeout=INSPECTION_TIMEOUT_SECONDS, pool_size=pool_size)
        store = cls(
            client,
            timeout=timeout,
            keys=KeyLayout(prefix),
            min_replicas_ack=min_replicas_ack,
            usage_client=usage_client,
            slow_client=slow_client,
        )
        store._over_budget_timeout = max(over_budget_timeout_ms / 1000, timeout)
        warm = [store.ping() for _ in range(min(pool_size, 4))]
        await asyncio.gather(*warm, return_exceptions=True)
        return store

    @property
    def cluster(self) -> bool:
        """Whether this store talks to a Redis Cluster."""
        return isinstance(self._client, RedisCluster)

    async def _io(
        self,
        op: Callable[[Client], Awaitable[T]],
        *,
        slow: bool = False,
        usage: bool = False,
        over_budget: bool = False,
    ) -> T:
        """Run `op` shielded from cancellation, bounded by the timeout (`slow`: the inspection
        timeout; `usage`: on the accounting pool; `over_budget`: a request over its trigger's
        lookup or save, within over_budget_timeout_ms on the pool whose sockets wait that long),
        errors as StoreError."""
        timeout = max(self._timeout, INSPECTION_TIMEOUT_SECONDS) if slow else self._timeout
        if over_budget:
            timeout = self._over_budget_timeout
        client = (
            self._usage_client
            if usage
            else self._slow_client
            if slow or over_budget
            else self._client
        )
        task: asyncio.Task[T] = asyncio.ensure_future(op(client))
        self._inflight.add(task)
        task.add_done_callback(self._settle)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(task)
        except TimeoutError as exc:
            raise StoreError(f"redis did not answer within {timeout * 1000:.0f} ms") from exc
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if not raised_in_client(exc):
                raise
            raise StoreError(f"redis client fault: {type(exc).__name__}: {exc}") from exc

    def _settle(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late failure was already reported to the caller

    async def find_checkpoint(
        self, tenant: str, conversation: str, prefix_digests: list[str]
    ) -> Checkpoint | None:
        """Longest matching checkpoint in one round trip (a script): when this instance holds
        it, only "still stored, same version" comes back (see redis_find). Refreshes retention
        when used (at most about once a minute per conversation: two more round trips)."""
        k = self._keys.conversation(tenant, conversation)
        if not prefix_digests:
            return None
        held = self._decoded.known(tenant, conversation, prefix_digests)
        if held is not None and (tenant, conversation, held.source_digest) not in self._unversioned:
            found = await self._io(
                lambda r: self._find(r, k, prefix_digests, held), over_budget=True
            )
            n = len(prefix_digests)
            if found.held and not any(p < n and prefix_digests[p] == d for p, d in found.longer):
                return held
        # Only requests over their trigger look.
        found = await self._io(lambda r: self._find(r, k, prefix_digests, None), over_budget=True)
        if found.body is None:
            return None
        cp = self._decoded.load(found.body, tenant)
        # One written before versions were: looked up in full until a save records its version.
        ident = (tenant, conversation, cp.source_digest)
        if found.version:
            self._unversioned.pop(ident, None)
        else:
            self._unversioned[ident] = None
            while len(self._unversioned) > MAX_UNVERSIONED:
                self._unversioned.popitem(last=False)
        return cp

    async def _find(
        self, r: Client, k: ConversationKeys, prefix_digests: list[str], held: Checkpoint | None
    ) -> redis_find.Found:
        """One lookup (held: asking whether that checkpoint stands), then the due refresh."""
        ask = None if held is None else (held.source_digest, held.version, held.covered_through)
        found = await redis_find.find(r, self._find_script, k, prefix_digests, ask)
        if found.due_ttl:
            await redis_save.refresh(
                r,
                self._keys,
                tenant=k.tenant,
                conversation=k.conversation,
                ref_ids=found.refs,
                ttl=found.due_ttl,
            )
        return found

    async def save_compaction(self, compaction: Compaction, ttl_seconds: int) -> Checkpoint:
        """The indexes, then originals, refs and checkpoint in one script (see redis_save);
        with min_replicas_ack, each of the two steps waits for that many replicas (for at most
        a third of the timeout each, so a missing replica is reported as such)."""
        tenant = compaction.checkpoint.tenant
        check_ids(tenant, compaction.checkpoint.conversation)
        wait_ms = max(1, int(self._timeout * 1000) // 3)
        stored = await self._io(
            lambda r: redis_save.save(
                r,
                self._keys,
                compaction,
                ttl_seconds,
                min_acks=self._min_acks,
                wait_ms=wait_ms,
            ),
            over_budget=True,
        )
        return self._decoded.load(stored, tenant)

    async def save_originals(
        self,
        tenant: str,
        conversation: str,
        originals: Mapping[str, Message],
        refs: Mapping[str, list[str]],
        ttl_seconds: int,
    ) -> None:
        """The ref index, then originals and refs in one script (redis_save.save_originals)."""
        check_ids(tenant, conversation)
        wait_ms = max(1, int(self._timeout * 1000) // 3)
        await self._io(
            lambda r: redis_save.save_originals(
                r,
                self._keys,
                tenant=tenant,
                conversation=conversation,
                originals=originals,
                refs=refs,
                ttl=ttl_seconds,
                min_acks=self._min_acks,
                wait_ms=wait_ms,
            ),
            over_budget=True,
        )

    async def resolve_refs(self, tenant: str, ref_ids: list[str]) -> dict[str, list[Message]]:
        """Reference id -> originals (three round trips: the ref index, refs, originals)."""
        if not ref_ids:
            return {}
        return await self._io(
            lambda r: resolve_refs(r, self._keys, tenant, list(ref_ids)), slow=True
        )

    async def ref_conversations(self, tenant: str, ref_ids: list[str]) -> dict[str, list[str]]:
        """Reference id -> the conversations of this tenant whose refs hold it (still live)."""
        if not ref_ids:
            return {}

        async def op(r: Client) -> dict[str, list[str]]:
            candidates = await ref_candidates(r, self._keys, tenant, list(ref_ids))
            async with r.pipeline(transaction=False) as p:
                for ref, conv in candidates:
                    p.hexists(self._keys.conversation(tenant, conv).refs, ref)
                live = await p.execute()
            out: dict[str, list[str]] = {}
            for (ref, conv), present in zip(candidates, live, strict=True):
                if present and conv not in out.get(ref, []):
                    out.setdefault(ref, []).append(conv)
            return out

        return await self._io(op, slow=True)

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

        gone = await self._io(lambda r: purge(r, self._keys, tenant, conversation), slow=True)
        await self._io(
            lambda r: redis_activity.purge(r, self._keys, tenant, conversation), slow=True
        )
        return gone

    async def get_summary(self, tenant: str, digest: str) -> str | None:
        """A cached summary by source digest."""
        raw = await self._io(lambda r: r.get(self._keys.summary(tenant, digest)))
        return None if raw is None else codec.load_summary(raw, tenant, digest)

    async def put_summary(self, tenant: str, digest: str, summary: str, ttl_seconds: int) -> None:
        """Cache a summary, expiring after `ttl_seconds`."""
        raw = codec.dump_summary(tenant, digest, summary)
        await self._io(lambda r: r.set(self._keys.summary(tenant, digest), raw, ex=ttl_seconds))

    async def record_usage(self, record: UsageRecord) -> None:
        """HINCRBY the request's counters into its day's hash (kept 400 days)."""
        await self.add_usage([codec.usage_delta(record)])

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        """HINCRBY a batch into the days' hashes, on the accounting pool."""
        if deltas:
            await self._io(
                lambda r: redis_usage.add_usage(r, self._keys, deltas), slow=True, usage=True
            )

    async def usage(self, tenant: str | None, since_day: str) -> list[dict[str, Any]]:
        """Aggregates per (tenant, policy, model, day) from `since_day` on."""
        return await self._io(
            lambda r: redis_usage.usage(r, self._keys, tenant, since_day), slow=True, usage=True
        )

    async def add_activity(self, deltas: Sequence[ActivityDelta], ttl_seconds: int) -> None:
        """A batch of conversations' activity, on the accounting pool."""
        if deltas:
            await self._io(
                lambda r: redis_activity.add(r, self._keys, deltas, ttl_seconds),
                slow=True,
                usage=True,
            )

    async def activity(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        """The most recently active conversations, newest first."""
        return await self._io(
            lambda r: redis_activity.recent(r, self._keys, tenant, limit), slow=True, usage=True
        )

    async def put_window(self, scope: str, model: str, window: int, ttl_seconds: int) -> None:
        """Record a learned context window in the upstream's hash."""
        await self._io(
            lambda r: windows_ops.redis_put(
                r, self._keys, scope, model, window=window, ttl=ttl_seconds
            ),
            slow=True,
        )

    async def windows(self, scope: str) -> dict[str, int]:
        """Every live learned window of an upstream."""
        return await self._io(lambda r: windows_ops.redis_windows(r, self._keys, scope), slow=True)

    async def put_calibration(self, api: str, model: str, ratio: float, ttl_seconds: int) -> None:
        """Record a calibration ratio (next to the learned windows, see `windows_ops`)."""
        value = round(ratio * windows_ops.CALIBRATION_SCALE)
        scope = windows_ops.calibration_scope(api)
        await self._io(
            lambda r: windows_ops.redis_put(
                r, self._keys, scope, model, window=value, ttl=ttl_seconds
            ),
            slow=True,
        )

    async def calibrations(self, api: str) -> dict[str, float]:
        """Every live calibration ratio of an API."""
        scope = windows_ops.calibration_scope(api)
        found = await self._io(lambda r: windows_ops.redis_windows(r, self._keys, scope), slow=True)
        return {m: v / windows_ops.CALIBRATION_SCALE for m, v in found.items()}

    async def ping(self) -> None:
        """Raise StoreError unless Redis answers PING."""
        await self._io(lambda r: r.ping())

    async def check_config(self) -> list[str]:
        """Warn about no persistence, an evicting maxmemory-policy or fewer replicas than
        min_replicas_ack, on every master of a cluster; tolerate a disabled CONFIG."""
        if not isinstance(self._client, RedisCluster):
            return await self._check_node({}, "redis")
        warnings: list[str] = []
        for node in self._client.get_primaries():
            for w in await self._check_node({"target_nodes": node}, f"redis {node.name}"):
                if w not in warnings:
                    warnings.append(w)
        return warnings

    async def _check_node(self, target: dict[str, Any], name: str) -> list[str]:
        try:
            cfg = await self._io(
                lambda r: r.config_get("appendonly", "save", "maxmemory-policy", **target)
            )
        except StoreError as exc:
            if not isinstance(exc.__cause__, ResponseError):
                raise
            return await self._io(lambda r: _check_info(r, target, name))
        warnings = []
        if cfg.get("appendonly") != "yes" and not cfg.get("save"):
            warnings.append(
                f"{name} has no persistence (appendonly no, save ''): a restart loses every "
                "stored original; run with appendonly yes, appendfsync everysec"
            )
        policy = cfg.get("maxmemory-policy") or "noeviction"
        if policy != "noeviction":
            warnings.append(_eviction_warning(name, policy))
        if self._min_acks:
            info = await self._io(lambda r: r.info("replication", **target))
            replicas = int(info.get("connected_slaves", 0))
            if replicas < self._min_acks:
                warnings.append(
                    f"{name} has {replicas} connected replicas but store.min_replicas_ack is "
                    f"{self._min_acks}: compactions fail open until enough replicas connect"
                )
        return warnings

    async def close(self) -> None:
        """Let shielded calls finish (bounded), then close the pool."""
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self._timeout * 2)
        await self._client.aclose()
        for other in (self._usage_client, self._slow_client):
            if other is not self._client:
                await other.aclose()


async def _check_info(r: Client, target: dict[str, Any], name: str) -> list[str]:
    info = await r.info("persistence", **target)
    memory = await r.info("memory", **target)
    warnings = [f"{name} CONFIG is disabled; RDB snapshot settings could not be checked"]
    if not int(info.get("aof_enabled", 0)):
        warnings.append(f"{name} runs without AOF (appendonly no): recent originals may be lost")
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        warnings.append(_eviction_warning(name, policy))
    return warnings


def _eviction_warning(name: str, policy: str) -> str:
    return (
        f"{name} maxmemory-policy is {policy}: under memory pressure Redis deletes stored "
        "originals; set maxmemory-policy noeviction"
    )
