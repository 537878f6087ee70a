"""Heavy API work (savings, stats) off the event loop, a few at a time, within a deadline.

A savings answer over a long period or many groups is seconds of CPU: on the event loop it
stalled every request of the worker (three at once held `/healthz` 13.6 s). Here it runs in a
thread, at most `concurrency` at once per worker, and gives up at its deadline: the work checks
the deadline itself (a thread cannot be cancelled), so its slot stays taken until it has really
stopped and a flood of slow queries cannot pile threads up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from proxy.errors import StatsTimeoutError, WorkTimeoutError

T = TypeVar("T")


class HeavyWork:
    """Runs deadline-aware functions in threads, `concurrency` at once, `timeout` seconds each."""

    def __init__(self, concurrency: int, timeout: float) -> None:
        self.timeout = timeout
        self._slots = asyncio.Semaphore(concurrency)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, deadline=<monotonic seconds>, **kwargs)` in a thread; WorkTimeoutError
        (a 503) if it cannot start or finish within the timeout."""
        deadline = time.monotonic() + self.timeout
        try:
            async with asyncio.timeout(self.timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise _timed_out(self.timeout) from None
        try:
            return await asyncio.to_thread(fn, *args, deadline=deadline, **kwargs)
        except StatsTimeoutError:
            raise _timed_out(self.timeout) from None
        finally:
            self._slots.release()


def _timed_out(timeout: float) -> WorkTimeoutError:
    return WorkTimeoutError(
        f"The answer took longer than {timeout:g} s to compute; ask for a shorter period."
    )
