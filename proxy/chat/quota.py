"""Per-tenant storage quota: past it, a tenant's new compactions are not stored.

Made-up keys stored 14.5k conversations (1.36 GB) until the disk was full for every tenant.
With `limits.tenant_quota_mb`, a compaction of a tenant whose stored conversations add up to
more is not saved, so it fails open (`x-compactd-error: quota`: the request goes as sent).
A tenant's size is read from the store (the sum of its conversations' sizes) at most once a
`REFRESH_SECONDS` per worker, in the background: the compaction never waits for it, and a
tenant is held to what it stored a moment ago (a burst can pass the quota by that much).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from proxy.errors import QuotaExceededError, StoreError
from proxy.store.base import Store

log = logging.getLogger("compactd.quota")

REFRESH_SECONDS = 30.0
MAX_TENANTS = 10_000
"""Sizes kept per worker (least recently used dropped first)."""


class Quota:
    """What each tenant stores, against `limit_bytes`."""

    def __init__(self, store: Store, limit_bytes: int) -> None:
        self.store = store
        self.limit_bytes = limit_bytes
        self._sizes: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    def check(self, tenant: str) -> None:
        """Raise QuotaExceededError if the tenant's last known size is over the quota; start
        a refresh of that size if it is older than REFRESH_SECONDS."""
        size, at = self._sizes.get(tenant, (0, float("-inf")))
        if time.monotonic() - at > REFRESH_SECONDS and tenant not in self._refreshing:
            task = asyncio.ensure_future(self.refresh(tenant))
            self._refreshing[tenant] = task
            task.add_done_callback(lambda _: self._refreshing.pop(tenant, None))
        if size > self.limit_bytes:
            raise QuotaExceededError(
                f"tenant stores {size} bytes, over limits.tenant_quota_mb ({self.limit_bytes})"
            )

    async def refresh(self, tenant: str) -> None:
        """Read the tenant's size from the store now."""
        try:
            infos = await self.store.list_conversations(tenant)
        except StoreError as exc:
            log.warning("quota: could not read a tenant's size (%s)", type(exc).__name__)
            return
        self._sizes.pop(tenant, None)
        self._sizes[tenant] = (sum(i.size_bytes for i in infos), time.monotonic())
        while len(self._sizes) > MAX_TENANTS:
            self._sizes.popitem(last=False)

    async def aclose(self) -> None:
        """Wait for the refreshes under way."""
        await asyncio.gather(*self._refreshing.values(), return_exceptions=True)
