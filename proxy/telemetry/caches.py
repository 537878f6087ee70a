"""The in-memory caches' sizes, as metrics: `compactd_cache_entries{cache}` of each worker.

Every cache a worker keeps is bounded (token counts by tokens.cache_size, parsed bodies by
tokens.body_cache_mb, the rest by fixed caps); this makes what each holds visible, so memory that
grows under load can be told from a cache filling up to its bound. Each worker sets its own
values every `EVERY_SECONDS` (a scrape reaches one worker; the others' values are as fresh as
their last update), and the worker answering a scrape sets its own first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from proxy.telemetry.metrics import Metrics

EVERY_SECONDS = 15.0


class CacheWatch:
    """Sets the cache gauges from `sizes()` now (`update`) and every EVERY_SECONDS (`start`)."""

    def __init__(self, sizes: Callable[[], dict[str, int]], metrics: Metrics) -> None:
        self.sizes = sizes
        self.metrics = metrics
        self._next: asyncio.TimerHandle | None = None

    def update(self) -> None:
        """Set every cache's gauge to its size now."""
        for cache, entries in self.sizes().items():
            self.metrics.cache_entries(cache, entries)

    def start(self) -> None:
        """Update now, then every EVERY_SECONDS until `close` (a timer: nothing to await)."""
        self.update()
        self._next = asyncio.get_running_loop().call_later(EVERY_SECONDS, self.start)

    def close(self) -> None:
        """Stop updating."""
        if self._next is not None:
            self._next.cancel()
            self._next = None
