"""Usage aggregates in SQLite: one row per (day, tenant, policy, model, counter), upserted."""

from __future__ import annotations

import sqlite3
from typing import Any

from proxy.store import codec
from proxy.store.base import UsageRecord
from proxy.store.sqlite_ops import transaction


def record_usage(con: sqlite3.Connection, record: UsageRecord) -> None:
    """Add one request's counters to its aggregate."""
    key = (record.day, record.tenant, record.policy, record.model)
    # Counters, not originals: an fsync per request (FULL: ~6 ms on this VM) caps the writer
    # thread at ~150 req/s, so under load usage writes time out and queue compaction writes
    # behind them. NORMAL (WAL) survives a process crash; the next FULL commit syncs these too.
    con.execute("PRAGMA synchronous = NORMAL")
    try:
        with transaction(con):
            con.executemany(
                "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT"
                " (day, tenant, policy, model, counter) DO UPDATE SET n = n + excluded.n",
                [(*key, name, n) for name, n in codec.usage_increments(record).items()],
            )
    finally:
        con.execute("PRAGMA synchronous = FULL")


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
