"""Retention in the embedded store: a background task deletes what has expired, in small batches.

Reads ignore expired rows already, so deleting them only gives the space back and need not
happen on any request's path. Inside a compaction's save (as it once was) a large backlog (a
retention period elapsing for thousands of conversations at once, a server restarted after
being down longer than the retention) outlasted the store timeout: that request failed open,
the deletion was rolled back with it, and the next save tried again.

A pass (every PURGE_EVERY_SECONDS, on the store's connection whose lock waits may be long)
deletes everything expired when it began: conversations (their checkpoints, originals and refs
first, then the conversation row), summaries and learned windows. Each transaction deletes at
most BATCH_ROWS rows and the pass pauses between them, so it never holds the write lock for
long and a request's write, which waits no longer than the store timeout, gets it in between.
A conversation written again while half deleted is replaced whole by that write
(`sqlite_ops._write_originals` finds it expired), so no one reads what a pass left behind.

Table and column names are formatted into SQL (ruff S608); all are the constants below.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable

from proxy.errors import StoreError
from proxy.store.sqlite.ops import transaction

log = logging.getLogger("compactd.store")

PURGE_EVERY_SECONDS = 60.0
BATCH_ROWS = 1000
"""Rows deleted per transaction: a few milliseconds of the write lock (3-20 ms measured)."""
PAUSE_FACTOR = 3
MIN_PAUSE_SECONDS = 0.02
"""Between batches three times as long as the batch took, and at least this long: the write
lock is free three quarters of the time, so a request's write waiting for it (SQLite retries
it after sleeps of 1 to 50 ms within a 200 ms store timeout) all but surely finds it free once."""

_DATA_KEYS = (("checkpoints", "source_digest"), ("originals", "digest"), ("refs", "ref_id"))
_DUE = (
    "SELECT tenant, conversation FROM conversations WHERE expires_at <= ?"
    " ORDER BY expires_at, tenant, conversation LIMIT ?"
)
"""The first expired conversations, in an order every statement of a batch sees alike."""
_EXPIRING = (("summaries", "tenant, digest"), ("windows", "scope, model"))


def delete_batch(con: sqlite3.Connection, now: float, limit: int = BATCH_ROWS) -> int:
    """Delete at most `limit` rows expired by `now` in one transaction; how many were deleted
    (fewer than `limit`: nothing expired by `now` is left)."""
    with transaction(con):
        deleted = _delete_conversations(con, now, limit)
        for table, key in _EXPIRING:
            if deleted < limit:
                deleted += con.execute(
                    f"DELETE FROM {table} WHERE ({key}) IN"  # noqa: S608
                    f" (SELECT {key} FROM {table} WHERE expires_at <= ? LIMIT ?)",
                    (now, limit - deleted),
                ).rowcount
    return deleted


def _delete_conversations(con: sqlite3.Connection, now: float, limit: int) -> int:
    """The data rows of the first `limit` expired conversations, then (once none is left) as
    many of those conversations' rows as the limit allows. A conversation with more data rows
    than one batch takes keeps its row, and stays first in line, until a later batch empties it:
    no batch scans conversations an earlier one emptied."""
    deleted = 0
    for table, key in _DATA_KEYS:
        deleted += con.execute(
            f"DELETE FROM {table} WHERE (tenant, conversation, {key}) IN"  # noqa: S608
            f" (SELECT tenant, conversation, {key} FROM {table}"
            f" WHERE (tenant, conversation) IN ({_DUE}) LIMIT ?)",
            (now, limit, limit - deleted),
        ).rowcount
        if deleted >= limit:
            return deleted
    return (
        deleted
        + con.execute(
            f"DELETE FROM conversations WHERE (tenant, conversation) IN ({_DUE})",  # noqa: S608
            (now, limit - deleted),
        ).rowcount
    )


class Expiry:
    """The task running a pass every `every` seconds; `run_batch(now)` runs `delete_batch` on
    the store's expiry connection."""

    def __init__(self, run_batch: Callable[[float], Awaitable[int]], every: float) -> None:
        self._run_batch = run_batch
        self._every = every
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the task (the first pass one interval from now: a short-lived CLI command
        that opens the store never purges)."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def run_pass(self) -> int:
        """Delete everything expired by now, one batch per transaction; rows deleted."""
        now = time.time()
        deleted = batches = 0
        started = time.monotonic()
        while True:
            batch_started = time.monotonic()
            n = await self._run_batch(now)
            deleted += n
            batches += 1
            if n < BATCH_ROWS:
                break
            took = time.monotonic() - batch_started
            await asyncio.sleep(max(PAUSE_FACTOR * took, MIN_PAUSE_SECONDS))
        log.debug(
            "store: expiry pass deleted %d rows in %d batches",
            deleted,
            batches,
            extra={"rows": deleted, "batches": batches, "seconds": time.monotonic() - started},
        )
        return deleted

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self.run_pass()
            except StoreError as exc:
                # What it deleted is committed; the rest waits for the next pass.
                log.warning("store: expiry pass stopped (%s); next one in %.0f s", exc, self._every)
            except Exception:  # a task that died here would end retention, unseen
                log.exception("store: expiry pass failed; next one in %.0f s", self._every)

    async def aclose(self) -> None:
        """Stop the task (a batch under way finishes on its thread, see `SqliteStore._run`)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
