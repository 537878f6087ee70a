"""A private redis-server frozen, then killed and restarted from its AOF, under load.

Requests keep getting 200s (compaction fails open while Redis cannot answer), every compaction
compactd acknowledged is restorable afterwards, and nothing forwarded differs from what the
client sent unless it was a stored compaction.

Each phase waits for events, not the clock: while Redis cannot answer, a fresh over-budget
conversation (a probe) must attempt the store and fail open, whatever the background load was
doing; after each fault, probes are sent until one compacts again.
"""

from __future__ import annotations

import asyncio
import signal

from tests.faults.driver import BUDGET, Load, check, echo, failed_open
from tests.store.redis_server import RedisServer


async def test_freeze_kill_and_aof_restart_under_load_lose_nothing(
    upstream, make_proxy, private_redis: RedisServer
) -> None:
    fake, base = upstream
    fake.default = echo
    async with make_proxy(base, store={"url": private_redis.url}, **BUDGET) as url:
        load = Load(url)
        async with load.running():
            await load.settled()
            private_redis.pause()  # SIGSTOP: connections open, nothing answers
            try:
                failed_open(await load.probe())  # the store timeout, then the original
                await load.more()
            finally:
                private_redis.resume()
            await load.probe_until("compacted")
            await load.more()
            private_redis.stop(signal.SIGKILL)  # a crash, no shutdown fsync
            failed_open(await load.probe())
            await load.more()
            await asyncio.to_thread(private_redis.start)  # replays its AOF
            await load.probe_until("compacted")
            await load.more()
        actions = await check(load)
    assert actions.get("compacted", 0) >= 1
    assert actions.get("replayed", 0) >= 1
