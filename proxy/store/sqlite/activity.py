"""Conversation activity in SQLite, in the usage file (counters, never on the writer's lock).

One row per (tenant, conversation): the API and model of its latest request, when it was first
and last seen, and counters added up from every worker's batches. A row lives `ttl` after its
last request; expired rows are skipped when read and deleted with the next batch.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from proxy.store.base import ACTIVITY_FIELDS, ActivityDelta
from proxy.store.sqlite.ops import transaction

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS activity (
    tenant TEXT NOT NULL, conversation TEXT NOT NULL, api TEXT NOT NULL, model TEXT NOT NULL,
    first_seen REAL NOT NULL, last_seen REAL NOT NULL, expires_at REAL NOT NULL,
    requests INTEGER NOT NULL, compactions INTEGER NOT NULL,
    tokens_before INTEGER NOT NULL, tokens_after INTEGER NOT NULL,
    PRIMARY KEY (tenant, conversation)) WITHOUT ROWID
""",
    "CREATE INDEX IF NOT EXISTS activity_expiry ON activity (expires_at)",
    "CREATE INDEX IF NOT EXISTS activity_recent ON activity (last_seen)",
)
_UPSERT = """
INSERT INTO activity VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, conversation) DO UPDATE SET
    api = CASE WHEN excluded.last_seen >= last_seen THEN excluded.api ELSE api END,
    model = CASE WHEN excluded.last_seen >= last_seen THEN excluded.model ELSE model END,
    first_seen = min(first_seen, excluded.first_seen),
    last_seen = max(last_seen, excluded.last_seen),
    expires_at = max(expires_at, excluded.expires_at),
    requests = requests + excluded.requests,
    compactions = compactions + excluded.compactions,
    tokens_before = tokens_before + excluded.tokens_before,
    tokens_after = tokens_after + excluded.tokens_after
"""
_COLUMNS = ("tenant", "conversation", "api", "model", "first_seen", "last_seen", *ACTIVITY_FIELDS)


def create(con: sqlite3.Connection) -> None:
    """The table and its indexes (in the caller's transaction)."""
    for statement in SCHEMA:
        con.execute(statement)


def add(con: sqlite3.Connection, deltas: Sequence[ActivityDelta], ttl: float) -> None:
    """Add a batch in one transaction, and drop the rows whose time has passed."""
    rows = [
        (
            d.tenant,
            d.conversation,
            d.api,
            d.model,
            d.seen_at,
            d.seen_at,
            d.seen_at + ttl,
            *(d.counters.get(name, 0) for name in ACTIVITY_FIELDS),
        )
        for d in deltas
    ]
    with transaction(con):
        con.executemany(_UPSERT, rows)
        con.execute("DELETE FROM activity WHERE expires_at < ?", (time.time(),))


def recent(con: sqlite3.Connection, tenant: str | None, limit: int) -> list[dict[str, Any]]:
    """The most recently active conversations, newest first (expired ones left out)."""
    found = con.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM activity"  # noqa: S608  (our own column names)
        " WHERE expires_at >= ? AND (tenant = ? OR ? IS NULL)"
        " ORDER BY last_seen DESC LIMIT ?",
        (time.time(), tenant, tenant, limit),
    )
    return [dict(zip(_COLUMNS, row, strict=True)) for row in found]


def purge(con: sqlite3.Connection, tenant: str | None, conversation: str) -> None:
    """Forget a conversation's activity (with the conversation, on a purge)."""
    with transaction(con):
        con.execute(
            "DELETE FROM activity WHERE conversation = ? AND (tenant = ? OR ? IS NULL)",
            (conversation, tenant, tenant),
        )
