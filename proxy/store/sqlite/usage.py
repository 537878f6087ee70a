"""Usage aggregates in SQLite, in a file of their own next to the store's.

Accounting writes never take the main file's write lock, so a batch of counters can never make
a compaction wait (one SQLite file has one writer at a time, whichever thread holds it). The
file runs with synchronous=NORMAL: these are counters, not originals; WAL survives a process
crash, and a power cut loses at most the last batches.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.store import codec
from proxy.store.base import UsageDelta
from proxy.store.sqlite import activity as sqlite_activity
from proxy.store.sqlite.ops import set_wal, transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, tenant TEXT NOT NULL, policy TEXT NOT NULL, model TEXT NOT NULL,
    counter TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (day, tenant, policy, model, counter)) WITHOUT ROWID
"""
_UPSERT = (
    "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT"
    " (day, tenant, policy, model, counter) DO UPDATE SET n = n + excluded.n"
)


def usage_path(store_path: Path) -> Path:
    """`compactd.db` -> `compactd-usage.db`, in the same directory."""
    return store_path.with_name(f"{store_path.stem}-usage{store_path.suffix or '.db'}")


def connect(path: str, busy_ms: int, main_path: str = "") -> sqlite3.Connection:
    """A connection to the usage file (WAL, NORMAL), with rows of an older main file moved in."""
    con = sqlite3.connect(
        path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False
    )
    con.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
    set_wal(con, busy_ms)
    con.execute("PRAGMA synchronous = NORMAL")
    with transaction(con):
        con.execute(SCHEMA)
        sqlite_activity.create(con)
    if main_path:
        _adopt_old_rows(con, main_path)
    return con


def _adopt_old_rows(con: sqlite3.Connection, main_path: str) -> None:
    # Before 0.2 usage rows lived in the main file: move them here once (WAL keeps each file's
    # part atomic; only a host crash inside this one commit could count them twice).
    con.execute("ATTACH DATABASE ? AS old", (main_path,))
    try:
        # Inside the transaction: a second worker starting at once waits, then finds nothing.
        with transaction(con):
            found = con.execute(
                "SELECT 1 FROM old.sqlite_master WHERE type = 'table' AND name = 'usage'"
            ).fetchone()
            if found is None:
                return
            con.execute(
                "INSERT INTO main.usage SELECT * FROM old.usage WHERE true ON CONFLICT"
                " (day, tenant, policy, model, counter) DO UPDATE SET n = n + excluded.n"
            )
            con.execute("DROP TABLE old.usage")
    finally:
        con.execute("DETACH DATABASE old")


def add_usage(con: sqlite3.Connection, deltas: Sequence[UsageDelta]) -> None:
    """Add a batch of aggregates' counters in one transaction."""
    rows = [
        (d.day, d.tenant, d.policy, d.model, name, n)
        for d in deltas
        for name, n in d.counters.items()
        if n
    ]
    with transaction(con):
        con.executemany(_UPSERT, rows)


def usage(con: sqlite3.Connection, tenant: str | None, since_day: str) -> list[dict[str, Any]]:
    """Aggregates per (tenant, policy, model, day) from `since_day` on."""
    codec.days_since(since_day)  # validates the format
    rows: dict[tuple[str, str, str, str], dict[str, int]] = {}
    for day, t, policy, model, counter, n in con.execute(
        "SELECT day, tenant, policy, model, counter, n FROM usage"
        " WHERE day >= ? AND (tenant = ? OR ? IS NULL)",
        (since_day, tenant, tenant),
    ):
        rows.setdefault((t, policy, model, day), {})[counter] = n
    return [codec.usage_row(*key, counters) for key, counters in sorted(rows.items())]
