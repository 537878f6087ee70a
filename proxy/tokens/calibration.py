"""How far our token estimate is from an upstream's own count, per API and model.

Anthropic's tokenizer is not public: compactd counts its requests with tiktoken and learns, from
the `usage` of real responses (and the counts a "prompt is too long" error states), the ratio of
the upstream's input count to that estimate. The budget is then expressed in estimate units
(budget / ratio), so a request is compacted when the upstream would count it over the budget.
The ratio is a moving average, bounded, learned only from requests large enough for the fixed
overheads not to dominate, and shared across workers and instances through the store (every
`REFRESH_SECONDS`: what this worker learned is written, what all of them learned is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.errors import StoreError
from proxy.store.base import key_name
from proxy.tokens.budget import Budget

log = logging.getLogger("compactd.calibration")

MIN_ESTIMATE = 1000
"""Estimates below this many tokens teach nothing (framing and tool prompts dominate them)."""
WEIGHT = 0.25
LOW, HIGH = 0.5, 4.0
REFRESH_SECONDS = 30.0
TTL_SECONDS = 30 * 86400
MODEL_CHARS = 128
_MAX_MODELS = 512


def sees_all(body: Mapping[str, Any] | None) -> bool:
    """Whether our estimate of this request saw all the upstream counts: not with an image or
    document by URL or file id, or MCP servers (the upstream fetches their contents), nor with
    `context_management` (the upstream clears old tool results or thinking before it counts).
    Such a request's count is not a tokenizer's ratio, and it would move every tenant's."""
    if body is None:
        return True
    if body.get("mcp_servers") or body.get("context_management"):
        return False
    return not any(_by_reference(m.get("content")) for m in _mappings(body.get("messages")))


def _by_reference(content: Any) -> bool:
    for block in _mappings(content):
        source = block.get("source")
        if isinstance(source, Mapping) and source.get("type") in ("url", "file"):
            return True
        if _by_reference(block.get("content")):  # a tool_result's own blocks
            return True
    return False


def _mappings(items: Any) -> list[Mapping[str, Any]]:
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


def scaled(budget: Budget, ratio: float) -> Budget:
    """`budget` in the units of an estimate that is `ratio` times below the upstream's count."""
    if ratio == 1.0:
        return budget
    return dataclasses.replace(
        budget,
        budget=max(1, int(budget.budget / ratio)),
        trigger=max(1, int(budget.trigger / ratio)),
        target=max(1, int(budget.target / ratio)),
    )


class CalibrationStore(Protocol):
    """The part of the store calibration uses (every Store)."""

    async def put_calibration(self, api: str, model: str, ratio: float, ttl_seconds: int) -> None:
        """Record one ratio."""

    async def calibrations(self, api: str) -> dict[str, float]:
        """Every live ratio of an API."""


@dataclass
class Calibration:
    """Ratios upstream / estimate per (api, model), for the APIs listed in `apis`."""

    store: CalibrationStore | None = None
    apis: frozenset[str] = frozenset({"messages"})
    _ratios: dict[tuple[str, str], float] = field(default_factory=dict)
    _dirty: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _task: asyncio.Task[None] | None = None

    @staticmethod
    def key(model: str) -> str:
        """The bounded name a model's ratio is kept under."""
        return key_name(model.lower(), MODEL_CHARS)

    def ratio(self, api: str, model: str) -> float:
        """The learned ratio (1.0 until something was learned)."""
        return self._ratios.get((api, self.key(model)), 1.0) if api in self.apis else 1.0

    def budget(self, api: str, model: str, budget: Budget) -> Budget:
        """`budget` in estimate units for this API and model."""
        return scaled(budget, self.ratio(api, model))

    def observe(
        self,
        api: str,
        model: str,
        estimate: int,
        actual: int,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        """One response: we estimated `estimate` input tokens, the upstream counted `actual`
        (of the request `body`, if given: one with input we never see teaches nothing)."""
        if api not in self.apis or estimate < MIN_ESTIMATE or actual <= 0 or not model:
            return
        if not sees_all(body):
            return
        sample = min(HIGH, max(LOW, actual / estimate))
        key = (api, self.key(model))
        with self._lock:
            old = self._ratios.get(key)
            if old is None and len(self._ratios) >= _MAX_MODELS:
                return
            self._ratios[key] = sample if old is None else old + WEIGHT * (sample - old)
            self._dirty.add(key)

    async def sync(self) -> None:
        """Write what this worker learned, then adopt what every worker stored (ours win where
        we learned something since)."""
        if self.store is None:
            return
        with self._lock:
            dirty = [(k, self._ratios[k]) for k in self._dirty]
            self._dirty.clear()
        try:
            for (api, model), ratio in dirty:
                await self.store.put_calibration(api, model, ratio, TTL_SECONDS)
            stored = {api: await self.store.calibrations(api) for api in sorted(self.apis)}
        except StoreError as exc:
            log.warning("calibration not shared: %s", exc)
            with self._lock:
                self._dirty.update(k for k, _ in dirty)
            return
        with self._lock:
            for api, ratios in stored.items():
                for model, value in list(ratios.items())[:_MAX_MODELS]:
                    if (api, model) not in self._dirty and LOW <= value <= HIGH:
                        self._ratios[(api, model)] = value

    def start(self) -> None:
        """Sync now and then every `REFRESH_SECONDS`."""
        if self._task is None and self.store is not None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(REFRESH_SECONDS)

    async def aclose(self) -> None:
        """Stop syncing, after a last write of what was learned."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            await self.sync()
