"""Retention in the SQLite store: what has expired is deleted off every request's path."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from proxy.store.base import StoreError
from proxy.store.sqlite import SqliteStore
from tests.store.test_contract import A, compaction, history, prefixes

TTL = 1000
BACKLOG = 20_000  # expired conversations: ~0.6 s to delete in one transaction on this machine
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


@pytest.mark.xfail(raises=StoreError, strict=True, reason="the purge runs inside the save")
async def test_a_compaction_save_is_not_slowed_by_an_expired_backlog_the_purge_deletes(
    tmp_path: Path,
) -> None:
    # Thousands of conversations expired at once (or a server down longer than the retention):
    # deleting them all in one transaction takes well past the default store timeout. The
    # request whose save carried that purge failed open, the purge was rolled back, and the
    # next save a minute later tried the same again.
    path = tmp_path / "compactd.db"
    earlier = await SqliteStore.open(path)
    await earlier.save_compaction(compaction(A, "live", history(8), 4), TTL)
    await earlier.close()
    _seed_expired(path, BACKLOG, ORIGINALS)
    store = await SqliteStore.open(path, timeout_ms=200)
    try:
        msgs = history(10)
        saved = await store.save_compaction(compaction(A, "new", msgs, 5), TTL)
        found = await store.find_checkpoint(A, "new", prefixes(msgs))
        before = _left(path)
        await store.purge_expired()  # type: ignore[attr-defined]
    finally:
        await store.close()

    assert saved.covered_through == 5
    assert found is not None
    assert len(before["originals"]) == BACKLOG + 2  # the save left the backlog alone
    assert _left(path) == {table: {"live", "new"} for table in before}
