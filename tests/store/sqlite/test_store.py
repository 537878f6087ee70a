"""The SQLite store shared by several worker processes on one machine."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import stat
import time
from pathlib import Path

import pytest

from proxy.errors import StoreError
from proxy.store.base import UsageRecord
from proxy.store.sqlite import ops as sqlite_ops
from proxy.store.sqlite.store import SqliteStore
from tests.store.test_contract import A, compaction, history, prefixes

TTL = 1000
ROUNDS = 40
HANG_GUARD = 30  # seconds: only stops a hung test; no assertion is made on elapsed time


async def _write(path: Path, worker: int) -> None:
    store = await SqliteStore.open(path, timeout_ms=10_000)
    msgs = history(ROUNDS + 2)
    for i in range(ROUNDS):
        await store.save_compaction(compaction(A, f"w{worker}-{i}", msgs, i), TTL)
        # Both workers also race on one shared conversation: the same source digest (first
        # writer wins) and distinct ones (none may be lost).
        await store.save_compaction(compaction(A, "shared", msgs, i, f"worker {worker}"), TTL)
        await store.record_usage(UsageRecord(A, "default", "m", "2026-01-01", "compacted", 10, 5))
    await store.close()


def _worker(path: str, worker: int) -> None:
    asyncio.run(_write(Path(path), worker))


class _BusyAtFirst:
    """A connection whose WAL switch is refused `busy` times the way SQLite refuses it when
    two processes switch a new file at once (SQLITE_BUSY at once, no busy wait)."""

    def __init__(self, busy: int, code: int = sqlite3.SQLITE_BUSY) -> None:
        self.busy, self.code, self.calls = busy, code, 0

    def execute(self, sql: str) -> None:
        assert sql == "PRAGMA journal_mode = WAL"
        self.calls += 1
        if self.calls <= self.busy:
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = self.code  # type: ignore[attr-defined]
            raise exc


def test_the_wal_switch_is_retried_while_another_process_makes_it() -> None:
    con = _BusyAtFirst(busy=3)
    sqlite_ops.set_wal(con, 5000)  # type: ignore[arg-type]
    assert con.calls == 4
    recovering = _BusyAtFirst(busy=1, code=261)  # SQLITE_BUSY_RECOVERY: busy too
    sqlite_ops.set_wal(recovering, 5000)  # type: ignore[arg-type]
    assert recovering.calls == 2


def test_the_wal_switch_gives_up_at_the_deadline_and_on_other_errors() -> None:
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        sqlite_ops.set_wal(_BusyAtFirst(busy=10**9), 50)  # type: ignore[arg-type]
    other = _BusyAtFirst(busy=1, code=sqlite3.SQLITE_IOERR)
    with pytest.raises(sqlite3.OperationalError):
        sqlite_ops.set_wal(other, 5000)  # type: ignore[arg-type]
    assert other.calls == 1


async def test_two_processes_writing_one_file_stay_consistent(tmp_path: Path) -> None:
    path = tmp_path / "compactd.db"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(path), w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 120)
    assert [p.exitcode for p in procs] == [0, 0]

    store = await SqliteStore.open(path, timeout_ms=2000)
    listed = await store.list_conversations(A)
    shared = await store.get_conversation(A, "shared")
    usage = await store.usage(A, "2026-01-01")
    longest = await store.find_checkpoint(A, "shared", prefixes(history(ROUNDS + 2)))
    await store.close()

    assert len(listed) == 2 * ROUNDS + 1
    assert shared is not None
    assert shared.checkpoint_count == ROUNDS
    assert shared.original_count == ROUNDS
    assert usage[0]["requests"] == 2 * ROUNDS
    assert longest is not None
    assert longest.covered_through == ROUNDS - 1
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_the_database_file_and_its_directory_are_created(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "compactd.db"
    store = await SqliteStore.open(path)
    await store.ping()

    assert await store.check_config() == []
    await store.close()
    assert path.exists()


async def test_the_files_are_private_to_their_owner(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "compactd.db"
    store = await SqliteStore.open(path)
    await store.record_usage(UsageRecord(A, "default", "m", "2026-01-01", "compacted", 10, 5))
    await store.save_compaction(compaction(A, "c1", history(4), 2), TTL)
    await store.close()

    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for file in path.parent.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name


async def test_an_existing_world_readable_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "compactd.db"
    sqlite3.connect(path).close()
    path.chmod(0o644)

    await (await SqliteStore.open(path)).close()

    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_usage_rows_of_an_older_file_move_to_the_usage_file_once(tmp_path: Path) -> None:
    path = tmp_path / "compactd.db"
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE usage (day TEXT NOT NULL, tenant TEXT NOT NULL, policy TEXT NOT NULL,"
        " model TEXT NOT NULL, counter TEXT NOT NULL, n INTEGER NOT NULL,"
        " PRIMARY KEY (day, tenant, policy, model, counter)) WITHOUT ROWID"
    )
    con.execute("INSERT INTO usage VALUES ('2026-01-01', ?, 'default', 'm', 'requests', 7)", (A,))
    con.commit()
    con.close()

    for _ in range(2):  # a second start finds nothing left to move
        store = await SqliteStore.open(path)
        await store.record_usage(UsageRecord(A, "default", "m", "2026-01-01", "compacted", 1, 1))
        rows = await store.usage(A, "2026-01-01")
        await store.close()

    assert rows[0]["requests"] == 9
    with sqlite3.connect(path) as old:
        tables = {r[0] for r in old.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "usage" not in tables


async def test_a_statement_past_the_timeout_fails_the_call_and_finishes_on_its_thread(
    tmp_path: Path,
) -> None:
    store = await SqliteStore.open(tmp_path / "compactd.db", timeout_ms=50)
    finished: list[bool] = []

    def slow(con: sqlite3.Connection) -> None:
        time.sleep(0.3)
        con.execute("SELECT 1")
        finished.append(True)

    def broken(con: sqlite3.Connection) -> None:
        con.execute("SELECT * FROM no_such_table")

    try:
        with pytest.raises(StoreError, match="did not answer within 50 ms"):
            await store._run(slow, write=False)
        # The lane runs one statement at a time: the next call waits for the slow one.
        await store._run(lambda con: con.execute("SELECT 1"), slow=True, lane=store._reader)
        with pytest.raises(StoreError, match="no such table"):
            await store._run(broken, write=False)
        # The store serves on. 50 ms is a deadline a loaded machine can miss for a real write
        # (it did, in a full-suite run), so the rest runs with a roomy one.
        store._timeout = 30.0
        msgs = history(6)
        await store.save_compaction(compaction(A, "c1", msgs, 3), TTL)
        found = await store.find_checkpoint(A, "c1", prefixes(msgs))
    finally:
        await store.close()

    assert finished == [True]
    assert found is not None
    assert found.covered_through == 3


async def test_a_lane_idle_for_a_while_hands_its_allocator_cache_back_and_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from proxy.store.sqlite import store as module

    released: list[str] = []
    monkeypatch.setattr(module, "_IDLE_S", 0.05)
    monkeypatch.setattr(
        module, "release_thread_cache", lambda: released.append(threading.current_thread().name)
    )
    lane = module._Lane("idle")
    first = await lane.call(lambda: 1)
    for _ in range(200):
        if released:
            break
        await asyncio.sleep(0.01)
    again = await lane.call(lambda: 2)
    lane._jobs.put(None)

    assert (first, again) == (1, 2)
    assert released[:1] == ["compactd-sqlite-idle"]  # once idle, on the lane's own thread


async def test_a_purge_waits_out_another_process_holding_the_write_lock(tmp_path: Path) -> None:
    # Deleting a conversation is an operator's call, off any request's path: it may wait the
    # inspection timeout (10 s) for the write lock another worker holds, not the 100 ms a
    # proxied request waits. A compaction meanwhile still gives up at the store timeout.
    path = tmp_path / "compactd.db"
    store = await SqliteStore.open(path, timeout_ms=100)
    msgs = history(8)
    await store.save_compaction(compaction(A, "c1", msgs, 4), TTL)
    other = sqlite3.connect(path, isolation_level=None)  # another process's connection
    other.execute("BEGIN IMMEDIATE")
    try:
        purge = asyncio.ensure_future(store.purge(A, "c1"))
        with pytest.raises(StoreError):
            await store.save_compaction(compaction(A, "c2", msgs, 4), TTL)
        await asyncio.wait([purge], timeout=0.5)  # the lock stays held well past 100 ms
    finally:
        other.execute("ROLLBACK")
        other.close()
    try:
        async with asyncio.timeout(HANG_GUARD):
            deleted = await purge
        left = await store.get_conversation(A, "c1")
    finally:
        await store.close()

    assert deleted is True
    assert left is None


async def test_only_calls_off_the_request_path_wait_long_for_a_lock(tmp_path: Path) -> None:
    # SQLite's own wait for a lock (busy_timeout) matches the timeout of the calls on each
    # connection: a request's reads and writes give up at the store timeout (and free their
    # thread for the next request), restore, inspection, purge, accounting and expiry at 10 s.
    store = await SqliteStore.open(tmp_path / "compactd.db", timeout_ms=100)

    def busy_ms(con: sqlite3.Connection) -> int:
        return int(con.execute("PRAGMA busy_timeout").fetchone()[0])

    try:
        request_path = [await store._run(busy_ms), await store._run(busy_ms, write=False)]
        off_path = [
            await store._run(busy_ms, slow=True),
            await store._run(busy_ms, slow=True, lane=store._usage),
        ]
    finally:
        await store.close()

    assert request_path == [100, 100]
    assert off_path == [10_000, 10_000]
