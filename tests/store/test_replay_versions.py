"""A replay moves only what changed: a store answers "the same checkpoint, version N" for the
checkpoint its instance holds, and sends one whole only when it is new to the instance.

A state machine drives both stores (two instances each, on the same data) through new
checkpoints, evictions of what an instance holds, forks, purges with a different checkpoint
written under the same source digest, and the other instance writing a longer one; every
lookup must return exactly what a store with nothing held would. The bytes a replayed turn
moves are measured on a private redis-server's own counters (INFO stats).
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from proxy.store.base import Store, version_length, version_of
from proxy.store.decoded import DecodedCheckpoints
from proxy.store.redis.store import RedisStore
from proxy.store.sqlite.store import SqliteStore
from tests.store.conftest import MACHINE_REDIS
from tests.store.redis_server import RedisServer
from tests.store.test_contract import TTL, A, compaction, history, prefixes

BRANCH_AT = 5
LENGTH = 10
"""Short: two rules' positions then meet often (a longer checkpoint, a fork past another)."""


def branches() -> dict[str, list[dict[str, object]]]:
    """A conversation and a fork of it from message BRANCH_AT on."""
    main = history(LENGTH)
    return {"main": main, "fork": main[:BRANCH_AT] + history(LENGTH - BRANCH_AT, " fork")}


class ReplayVersions(RuleBasedStateMachine):
    """Two instances of one store; the model is what is stored, per conversation."""

    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.TemporaryDirectory()
        self.prefix = f"compactd-test-{uuid.uuid4().hex[:12]}:"
        self.stores: list[Any] = [self.run(self.open()), self.run(self.open())]
        self.branches = branches()
        self.stored: dict[str, dict[str, tuple[int, str]]] = {"c1": {}, "c2": {}}
        self.labels = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def open(self) -> Store:
        if self.backend == "redis":
            return await RedisStore.open(MACHINE_REDIS, timeout_ms=5000, prefix=self.prefix)
        return await SqliteStore.open(Path(self.dir.name) / "compactd.db", timeout_ms=5000)

    def teardown(self) -> None:
        for store in self.stores:
            self.run(store.close())
        self.loop.close()
        self.dir.cleanup()
        if self.backend == "redis":
            client = redis.Redis.from_url(MACHINE_REDIS)
            for key in client.scan_iter(match=f"{self.prefix}*", count=500):
                client.delete(key)
            client.close()

    @rule(
        instance=st.sampled_from([0, 1]),
        conv=st.sampled_from(["c1", "c2"]),
        branch=st.sampled_from(["main", "fork"]),
        k=st.integers(1, LENGTH - 2),
    )
    def compact(self, instance: int, conv: str, branch: str, k: int) -> None:
        self.labels += 1
        label = f"label-{self.labels}"
        msgs = self.branches[branch]
        saved = compaction(A, conv, msgs, k, label)
        self.run(self.stores[instance].save_compaction(saved, TTL))
        self.stored[conv].setdefault(saved.checkpoint.source_digest, (k, label))

    @rule(
        instance=st.sampled_from([0, 1]),
        conv=st.sampled_from(["c1", "c2"]),
        branch=st.sampled_from(["main", "fork"]),
        n=st.integers(1, LENGTH),
    )
    def replay(self, instance: int, conv: str, branch: str, n: int) -> None:
        wanted = prefixes(self.branches[branch][:n])
        found = self.run(self.stores[instance].find_checkpoint(A, conv, wanted))
        fits = [
            (k, label) for d, (k, label) in self.stored[conv].items() if wanted[k : k + 1] == [d]
        ]
        expected = max(fits, default=None)
        if expected is None:
            assert found is None
            return
        assert found is not None
        assert (found.covered_through, found.messages[0]["content"].split(" … ")[1]) == (
            expected[0],
            f"{expected[1]}]",
        )

    @rule(instance=st.sampled_from([0, 1]), size=st.sampled_from([0, 400, 8 << 20]))
    def evict(self, instance: int, size: int) -> None:
        """The instance forgets what it held (a cache of `size` bytes from here on)."""
        self.stores[instance]._decoded = DecodedCheckpoints(size)

    @rule(instance=st.sampled_from([0, 1]), conv=st.sampled_from(["c1", "c2"]))
    def purge(self, instance: int, conv: str) -> None:
        self.run(self.stores[instance].purge(A, conv))
        self.stored[conv].clear()


ReplayVersions.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_sqlite_replays_are_what_a_store_holding_nothing_would_return = ReplayVersions.TestCase


class RedisReplayVersions(ReplayVersions):
    backend = "redis"


RedisReplayVersions.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None
)
test_redis_replays_are_what_a_store_holding_nothing_would_return = RedisReplayVersions.TestCase


