"""The Redis store against a private redis-server that is stopped, frozen, killed and restarted."""

from __future__ import annotations

import asyncio
import random
import signal

import pytest
import redis

from proxy.errors import StoreError
from proxy.store.redis.store import RedisStore
from tests.store.redis_server import RedisServer
from tests.store.test_contract import A, B, compaction, history, prefixes

TTL = 1000
HANG_GUARD = 10  # seconds: only stops a hung test; no assertion is made on elapsed time


async def open_store(server: RedisServer, timeout_ms: int = 2000, pool: int = 8) -> RedisStore:
    return await RedisStore.open(server.url, timeout_ms=timeout_ms, pool_size=pool, prefix="t:")


async def test_calls_raise_store_error_while_redis_is_down(private_redis: RedisServer) -> None:
    store = await open_store(private_redis)
    private_redis.stop(signal.SIGKILL)
    msgs = history(8)

    async with asyncio.timeout(HANG_GUARD):
        with pytest.raises(StoreError):
            await store.ping()
        with pytest.raises(StoreError):
            await store.find_checkpoint(A, "c1", prefixes(msgs))
        with pytest.raises(StoreError):
            await store.save_compaction(compaction(A, "c1", msgs, 4), TTL)
    await store.close()


async def test_a_frozen_redis_makes_calls_fail_with_store_error_at_the_timeout(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis, timeout_ms=100)
    private_redis.pause()
    try:
        async with asyncio.timeout(HANG_GUARD):
            with pytest.raises(StoreError, match="within 100 ms"):
                await store.find_checkpoint(A, "c1", prefixes(history(4)))
    finally:
        private_redis.resume()
    await store.ping()  # the same store works once Redis answers again
    await store.close()


async def test_restore_and_inspection_wait_out_a_redis_pause_longer_than_the_store_timeout(
    private_redis: RedisServer,
) -> None:
    # The API's and the CLI's reads may take the inspection timeout (10 s), not the 100 ms a
    # proxied request waits: a big conversation, or a Redis busy for half a second, is no outage.
    store = await open_store(private_redis, timeout_ms=100)
    msgs = history(8)
    await store.save_compaction(compaction(A, "c1", msgs, 4), TTL)
    for read in (
        lambda: store.get_conversation(A, "c1"),
        lambda: store.list_conversations(None),
        lambda: store.resolve_refs(A, ["0004abcdef"]),
    ):
        private_redis.pause()
        asyncio.get_running_loop().call_later(0.5, private_redis.resume)
        async with asyncio.timeout(HANG_GUARD):
            assert await read()
    await store.close()


async def test_the_store_recovers_by_itself_when_redis_comes_back(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis)
    msgs = history(8)
    await store.save_compaction(compaction(A, "c1", msgs, 4), TTL)
    private_redis.stop()
    with pytest.raises(StoreError):
        await store.find_checkpoint(A, "c1", prefixes(msgs))

    private_redis.start()
    # More calls at once than the pool has connections: every stale connection gets used.
    found = await asyncio.gather(
        *(store.find_checkpoint(A, "c1", prefixes(msgs)) for _ in range(16))
    )
    await store.save_compaction(compaction(A, "c1", msgs, 6), TTL)

    assert [f.covered_through if f else None for f in found] == [4] * 16
    await store.close()


async def test_a_killed_redis_with_aof_loses_nothing_written_before(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis)
    msgs = history(20)
    for i in range(30):
        await store.save_compaction(compaction(A, f"c{i}", msgs, i % 19), TTL)

    private_redis.restart(signal.SIGKILL)

    for i in range(30):
        found = await store.find_checkpoint(A, f"c{i}", prefixes(msgs))
        assert found is not None
        assert found.covered_through == i % 19
        assert set(await store.resolve_refs(A, [f"{i % 19:04x}abcdef"])) == {f"{i % 19:04x}abcdef"}
    assert len(await store.list_conversations(A)) == 30
    await store.close()


async def test_cancelled_calls_never_leave_a_pooled_connection_out_of_step(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis, pool=4)
    tenants = [f"{i:024x}" for i in range(12)]
    for t in tenants:
        await store.put_summary(t, "d", f"summary of {t}", TTL)
    rng = random.Random(7)

    async def read(t: str) -> None:
        assert await store.get_summary(t, "d") == f"summary of {t}"

    for _ in range(5):
        tasks = [asyncio.create_task(read(rng.choice(tenants))) for _ in range(200)]
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        private_redis.pause()  # replies are now stuck mid-flight on every pooled connection
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        private_redis.resume()

    async def check(t: str) -> str | None:
        return await store.get_summary(t, "d")

    picks = [rng.choice(tenants) for _ in range(300)]
    results = await asyncio.gather(*(check(t) for t in picks))
    assert results == [f"summary of {t}" for t in picks]
    await store.close()


