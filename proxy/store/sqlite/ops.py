"""The SQLite store's statements: synchronous functions over one connection, run off the loop.

Writes run inside `BEGIN IMMEDIATE` (the write lock is taken up front, so two worker processes
queue on busy_timeout instead of failing a deferred upgrade). Retention is an `expires_at` per
conversation: reads ignore expired rows, a background task deletes them (`sqlite_expiry`).

Table names and `IN (?, ?, …)` placeholder lists are formatted into SQL (ruff S608); every one
comes from the constants below or counts parameters, never from input, which is always bound.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from proxy.store import codec
from proxy.store.base import (
    Checkpoint,
    Compaction,
    ConversationInfo,
    Message,
    version_length,
    version_of,
)

T = TypeVar("T")
Load = Callable[[bytes | str, str], Checkpoint]
"""Decodes a stored checkpoint for a tenant (codec.load_checkpoint or a cache of it)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    tenant TEXT NOT NULL, conversation TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, ttl INTEGER NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (tenant, conversation)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS conversations_by_id ON conversations (conversation);
CREATE INDEX IF NOT EXISTS conversations_by_expiry ON conversations (expires_at);
CREATE TABLE IF NOT EXISTS checkpoints (
    tenant TEXT NOT NULL, conversation TEXT NOT NULL, source_digest TEXT NOT NULL,
    covered_through INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (tenant, conversation, source_digest)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoint_versions (
    tenant TEXT NOT NULL, conversation TEXT NOT NULL, source_digest TEXT NOT NULL,
    version TEXT NOT NULL,
    PRIMARY KEY (tenant, conversation, source_digest)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS checkpoint_written AFTER INSERT ON checkpoints BEGIN
    DELETE FROM checkpoint_versions WHERE tenant = new.tenant
        AND conversation = new.conversation AND source_digest = new.source_digest; END;
CREATE TRIGGER IF NOT EXISTS checkpoint_changed AFTER UPDATE ON checkpoints BEGIN
    DELETE FROM checkpoint_versions WHERE tenant = old.tenant
        AND conversation = old.conversation AND source_digest = old.source_digest; END;
CREATE TRIGGER IF NOT EXISTS checkpoint_deleted AFTER DELETE ON checkpoints BEGIN
    DELETE FROM checkpoint_versions WHERE tenant = old.tenant
        AND conversation = old.conversation AND source_digest = old.source_digest; END;
CREATE TABLE IF NOT EXISTS originals (
    tenant TEXT NOT NULL, conversation TEXT NOT NULL, digest TEXT NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (tenant, conversation, digest)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refs (
    tenant TEXT NOT NULL, conversation TEXT NOT NULL, ref_id TEXT NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (tenant, conversation, ref_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS refs_by_id ON refs (tenant, ref_id);
CREATE TABLE IF NOT EXISTS windows (
    scope TEXT NOT NULL, model TEXT NOT NULL, window INTEGER NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (scope, model)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS summaries (
    tenant TEXT NOT NULL, digest TEXT NOT NULL, body BLOB NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (tenant, digest)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS summaries_by_expiry ON summaries (expires_at);
"""
DATA_TABLES = ("checkpoints", "originals", "refs")
VERSIONS = "checkpoint_versions"
"""Per checkpoint its version (`base.version_of` its body): a replay of a checkpoint the
process holds reads the version and the body's length, never the body. Triggers drop a
version whenever its checkpoint row is written, changed or deleted by anything (an older
build, an expiry pass, a hand-made UPDATE), so a version row always names the bytes stored."""
Held = Callable[[str, str, str, str], Checkpoint | None]
"""(tenant, conversation, source digest, version) -> the checkpoint held of that version."""


def connect(path: str, busy_ms: int) -> sqlite3.Connection:
    """A connection in WAL mode with the schema in place (autocommit: we BEGIN ourselves)."""
    con = sqlite3.connect(
        path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False
    )
    con.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
    set_wal(con, busy_ms)
    # FULL: a compaction is forwarded only once its originals survive a power cut, too.
    con.execute("PRAGMA synchronous = FULL")
    with transaction(con):
        for stmt in SCHEMA.split(";\n"):  # a trigger's body holds `;` within a line
            if stmt.strip():
                con.execute(stmt)
    return con


WAL_RETRY_SECONDS = 0.01


def set_wal(con: sqlite3.Connection, busy_ms: int) -> None:
    """`PRAGMA journal_mode = WAL`, retried while the file is busy, for up to `busy_ms`.

    Switching a new file to WAL takes its exclusive lock. When two processes switch it at once
    (workers starting on a fresh data dir), SQLite answers one of them SQLITE_BUSY at once,
    without waiting on busy_timeout, since both waiting would deadlock; once the other's switch
    is done the file is in WAL mode and the pragma succeeds."""
    deadline = time.monotonic() + busy_ms / 1000
    while True:
        try:
            con.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() >= deadline:
                raise
        else:
            return
        time.sleep(WAL_RETRY_SECONDS)


@contextmanager
def transaction(con: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    """BEGIN … COMMIT, or ROLLBACK on any error (all or nothing)."""
    con.execute(f"BEGIN {mode}")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _marks(items: Sequence[Any]) -> str:
    return ",".join("?" * len(items))


_BATCH = 500  # ids per `IN (…)`: well under SQLite's limit on bound parameters (32,766)


def _batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), _BATCH):
        yield items[start : start + _BATCH]


def find_checkpoint(
    con: sqlite3.Connection,
    tenant: str,
    conv: str,
    prefix_digests: Sequence[str],
    load: Load = codec.load_checkpoint,
    *,
    held: Held | None = None,
) -> tuple[Checkpoint | None, int]:
    """(longest matching checkpoint, the retention to refresh it to or 0 if not due);
    `load` decodes the stored checkpoint, `held` gives the one held of its version
    (`proxy.store.decoded`)."""
    now = time.time()
    with transaction(con, "DEFERRED"):
        row = con.execute(
            "SELECT ttl, expires_at FROM conversations"
            " WHERE tenant = ? AND conversation = ? AND expires_at > ?",
            (tenant, conv, now),
        ).fetchone()
        if row is None:
            return None, 0
        index = dict(
            con.execute(
                "SELECT source_digest, covered_through FROM checkpoints"
                " WHERE tenant = ? AND conversation = ?",
                (tenant, conv),
            ).fetchall()
        )
        found: Checkpoint | None = None
        for digest in codec.candidates(index, prefix_digests):
            found = _held(con, tenant, conv, digest, held)
            if found is not None:
                break
            body = con.execute(
                "SELECT body FROM checkpoints"
                " WHERE tenant = ? AND conversation = ? AND source_digest = ?",
                (tenant, conv, digest),
            ).fetchone()
            if body is not None:
                found = load(body[0], tenant)
                break
    if found is None:
        return None, 0
    ttl, expires_at = int(row[0]), float(row[1])
    # A write on every replay would make worker processes queue on the write lock for nothing.
    due = codec.refresh_due(ttl, expires_at - now)
    return found, ttl if due else 0


def _held(
    con: sqlite3.Connection, tenant: str, conv: str, digest: str, held: Held | None
) -> Checkpoint | None:
    """The held checkpoint of this digest, if its stored version (and length) is the same."""
    if held is None:
        return None
    row = con.execute(
        "SELECT v.version, length(c.body) FROM checkpoints c JOIN checkpoint_versions v"
        " USING (tenant, conversation, source_digest)"
        " WHERE c.tenant = ? AND c.conversation = ? AND c.source_digest = ?",
        (tenant, conv, digest),
    ).fetchone()
    if row is None or version_length(row[0]) != row[1]:
        return None
    return held(tenant, conv, digest, row[0])


def refresh(con: sqlite3.Connection, tenant: str, conv: str, ttl: int) -> None:
    """Push a conversation's expiry back to now + ttl (all its rows expire together)."""
    now = time.time()
    with transaction(con):
        con.execute(
            "UPDATE conversations SET expires_at = ?, updated_at = ?"
            " WHERE tenant = ? AND conversation = ? AND expires_at > ?",
            (now + ttl, now, tenant, conv, now),
        )


def _write_originals(
    con: sqlite3.Connection,
    t: str,
    c: str,
    *,
    originals: Mapping[str, Message],
    refs: Mapping[str, list[str]],
    ttl: int,
    now: float,
) -> None:
    """The conversation row (a stale one replaced), its originals and refs (inside the
    caller's transaction)."""
    stale = con.execute(
        "SELECT 1 FROM conversations WHERE tenant = ? AND conversation = ? AND expires_at <= ?",
        (t, c, now),
    ).fetchone()
    if stale:
        delete_conversation(con, t, c)
    con.execute(
        "INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (tenant, conversation) DO UPDATE SET updated_at = excluded.updated_at,"
        " ttl = excluded.ttl, expires_at = excluded.expires_at",
        (t, c, now, now, ttl, now + ttl),
    )
    con.executemany(
        "INSERT OR IGNORE INTO originals VALUES (?, ?, ?, ?)",
        [(t, c, d, codec.dump_original(t, m)) for d, m in originals.items()],
    )
    con.executemany(
        "INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?)",
        [(t, c, ref, codec.dump_ref(t, ds)) for ref, ds in refs.items()],
    )


def save_originals(
    con: sqlite3.Connection,
    tenant: str,
    conversation: str,
    *,
    originals: Mapping[str, Message],
    refs: Mapping[str, list[str]],
    ttl: int,
) -> None:
    """Originals and refs without a checkpoint, in one IMMEDIATE transaction."""
    with transaction(con):
        _write_originals(
            con, tenant, conversation, originals=originals, refs=refs, ttl=ttl, now=time.time()
        )


def save_compaction(
    con: sqlite3.Connection,
    compaction: Compaction,
    ttl: int,
    load: Load = codec.load_checkpoint,
) -> Checkpoint:
    """Originals, refs, checkpoint and metadata in one IMMEDIATE transaction; first writer wins."""
    cp = compaction.checkpoint
    t, c = cp.tenant, cp.conversation
    now = time.time()
    with transaction(con):
        _write_originals(
            con, t, c, originals=compaction.originals, refs=compaction.refs, ttl=ttl, now=now
        )
        con.execute(
            "INSERT OR IGNORE INTO checkpoints VALUES (?, ?, ?, ?, ?)",
            (t, c, cp.source_digest, cp.covered_through, codec.dump_checkpoint(cp)),
        )
        (body,) = con.execute(
            "SELECT body FROM checkpoints"
            " WHERE tenant = ? AND conversation = ? AND source_digest = ?",
            (t, c, cp.source_digest),
        ).fetchone()
        con.execute(
            f"INSERT OR IGNORE INTO {VERSIONS} VALUES (?, ?, ?, ?)",  # noqa: S608
            (t, c, cp.source_digest, version_of(body)),
        )
    return load(body, t)


def delete_conversation(con: sqlite3.Connection, tenant: str, conv: str) -> bool:
    """Delete one conversation's rows (inside the caller's transaction); True if it existed."""
    for table in DATA_TABLES:
        con.execute(f"DELETE FROM {table} WHERE tenant = ? AND conversation = ?", (tenant, conv))  # noqa: S608
    cur = con.execute(
        "DELETE FROM conversations WHERE tenant = ? AND conversation = ?", (tenant, conv)
    )
    return cur.rowcount > 0


def delete_summaries(con: sqlite3.Connection, tenant: str, conv: str) -> None:
    """Delete the tenant's cached LLM summaries of this conversation's spans: those whose digest
    begins with one of its ref ids (a span's ref id is the start of its digest)."""
    for (ref,) in con.execute(
        "SELECT ref_id FROM refs WHERE tenant = ? AND conversation = ?", (tenant, conv)
    ).fetchall():
        # A range on the key, not a scan: every digest that begins with `ref` (hex).
        con.execute(
            "DELETE FROM summaries WHERE tenant = ? AND digest >= ? AND digest < ?",
            (tenant, ref, f"{ref}\x7f"),
        )


def resolve_refs(
    con: sqlite3.Connection, tenant: str, ref_ids: Sequence[str]
) -> dict[str, list[Message]]:
    """Reference id -> originals, for live conversations of this tenant."""
    out: dict[str, list[Message]] = {}
    now = time.time()
    with transaction(con, "DEFERRED"):
        rows = [
            row
            for ids in _batches(ref_ids)
            for row in con.execute(
                "SELECT r.conversation, r.ref_id, r.body FROM refs r JOIN conversations c"  # noqa: S608
                " ON c.tenant = r.tenant AND c.conversation = r.conversation"
                f" WHERE r.tenant = ? AND r.ref_id IN ({_marks(ids)}) AND c.expires_at > ?",
                (tenant, *ids, now),
            ).fetchall()
        ]
        for conv, ref, body in rows:
            digests = codec.load_ref(body, tenant)
            found = {
                digest: original
                for part in _batches(digests)
                for digest, original in con.execute(
                    "SELECT digest, body FROM originals WHERE tenant = ? AND conversation = ?"  # noqa: S608
                    f" AND digest IN ({_marks(part)})",
                    (tenant, conv, *part),
                ).fetchall()
            }
            if ref not in out and all(d in found for d in digests):
                out[ref] = [codec.load_original(found[d], tenant) for d in digests]
    return out


def ref_conversations(
    con: sqlite3.Connection, tenant: str, ref_ids: Sequence[str]
) -> dict[str, list[str]]:
    """Reference id -> the live conversations of this tenant that store it."""
    out: dict[str, list[str]] = {}
    with transaction(con, "DEFERRED"):
        for ids in _batches(ref_ids):
            for ref, conv in con.execute(
                "SELECT r.ref_id, r.conversation FROM refs r JOIN conversations c"  # noqa: S608
                " ON c.tenant = r.tenant AND c.conversation = r.conversation"
                f" WHERE r.tenant = ? AND r.ref_id IN ({_marks(ids)}) AND c.expires_at > ?",
                (tenant, *ids, time.time()),
            ).fetchall():
                out.setdefault(ref, []).append(conv)
    return out


def get_conversation(
    con: sqlite3.Connection, tenant: str | None, conv: str
) -> ConversationInfo | None:
    """Everything stored for one conversation (admin: the most recently used of that id)."""
    with transaction(con, "DEFERRED"):
        meta = con.execute(
            "SELECT tenant, created_at, updated_at, expires_at FROM conversations"
            " WHERE conversation = ? AND (tenant = ? OR ? IS NULL) AND expires_at > ?"
            " ORDER BY updated_at DESC LIMIT 1",
            (conv, tenant, tenant, time.time()),
        ).fetchone()
        if meta is None:
            return None
        owner = str(meta[0])
        data = {
            table: con.execute(
                f"SELECT * FROM {table} WHERE tenant = ? AND conversation = ?",  # noqa: S608
                (owner, conv),
            ).fetchall()
            for table in DATA_TABLES
        }
    # Rows are (tenant, conversation, id, [covered_through,] body).
    loaded = codec.load_conversation(
        owner, *(((row[2], row[-1]) for row in data[table]) for table in DATA_TABLES)
    )
    return ConversationInfo(
        tenant=owner,
        conversation=conv,
        created_at=float(meta[1]),
        updated_at=float(meta[2]),
        checkpoints=loaded.checkpoints,
        originals=loaded.originals,
        refs=loaded.refs,
        size_bytes=sum(len(row[-1]) for rows in data.values() for row in rows),
        expires_at=float(meta[3]),
        checkpoint_count=len(data["checkpoints"]),
        original_count=len(data["originals"]),
        unreadable=loaded.unreadable,
    )


def _per_conv(expr: str, table: str) -> str:
    same = "x.tenant = c.tenant AND x.conversation = c.conversation"
    return f"(SELECT {expr} FROM {table} x WHERE {same})"  # noqa: S608


def list_conversations(con: sqlite3.Connection, tenant: str | None) -> list[ConversationInfo]:
    """Live conversations with sizes and counts, most recently used first."""
    size = " + ".join(_per_conv("coalesce(sum(length(body)), 0)", t) for t in DATA_TABLES)
    rows = con.execute(
        "SELECT tenant, conversation, created_at, updated_at, expires_at,"  # noqa: S608
        f" {_per_conv('count(*)', 'checkpoints')}, {_per_conv('count(*)', 'originals')}, {size}"
        " FROM conversations c WHERE (tenant = ? OR ? IS NULL) AND expires_at > ?"
        " ORDER BY updated_at DESC",
        (tenant, tenant, time.time()),
    ).fetchall()
    return [
        ConversationInfo(
            tenant=r[0],
            conversation=r[1],
            created_at=r[2],
            updated_at=r[3],
            expires_at=r[4],
            checkpoint_count=r[5],
            original_count=r[6],
            size_bytes=r[7],
        )
        for r in rows
    ]


def run_write(con: sqlite3.Connection, fn: Callable[[], T]) -> T:
    """Run `fn` inside an IMMEDIATE transaction."""
    with transaction(con):
        return fn()
