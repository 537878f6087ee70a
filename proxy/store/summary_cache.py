"""The providers' SummaryCache over a Store, bound to one tenant and a retention."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.store.base import Store


@dataclass(frozen=True)
class TenantSummaryCache:
    """What an LLM-backed provider is given as `CompressionConfig.summary_cache`."""

    store: Store
    tenant: str
    ttl_seconds: int

    async def get(self, digest: str) -> str | None:
        """The cached summary for this digest, if any."""
        return await self.store.get_summary(self.tenant, digest)

    async def put(self, digest: str, summary: str) -> None:
        """Keep a summary for this digest."""
        await self.store.put_summary(self.tenant, digest, summary, self.ttl_seconds)
