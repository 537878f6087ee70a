"""Usage accounting off the request path: aggregated in memory per worker, written in batches.

A finished chat request adds its counters to an in-memory aggregate keyed by (tenant, policy,
model, day), and its conversation's activity (API, model, tokens) to one keyed by (tenant,
conversation): dict updates, no task and no store call. A background task writes every pending
aggregate as one batch each `flush_interval_ms`, through the store's usage path, which never
holds a connection, lock or thread a compaction write waits for (`Store.add_usage`).

Memory is bounded by `max_pending` aggregates. When the table is full, a request that would
open a new aggregate is dropped and counted in `compactd_usage_dropped_total{reason="full"}`;
a batch the store refused goes back into the table (as far as it fits, the rest counted with
reason "store") and is retried on the next flush. Drops are drops: they never count as a
request failing open, and no request ever waits for accounting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from proxy.errors import StoreError
from proxy.store import codec
from proxy.store.base import ACTIVITY_FIELDS, ActivityDelta, UsageDelta, UsageRecord, key_name
from proxy.telemetry.metrics import Metrics

log = logging.getLogger("compactd.accounting")

_Key = tuple[str, str, str, str]
MODEL_MEMO = 1024


class UsageSink(Protocol):
    """Where batches go (every Store)."""

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        """Add a batch of aggregates."""

    async def add_activity(self, deltas: Sequence[ActivityDelta], ttl_seconds: int) -> None:
        """Add a batch of conversations' activity."""


def usage_model(model: str, limit: int) -> str:
    """The name a model's usage is kept under (bounded, printable: see `key_name`)."""
    return key_name(model, limit)


class Accountant:
    """One worker's pending usage aggregates and the task that writes them."""

    def __init__(
        self,
        sink: UsageSink,
        metrics: Metrics,
        *,
        flush_seconds: float = 1.0,
        max_pending: int = 10_000,
        max_model_chars: int = 128,
        activity_ttl_seconds: int = 30 * 86400,
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self._flush_seconds = flush_seconds
        self._max_pending = max_pending
        self._max_model_chars = max_model_chars
        self._pending: dict[_Key, dict[str, int]] = {}
        self._activity: dict[tuple[str, str], ActivityDelta] = {}
        self._activity_ttl = activity_ttl_seconds
        self._models: dict[str, str] = {}  # client model name -> its key name (bounded)
        self._day = (0, "")
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()

    @property
    def pending(self) -> int:
        """Aggregates waiting for the next flush."""
        return len(self._pending)

    def today(self) -> str:
        """Today's UTC date, YYYY-MM-DD (formatted once a day, not once a request)."""
        number = int(time.time() // 86400)
        if number != self._day[0]:
            self._day = (number, time.strftime("%Y-%m-%d", time.gmtime(number * 86400)))
        return self._day[1]

    def add(self, record: UsageRecord) -> None:
        """Count one request (never blocks, never raises for a full table: it drops)."""
        model = self._models.get(record.model)
        if model is None:
            model = usage_model(record.model, self._max_model_chars)
            if len(self._models) < MODEL_MEMO:
                self._models[record.model] = model
        self._merge(
            (record.tenant, record.policy, model, record.day), codec.usage_increments(record)
        )

    def add_activity(self, delta: ActivityDelta, reason: str = "full") -> None:
        """Count one request of a conversation (bounded like usage: a full table drops)."""
        model = usage_model(delta.model, self._max_model_chars)
        if model != delta.model:
            delta = dataclasses.replace(delta, model=model)
        key = (delta.tenant, delta.conversation)
        into = self._activity.get(key)
        if into is None:
            if len(self._activity) >= self._max_pending:
                self._metrics.usage_dropped(reason, 0)
                return
            self._activity[key] = delta
            return
        latest = delta if delta.seen_at >= into.seen_at else into
        sums = {n: into.counters.get(n, 0) + delta.counters.get(n, 0) for n in ACTIVITY_FIELDS}
        self._activity[key] = dataclasses.replace(latest, counters=sums)

    def _merge(self, key: _Key, counters: dict[str, int], reason: str = "full") -> None:
        into = self._pending.get(key)
        if into is None:
            if len(self._pending) >= self._max_pending:
                self._metrics.usage_dropped(reason, counters.get("requests", 0))
                return
            self._pending[key] = dict(counters)
            return
        for name, n in counters.items():
            into[name] = into.get(name, 0) + n

    def start(self) -> None:
        """Start the periodic flush (in the running loop)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            try:
                await self.flush()
            except Exception:
                log.exception("usage flush failed")

    async def flush(self) -> None:
        """Write every pending aggregate in one batch; on a store failure keep them for later."""
        async with self._flushing:
            await self._flush_activity()
            if not self._pending:
                return
            batch, self._pending = self._pending, {}
            deltas = [UsageDelta(*key, counters) for key, counters in batch.items()]
            try:
                await self._sink.add_usage(deltas)
            except StoreError as exc:
                self._metrics.usage_flush(ok=False)
                log.warning("usage batch not written, kept for the next flush: %s", exc)
                for key, counters in batch.items():
                    self._merge(key, counters, reason="store")
                return
            self._metrics.usage_flush(ok=True)

    async def _flush_activity(self) -> None:
        if not self._activity:
            return
        batch, self._activity = self._activity, {}
        try:
            await self._sink.add_activity(list(batch.values()), self._activity_ttl)
        except StoreError as exc:
            log.warning("activity batch not written, kept for the next flush: %s", exc)
            for delta in batch.values():
                self.add_activity(delta, reason="store")

    async def aclose(self, grace_seconds: float = 5.0) -> None:
        """Stop the periodic flush and write what is pending (within `grace_seconds`)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            async with asyncio.timeout(grace_seconds):
                await self.flush()
        except TimeoutError:
            log.warning("usage not written at shutdown: the store did not answer in time")
        lost = sum(c.get("requests", 0) for c in self._pending.values())
        if lost:
            self._metrics.usage_dropped("shutdown", lost)
            self._pending.clear()
