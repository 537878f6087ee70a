"""Compaction ahead of time (policy `precompute_ratio`): the next checkpoint, off the request path.

When a request goes out unchanged (or lossless, or replayed) at `precompute_ratio` of its trigger
or more, compactd schedules, after deciding, the compaction that request would get if it were
over its trigger: the same chain on the same input (the originals, or the replayed checkpoint plus
the rest), stored as a checkpoint like any other. Nothing changes for the request itself or for
the following turns under the trigger (they never look checkpoints up). The turn that crosses the
trigger finds that checkpoint, which covers a prefix of it, and replays it: usually under the
trigger again, so it goes out without running the chain and its added latency is one store
lookup; if its new messages still put it over, the chain builds on the checkpoint.

Bounded: one precompute at a time per worker (a busy worker skips; the next turn tries again),
once per conversation and checkpoint generation (a bounded memory of what was done), never in
shadow mode or without a tenant. A failure is counted and logged, and changes nothing: the
trigger turn then compacts on the request path as it would have. On shut-down pending work is
cancelled. Metric: `compactd_precompute_total{outcome}` (stored, not_worth_it, failed, busy).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

log = logging.getLogger("compactd.precompute")

PRECOMPUTED = "precomputed"
"""Marks, in a checkpoint's providers, one computed ahead of time (never reported as one)."""
MEMORY = 50_000
"""(tenant, conversation, generation) keys remembered as done."""

Work = Callable[[], Awaitable[str]]
"""Computes and stores one checkpoint; returns the outcome label."""


class Precomputer:
    """Schedules precomputations, one at a time, each key once."""

    def __init__(self, observe: Callable[[str], None], memory: int = MEMORY) -> None:
        self.observe = observe
        self.memory = memory
        self._done: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self._used: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy = False

    def entries(self) -> int:
        """Keys remembered (done and used)."""
        return len(self._done) + len(self._used)

    def due(self, tokens: int, trigger: int, ratio: float) -> bool:
        """Whether a request of `tokens` is in the band where its next checkpoint is computed."""
        return ratio > 0 and ratio * trigger <= tokens <= trigger

    def schedule(self, key: tuple[str, str, int], work: Work) -> bool:
        """Start `work` for `key` unless it was done or the worker is busy; True if started."""
        if key in self._done:
            self._done.move_to_end(key)
            return False
        if self._busy:
            self.observe("busy")
            return False
        self._busy = True
        self._remember(key)
        task = asyncio.get_running_loop().create_task(self._run(key, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def first_use(self, key: tuple[str, str, int]) -> bool:
        """Whether a precomputed checkpoint (tenant, conversation, covered_through) is replayed
        for the first time by this worker (that turn is its compaction event)."""
        if key in self._used:
            return False
        self._used[key] = None
        if len(self._used) > self.memory:
            self._used.popitem(last=False)
        return True

    def _remember(self, key: tuple[str, str, int]) -> None:
        self._done[key] = None
        if len(self._done) > self.memory:
            self._done.popitem(last=False)

    async def _run(self, key: tuple[str, str, int], work: Work) -> None:
        try:
            self.observe(await work())
        except Exception as exc:  # off the request path: counted, logged, nothing else changes
            self.observe("failed")
            self._done.pop(key, None)
            log.warning(
                "precompute failed",
                extra={"reason": type(exc).__name__},
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        finally:
            self._busy = False

    async def drain(self) -> None:
        """Wait for the work under way (tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel pending work (shut-down)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
