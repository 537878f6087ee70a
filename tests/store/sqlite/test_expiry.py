"""Retention in the SQLite store: what has expired is deleted off every request's path."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.errors import StoreError
from proxy.store.sqlite import expiry as sqlite_expiry
from proxy.store.sqlite import ops as sqlite_ops
from proxy.store.sqlite.store import SqliteStore
from tests.store.test_contract import A, B, compaction, history, prefixes

TTL = 1000
HANG_GUARD = 30  # seconds: only stops a hung test; no assertion is made on elapsed time
BACKLOG = 30_000  # expired conversations: ~0.9 s to delete in one transaction on this machine
ORIGINALS = 10  # per expired conversation


def _seed_expired(path: Path, conversations: int, originals: int) -> None:
    """Expired conversations with a checkpoint, `originals` originals and a ref each, as a
    retention period elapsing for all of them at once leaves them (generated inside SQLite)."""
    n = (
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?),"
        " m(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM m WHERE j + 1 < ?)"
    )
    rows = {
        "conversations": "?, 'old' || i, 0, 0, 1000, 1 FROM n",
        "checkpoints": "?, 'old' || i, 'd', 1, randomblob(300) FROM n",
        "refs": "?, 'old' || i, 'r', randomblob(300) FROM n",
        "originals": "?, 'old' || i, j, randomblob(300) FROM n, m",
    }
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("BEGIN")
        for table, select in rows.items():
            con.execute(f"{n} INSERT INTO {table} SELECT {select}", (conversations, originals, A))
        con.execute("COMMIT")
    finally:
        con.close()


def _left(path: Path) -> dict[str, set[str]]:
    """The conversations each table still holds rows of."""
    tables = ("conversations", "checkpoints", "originals", "refs")
    with sqlite3.connect(path) as con:
        return {
            t: {c for (c,) in con.execute(f"SELECT DISTINCT conversation FROM {t}")} for t in tables
        }


@pytest.fixture
def unpaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pause between batches: it lets other writers in, and these tests have none."""
    monkeypatch.setattr(sqlite_expiry, "PAUSE_FACTOR", 0)
    monkeypatch.setattr(sqlite_expiry, "MIN_PAUSE_SECONDS", 0)


@pytest.mark.usefixtures("unpaced")
async def test_a_compaction_save_is_not_slowed_by_an_expired_backlog_the_purge_deletes(
    tmp_path: Path,
) -> None:
    # Thousands of conversations expired at once (or a server down longer than the retention):
    # deleting them all in one transaction takes well past the store timeout (200 ms by
    # default; 400 here, which an ordinary save meets even on a loaded machine). The request
    # whose save carried that purge failed open, the purge was rolled back, and the next save
    # a minute later tried the same again.
    path = tmp_path / "compactd.db"
    earlier = await SqliteStore.open(path)
    await earlier.save_compaction(compaction(A, "live", history(8), 4), TTL)
    await earlier.close()
    _seed_expired(path, BACKLOG, ORIGINALS)
    store = await SqliteStore.open(path, timeout_ms=400)
    try:
        msgs = history(10)
        saved = await store.save_compaction(compaction(A, "new", msgs, 5), TTL)
        found = await store.find_checkpoint(A, "new", prefixes(msgs))
        before = _left(path)
        await store.purge_expired()
    finally:
        await store.close()

    assert saved.covered_through == 5
    assert found is not None
    assert len(before["originals"]) == BACKLOG + 2  # the save left the backlog alone
    assert _left(path) == {table: {"live", "new"} for table in before}


