"""Learned context windows in each store: (scope, model) -> window, with an expiry.

A scope is one upstream (a digest of its URL); models are bounded key names. Entries are few
(one per model that ever overflowed) and capped at MAX_WINDOWS per scope; expired ones are
ignored on read and deleted on write.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:  # each store's library is imported only by that store (see store.factory)
    import sqlite3

    from proxy.store.redis.client import Client
    from proxy.store.redis.keys import KeyLayout

MAX_WINDOWS = 1024
CALIBRATION_SCALE = 10_000
"""Calibration ratios (`proxy.tokens.calibration`) live beside the windows, as integers in
1/10,000ths, under the scope `calibration:<api>`."""


def calibration_scope(api: str) -> str:
    """The scope an API's calibration ratios are kept under."""
    return f"calibration:{api}"


def sqlite_put(con: sqlite3.Connection, scope: str, model: str, window: int, ttl: int) -> None:
    """Record (or replace) one window; a full scope takes no new models."""
    from proxy.store.sqlite.ops import transaction  # noqa: PLC0415 (sqlite3: a SQLite store's)

    now = time.time()
    with transaction(con):
        con.execute("DELETE FROM windows WHERE scope = ? AND expires_at <= ?", (scope, now))
        (count,) = con.execute("SELECT count(*) FROM windows WHERE scope = ?", (scope,)).fetchone()
        known = con.execute(
            "SELECT 1 FROM windows WHERE scope = ? AND model = ?", (scope, model)
        ).fetchone()
        if known or count < MAX_WINDOWS:
            con.execute(
                "INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?)",
                (scope, model, window, now + ttl),
            )


def sqlite_windows(con: sqlite3.Connection, scope: str) -> dict[str, int]:
    """Every live window of a scope."""
    rows = con.execute(
        "SELECT model, window FROM windows WHERE scope = ? AND expires_at > ?", (scope, time.time())
    ).fetchall()
    return {str(model): int(window) for model, window in rows}


async def redis_put(
    r: Client, keys: KeyLayout, scope: str, model: str, *, window: int, ttl: int
) -> None:
    """HSET the window with its expiry in the value (hash fields have no TTL of their own)."""
    key = keys.windows(scope)
    if not await r.hexists(key, model) and await r.hlen(key) >= MAX_WINDOWS:
        await redis_windows(r, keys, scope)  # deletes expired entries
        if await r.hlen(key) >= MAX_WINDOWS:
            return
    async with r.pipeline(transaction=True) as p:
        p.hset(key, model, orjson.dumps([window, time.time() + ttl]))
        p.expire(key, ttl, nx=True)
        p.expire(key, ttl, gt=True)
        await p.execute()


async def redis_windows(r: Client, keys: KeyLayout, scope: str) -> dict[str, int]:
    """Every live window of a scope; expired fields are deleted."""
    key = keys.windows(scope)
    now = time.time()
    live: dict[str, int] = {}
    expired: list[str] = []
    for field, raw in (await r.hgetall(key)).items():
        window, expires_at = orjson.loads(raw)
        name = field.decode() if isinstance(field, bytes) else str(field)
        if expires_at > now:
            live[name] = int(window)
        else:
            expired.append(name)
    if expired:
        await r.hdel(key, *expired)
    return live