def test_a_longer_checkpoint_another_instance_wrote_wins_over_the_one_held() -> None:
    """A sequence the machine found with the longer checkpoints ignored."""
    for machine in (ReplayVersions, RedisReplayVersions):
        state = machine()
        try:
            state.compact(branch="main", conv="c1", instance=0, k=2)
            state.replay(branch="main", conv="c1", instance=1, n=4)
            state.compact(branch="main", conv="c1", instance=0, k=3)
            state.replay(branch="main", conv="c1", instance=1, n=5)
            state.purge(conv="c1", instance=0)
            state.compact(branch="main", conv="c1", instance=0, k=3)  # another version, same digest
            state.replay(branch="main", conv="c1", instance=1, n=5)
        finally:
            state.teardown()


def big_session(n: int) -> list[dict[str, object]]:
    """n messages of about 80 bytes each."""
    return [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} " * 10} for i in range(n)]


def _net(client: redis.Redis) -> int:
    stats = client.info("stats")
    return int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


@pytest.mark.parametrize("size", [200, 2000])
async def test_a_replayed_turn_moves_under_2_kb_whatever_the_sessions_size(
    tmp_path: Path, size: int
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        store = await RedisStore.open(server.url, timeout_ms=5000, pool_size=1)
        counters = redis.Redis.from_url(server.url)
        msgs = big_session(size)
        saved = compaction(A, "c1", msgs, size - 20)
        # A checkpoint as large as a real one: the kept tail of the session, verbatim.
        cp = saved.checkpoint
        big = type(cp)(**{**cp.__dict__, "messages": [*cp.messages, *msgs[: size // 2]]})
        await store.save_compaction(type(saved)(big, saved.originals, saved.refs), TTL)
        other = await RedisStore.open(server.url, timeout_ms=5000, pool_size=1)
        for s in (store, other):  # Redis learns the script once (SCRIPT LOAD): not a turn's cost
            await s.find_checkpoint(A, "warm-up", prefixes(msgs[:1]))

        async def turn_bytes(s: RedisStore, n: int) -> int:
            base = _net(counters)
            info_cost = _net(counters) - base  # what one INFO itself adds
            before = _net(counters)
            found = await s.find_checkpoint(A, "c1", prefixes(msgs[:n]))
            assert found is not None
            assert found.covered_through == size - 20
            return _net(counters) - before - info_cost

        per_turn = [await turn_bytes(store, n) for n in range(size - 18, size)]
        first_elsewhere = await turn_bytes(other, size - 1)
        again_elsewhere = await turn_bytes(other, size)
        await store.close()
        await other.close()
        counters.close()
    finally:
        server.stop()

    assert max(per_turn) <= 2048, per_turn
    assert first_elsewhere > 2048 * (size // 1000 + 1)  # an instance new to it reads it once
    assert again_elsewhere <= 2048


async def test_sqlite_replays_read_the_checkpoint_once(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "compactd.db")
    msgs = big_session(300)
    await store.save_compaction(compaction(A, "c1", msgs, 250), TTL)
    other = await SqliteStore.open(tmp_path / "compactd.db")  # another worker
    decoded: list[int] = []
    real = other._decoded.load

    def counting(raw: bytes | str, tenant: str) -> Any:
        decoded.append(len(raw))
        return real(raw, tenant)

    other._decoded.load = counting  # type: ignore[method-assign]
    try:
        found = [await other.find_checkpoint(A, "c1", prefixes(msgs[:n])) for n in range(260, 300)]
    finally:
        await store.close()
        await other.close()

    assert all(f is not None and f.covered_through == 250 for f in found)
    assert all(f is found[0] for f in found)
    assert len(decoded) == 1  # the body was read (and compared) on the first lookup only


def test_versions_name_the_bytes_and_their_length() -> None:
    v = version_of(b"abc")
    assert v == "a9993e364706816aba3e25717850c26c9cd0d89d:3"
    assert version_length(v) == 3
    assert version_length("") == -1


async def test_a_checkpoint_stored_without_a_version_is_looked_up_in_full_and_still_found(
    redis_backend: Any,
) -> None:
    """As a build before versions stored it: no `v:<digest>` in the metadata."""
    store, keys, raw = redis_backend.store, redis_backend.keys, redis_backend.raw
    msgs = history(12)
    saved = await store.save_compaction(compaction(A, "old", msgs, 5), TTL)
    await raw.hdel(keys.conversation(A, "old").meta, f"v:{saved.source_digest}")
    async with redis_backend.another() as other:
        found = [await other.find_checkpoint(A, "old", prefixes(msgs[:n])) for n in (8, 9, 10)]
        # A save of the same prefix (first writer wins) records the version it lacked.
        await other.save_compaction(compaction(A, "old", msgs, 5, "second"), TTL)
        again = await other.find_checkpoint(A, "old", prefixes(msgs))

    assert all(f is not None and f.messages == saved.messages for f in found)
    assert again is not None
    assert again.messages == saved.messages
    assert await raw.hget(keys.conversation(A, "old").meta, f"v:{saved.source_digest}")