@pytest.fixture
def con(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to a fresh store file, for driving batches directly."""
    con = sqlite_ops.connect(str(tmp_path / "compactd.db"), 2000)
    try:
        yield con
    finally:
        con.close()


def _insert(con: sqlite3.Connection, conv: str, expires_at: float, originals: int) -> None:
    con.execute("INSERT INTO conversations VALUES (?, ?, 0, 0, ?, ?)", (A, conv, TTL, expires_at))
    con.execute("INSERT INTO checkpoints VALUES (?, ?, 'd', 1, x'00')", (A, conv))
    con.execute("INSERT INTO refs VALUES (?, ?, 'r', x'00')", (A, conv))
    con.executemany(
        "INSERT INTO originals VALUES (?, ?, ?, x'00')",
        [(A, conv, str(j)) for j in range(originals)],
    )


def _rows(con: sqlite3.Connection, conv: str) -> dict[str, int]:
    """How many rows of `conv` each table holds."""
    return {
        table: con.execute(
            f"SELECT count(*) FROM {table} WHERE conversation = ?", (conv,)
        ).fetchone()[0]
        for table in ("conversations", *sqlite_ops.DATA_TABLES)
    }


def test_a_batch_deletes_at_most_its_limit_and_a_conversations_row_after_its_data(
    con: sqlite3.Connection,
) -> None:
    now = time.time()
    _insert(con, "big", now - 1, originals=25)  # 28 rows, its own row among them
    _insert(con, "small", now - 2, originals=3)  # 6 rows
    _insert(con, "live", now + TTL, originals=25)
    for name, expires_at in (("old", now - 1), ("new", now + TTL)):
        con.execute("INSERT INTO summaries VALUES (?, ?, x'00', ?)", (A, name, expires_at))
        con.execute("INSERT INTO windows VALUES ('up', ?, 0, ?)", (name, expires_at))

    counts, big = [], []
    while True:
        counts.append(sqlite_expiry.delete_batch(con, now, limit=10))
        big.append(_rows(con, "big"))
        if counts[-1] < 10:
            break

    assert counts == [10, 10, 10, 6]  # 28 + 6 + 2 expired rows, never more than 10 at once
    # The first batches take `small` whole (it expired first), then `big`'s data row by row;
    # `big` keeps its conversation row (still expired: no read sees it) until its data is gone.
    assert [b["conversations"] for b in big] == [1, 1, 1, 0]
    assert big[-1] == dict.fromkeys(big[-1], 0)
    assert _rows(con, "small") == dict.fromkeys(big[-1], 0)
    assert _rows(con, "live") == {"conversations": 1, "checkpoints": 1, "originals": 25, "refs": 1}
    assert con.execute("SELECT digest FROM summaries").fetchall() == [("new",)]
    assert con.execute("SELECT model FROM windows").fetchall() == [("new",)]


async def test_a_conversation_written_again_while_half_deleted_comes_back_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "compactd.db"
    store = await SqliteStore.open(path)
    try:
        old, new = history(30, " old"), history(10, " new")
        await store.save_compaction(compaction(A, "c1", old, 25), TTL)
        other = sqlite_ops.connect(str(path), 2000)  # another worker's expiry pass, half done
        other.execute("UPDATE conversations SET expires_at = 0")
        sqlite_expiry.delete_batch(other, time.time(), limit=10)
        half = _rows(other, "c1")
        await store.save_compaction(compaction(A, "c1", new, 5), TTL)
        rest = sqlite_expiry.delete_batch(other, time.time(), limit=10)
        other.close()
        found = await store.find_checkpoint(A, "c1", prefixes(new))
        info = await store.get_conversation(A, "c1")
    finally:
        await store.close()

    assert half == {"conversations": 1, "checkpoints": 0, "originals": 17, "refs": 1}
    assert rest == 0  # written again, it is live: the pass leaves it alone
    assert found is not None
    assert found.covered_through == 5
    assert info is not None
    assert info.original_count == 6  # only the new originals: the old ones went with the write
    assert set(info.refs) == {"0005abcdef"}


def _passes(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "compactd.store"]


async def test_a_worker_that_never_compacts_deletes_what_has_expired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="compactd.store")
    path = tmp_path / "compactd.db"
    earlier = await SqliteStore.open(path)
    await earlier.save_compaction(compaction(A, "gone", history(8), 4), TTL)
    await earlier.save_compaction(compaction(B, "kept", history(8), 4), TTL)
    await earlier.close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE conversations SET expires_at = 0 WHERE conversation = 'gone'")

    store = await SqliteStore.open(path, purge_every=0.05)  # only reads from here on
    try:
        async with asyncio.timeout(HANG_GUARD):
            while not _passes(caplog):
                await asyncio.sleep(0.05)
        kept = await store.get_conversation(B, "kept")
    finally:
        await store.close()

    first = _passes(caplog)[0]
    assert _left(path) == {table: {"kept"} for table in _left(path)}
    assert kept is not None
    assert first.levelno == logging.DEBUG
    assert first.getMessage() == "store: expiry pass deleted 8 rows in 1 batches"


@pytest.mark.parametrize("bug", [False, True], ids=["store-error", "any-other-exception"])
async def test_a_failed_pass_is_logged_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture, bug: bool
) -> None:
    calls: list[float] = []

    async def run_batch(now: float) -> int:
        calls.append(now)
        if len(calls) == 1:
            if bug:
                raise TypeError("a bug in a pass")
            raise StoreError("sqlite did not answer within 10000 ms")
        return 0

    expiry = sqlite_expiry.Expiry(run_batch, every=0.01)
    expiry.start()
    try:
        async with asyncio.timeout(HANG_GUARD):
            while len(calls) < 2:
                await asyncio.sleep(0.01)
    finally:
        await expiry.aclose()

    if bug:
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert [r.getMessage() for r in errors][:1] == [
            "store: expiry pass failed; next one in 0 s"
        ]
        return
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings][:1] == [
        "store: expiry pass stopped (sqlite did not answer within 10000 ms); next one in 0 s"
    ]
