"""The store's settings that risk losing stored originals, checked again while running.

A Redis whose `maxmemory-policy` turned to `allkeys-lru` (or whose persistence was switched off)
after compactd started was noticed only by the start-up log. `StoreWarnings.current()` asks the
store again at most every `EVERY_SECONDS`: `/readyz` lists what it says, the count is the
metric `compactd_store_config_warnings`, and each new warning is logged once.
"""

from __future__ import annotations

import logging
import time

from proxy.store.base import Store
from proxy.telemetry.metrics import Metrics

log = logging.getLogger("compactd.services")

EVERY_SECONDS = 60.0


async def store_warnings(store: Store) -> list[str]:
    """What the store says about its own settings (a failed check is a warning of its own)."""
    check = getattr(store, "check_config", None)
    if check is None:
        return []
    try:
        warnings: list[str] = await check()
    except Exception as exc:  # noqa: BLE001 - a warning check must not stop start-up or /readyz
        return [f"could not check the store's configuration ({type(exc).__name__})"]
    return warnings


class StoreWarnings:
    """The store's warnings, asked for again at most every EVERY_SECONDS."""

    def __init__(self, store: Store, metrics: Metrics, first: list[str]) -> None:
        self.store = store
        self.metrics = metrics
        self._last = list(first)
        self._at = time.monotonic()
        metrics.store_config_warnings(len(first))

    async def current(self) -> list[str]:
        """The warnings as of at most EVERY_SECONDS ago; new ones are logged."""
        if time.monotonic() - self._at >= EVERY_SECONDS:
            self._at = time.monotonic()
            fresh = await store_warnings(self.store)
            for warning in fresh:
                if warning not in self._last:
                    log.warning("store: %s", warning)
            self._last = fresh
            self.metrics.store_config_warnings(len(fresh))
        return list(self._last)
