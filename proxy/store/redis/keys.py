"""Where things live in Redis.

Every key of one conversation shares the hash tag `{t:<tenant>:c:<conv>}`, so a compaction's
write (one Lua script) and find_checkpoint's script touch one slot, on one server or a Redis
Cluster alike. Indexes that span conversations share the tenant's tag `{t:<tenant>}` (its
listing and its ref index: one slot, one node per tenant) or the admin's: they are only for
finding things, never the data itself, and are written before the data they point at and kept
at least as long (see redis_save), so nothing acknowledged is ever unreachable through them.
Tenant-wide reads (listing, usage, refs) follow these indexes: no SCAN on any path.

What every tenant writes is sharded so that no key takes all instances' writes: the admin's
listing by conversation (`{admin:<n>}`) and the daily accounting by tenant (`{u:<day>:<n>}`),
SHARDS ways each, whose hash tags fall on different cluster masters; readers merge the shards.
The keys builds before the shards wrote (`{admin}:convs`, `{u:<day>}`) are read too, until they
expire, and never written (docs/replay-cost.md, "Store layout").
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from proxy.store.base import check_ids

SHARDS = 16
"""Shards of the admin listing and of each day's accounting. Part of the stored layout: a
change moves every key (readers would then miss the old shards)."""


def shard_of(name: str) -> int:
    """The shard of a conversation id or tenant (CRC-32: stable across processes)."""
    return zlib.crc32(name.encode()) % SHARDS


SUMMARY_KEY_CHARS = 10
"""The length of a ref id (`proxy.providers.canonical.ref_id`: a digest's first characters)."""


@dataclass(frozen=True)
class ConversationKeys:
    """The keys of one conversation, all in one hash slot."""

    meta: str
    """hash: tenant, conversation, created_at, updated_at, ttl, and `v:<source digest>` ->
    the version of each checkpoint (redis_find)"""
    index: str
    """hash: checkpoint source digest -> covered_through (what find_checkpoint reads first)"""
    checkpoints: str
    """hash: source digest -> checkpoint"""
    originals: str
    """hash: message digest -> verbatim original (content-addressed: stored once)"""
    refs: str
    """hash: reference id -> original digests"""
    tenant: str = ""
    conversation: str = ""

    def data(self) -> tuple[str, str, str, str, str]:
        """Every key, originals first: a refresh cut short leaves originals living longest."""
        return (self.originals, self.refs, self.checkpoints, self.index, self.meta)


@dataclass(frozen=True)
class KeyLayout:
    """Key names under one prefix (tests use a random prefix to share a server)."""

    prefix: str = "compactd:"

    def conversation(self, tenant: str, conversation: str) -> ConversationKeys:
        """The keys of one conversation of one tenant."""
        check_ids(tenant, conversation)
        tag = f"{self.prefix}{{t:{tenant}:c:{conversation}}}"
        return ConversationKeys(
            meta=f"{tag}:meta",
            index=f"{tag}:idx",
            checkpoints=f"{tag}:cp",
            originals=f"{tag}:orig",
            refs=f"{tag}:refs",
            tenant=tenant,
            conversation=conversation,
        )

    def tenant_conversations(self, tenant: str) -> str:
        """zset: conversation -> last used (epoch seconds)."""
        return f"{self.prefix}{{t:{tenant}}}:convs"

    def tenant_refs(self, tenant: str) -> str:
        """zset (all scores 0, lexicographic): `<ref id>\\t<conversation>`, every conversation
        that stores a ref id."""
        return f"{self.prefix}{{t:{tenant}}}:refs"

    def tenant_ref_expiry(self, tenant: str) -> str:
        """zset: the same members -> the expiry (epoch seconds) each points under, for trimming."""
        return f"{self.prefix}{{t:{tenant}}}:refexp"

    def legacy_tenant_refs(self, tenant: str) -> str:
        """hash: reference id -> conversation, as builds before the zset index wrote it (read
        as a fallback so their refs still resolve; no longer written)."""
        return f"{self.prefix}{{t:{tenant}}}:refidx"

    def summary(self, tenant: str, digest: str) -> str:
        """string: a cached summary, by the first characters of its digest (the value names it
        whole): the length of a ref id, which is the start of its span's digest, so a purge
        finds the summaries of a conversation's spans by its ref ids, with no SCAN."""
        return f"{self.prefix}{{t:{tenant}}}:sum:{digest[:SUMMARY_KEY_CHARS]}"

    def all_conversations(self, conversation: str) -> str:
        """zset (all scores 0, lexicographic): `<conversation>\\t<tenant>` for the admin, the
        shard of this conversation id."""
        return f"{self.prefix}{{admin:{shard_of(conversation)}}}:convs"

    def all_conversation_shards(self) -> list[str]:
        """Every shard of the admin listing, and the unsharded key builds before wrote."""
        return [*(f"{self.prefix}{{admin:{n}}}:convs" for n in range(SHARDS)), self.legacy_all()]

    def legacy_all(self) -> str:
        """zset: the admin listing as one key, as builds before the shards wrote it (read only)."""
        return f"{self.prefix}{{admin}}:convs"

    def usage(self, day: str, tenant: str) -> str:
        """hash: JSON [policy, model, counter] -> count (the day's shard of the tenant)."""
        return f"{self.prefix}{{u:{day}:{shard_of(tenant)}}}:t:{tenant}"

    def usage_tenants(self, day: str, shard: int) -> str:
        """set: tenants of this shard with usage on that day."""
        return f"{self.prefix}{{u:{day}:{shard}}}:tenants"

    def legacy_usage(self, day: str, tenant: str) -> str:
        """hash: a tenant's day as builds before the shards wrote it (read only)."""
        return f"{self.prefix}{{u:{day}}}:t:{tenant}"

    def legacy_usage_tenants(self, day: str) -> str:
        """set: the day's tenants as builds before the shards wrote it (read only)."""
        return f"{self.prefix}{{u:{day}}}:tenants"

    def windows(self, scope: str) -> str:
        """hash: model -> JSON [learned context window, expires at] for one upstream."""
        return f"{self.prefix}{{w:{scope}}}:windows"