async def test_concurrent_saves_of_one_conversation_from_two_instances_keep_the_first(
    private_redis: RedisServer,
) -> None:
    one, two = await open_store(private_redis), await open_store(private_redis)
    msgs = history(40)
    racers = [
        (one if i % 2 else two).save_compaction(compaction(B, "c1", msgs, 10, f"v{i}"), TTL)
        for i in range(20)
    ]
    others = [one.save_compaction(compaction(B, "c1", msgs, k), TTL) for k in range(11, 39)]

    results = await asyncio.gather(*racers, *others)
    found = await two.find_checkpoint(B, "c1", prefixes(msgs[:11]))
    info = await one.get_conversation(B, "c1")

    winners = {r.messages[0]["content"] for r in results[:20]}
    assert len(winners) == 1  # every racer was told the same stored checkpoint
    assert found is not None
    assert found.messages[0]["content"] in winners
    assert info is not None
    assert info.checkpoint_count == 29  # no update of another covered_through was lost
    assert (await two.find_checkpoint(B, "c1", prefixes(msgs))).covered_through == 38  # type: ignore[union-attr]
    await one.close()
    await two.close()


async def test_a_replay_lookup_is_one_redis_command_whatever_the_history_length(
    private_redis: RedisServer,
) -> None:
    store = await open_store(private_redis)
    msgs = history(300)
    for k in range(20, 280, 20):
        await store.save_compaction(compaction(A, "c1", msgs, k), TTL)
    await store.find_checkpoint(A, "c1", prefixes(msgs))  # loads the script once
    probe = redis.Redis(port=private_redis.port)

    before = probe.info("stats")["total_commands_processed"]
    found = await store.find_checkpoint(A, "c1", prefixes(msgs))
    after = probe.info("stats")["total_commands_processed"]

    assert found is not None
    assert found.covered_through == 260
    # INFO, EVALSHA, and the script's own HGETALL, then HGET and HSTRLEN (the version of the
    # checkpoint this instance holds, and its length) and PTTL: one round trip from the client.
    assert after - before == 6
    probe.close()
    await store.close()


async def test_a_store_opened_while_redis_is_down_works_once_it_is_up(
    private_redis: RedisServer,
) -> None:
    private_redis.stop()
    store = await open_store(private_redis)  # start-up must not fail: requests fail open
    with pytest.raises(StoreError):
        await store.ping()

    private_redis.start()
    await store.ping()
    saved = await store.save_compaction(compaction(A, "c1", history(6), 3), TTL)

    assert saved.covered_through == 3
    await store.close()


_RACE = """
async def send_packed_command(self, command, check_health=True):
    # What redis-py's cluster client meets when another command closed this connection under
    # it during a slot migration: the writer is already gone.
    None.writelines(command)
"""


def _raising_inside_redis_py() -> object:
    """A stand-in for redis-py's connection write whose frames belong to redis-py itself."""
    namespace: dict[str, object] = {"__name__": "redis.asyncio.connection"}
    exec(_RACE, namespace)  # a fixed string: its frames carry redis-py's module name
    return namespace["send_packed_command"]


async def test_a_fault_inside_redis_py_is_a_store_error_and_the_store_works_on(
    machine_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.asyncio.connection import AbstractConnection

    store = await RedisStore.open(machine_redis_url, timeout_ms=2000, pool_size=4, prefix="t:")
    msgs = history(8)
    with monkeypatch.context() as patch:
        patch.setattr(AbstractConnection, "send_packed_command", _raising_inside_redis_py())
        with pytest.raises(StoreError, match="redis client fault: AttributeError"):
            await store.find_checkpoint(A, "c-race", prefixes(msgs))
        with pytest.raises(StoreError, match="redis client fault"):
            await store.save_compaction(compaction(A, "c-race", msgs, 4), TTL)
    await store.save_compaction(compaction(A, "c-race", msgs, 4), TTL)
    assert await store.find_checkpoint(A, "c-race", prefixes(msgs)) is not None
    await store.close()


async def test_a_fault_of_our_own_around_redis_stays_what_it_is(machine_redis_url: str) -> None:
    store = await RedisStore.open(machine_redis_url, timeout_ms=2000, pool_size=4, prefix="t:")

    async def ours(client: object) -> None:
        raise AttributeError("a bug of compactd's, not a store fault")

    with pytest.raises(AttributeError, match="a bug of compactd's"):
        await store._io(ours)
    await store.close()
