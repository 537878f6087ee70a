"""A private redis-server frozen, then killed and restarted from its AOF, under load.

Requests keep getting 200s (compaction fails open while Redis cannot answer), every compaction
compactd acknowledged is restorable afterwards, and nothing forwarded differs from what the
client sent unless it was a stored compaction.
"""

from __future__ import annotations

import asyncio
import signal
import time

from tests.faults.driver import BUDGET, Load, check, echo, sleep_until
from tests.store.redis_server import RedisServer


async def test_freeze_kill_and_aof_restart_under_load_lose_nothing(
    upstream, make_proxy, private_redis: RedisServer
) -> None:
    fake, base = upstream
    fake.default = echo
    async with make_proxy(base, store={"url": private_redis.url}, **BUDGET) as url:
        load = Load(url)

        async def faults() -> None:
            start = time.monotonic()
            await sleep_until(start + 1.5)
            private_redis.pause()  # SIGSTOP: connections open, nothing answers
            await sleep_until(start + 3.0)
            private_redis.resume()
            await sleep_until(start + 4.5)
            private_redis.stop(signal.SIGKILL)  # a crash, no shutdown fsync
            await asyncio.sleep(0.5)
            await asyncio.to_thread(private_redis.start)  # replays its AOF
            await sleep_until(start + 7.0)

        await load.run(faults)
        actions = await check(load)
    assert actions.get("compacted", 0) >= 1
    assert actions.get("replayed", 0) >= 1
    assert actions.get("error", 0) >= 1  # the faults were felt, and failed open
