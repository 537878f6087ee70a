"""The embedded store: SQLite in WAL mode, safe with several worker processes on one machine.

Statements run on dedicated threads, each owning one connection: a writer and a reader of the
store's file for requests, whose SQLite waits for a lock no longer than the store timeout; one
for the calls given the inspection timeout (restore, inspection, purge, learned windows), whose
SQLite waits as long (the background deletion of what has expired, `sqlite_expiry`, runs there
too, a short batch at a time); and one for the usage aggregates, which live in a file of their own
so that accounting never holds the lock a compaction write needs. The event loop never blocks on
disk, no connection is used from two threads, and a replay lookup never waits behind a
compaction's fsync (WAL readers do not block on the writer). A cancelled caller does not stop a
statement half-way: the thread finishes (or rolls back) the transaction.

The files hold verbatim originals: they are created 0600 (SQLite gives its -wal and -shm files
the database's mode) in a directory created 0700.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from proxy.errors import StoreError
from proxy.runtime.allocator import release_thread_cache
from proxy.store import codec, windows_ops
from proxy.store.base import (
    INSPECTION_TIMEOUT_SECONDS,
    ActivityDelta,
    Checkpoint,
    Compaction,
    ConversationInfo,
    Message,
    UsageDelta,
    UsageRecord,
    check_ids,
)
from proxy.store.decoded import DecodedCheckpoints
from proxy.store.sqlite import activity as sqlite_activity
from proxy.store.sqlite import expiry as sqlite_expiry
from proxy.store.sqlite import ops as sqlite_ops
from proxy.store.sqlite import usage as sqlite_usage

T = TypeVar("T")
_IDLE_S = 1.0
"""Seconds without a job after which a lane hands its thread's allocator cache back."""


class SqliteStore:
    """The Store protocol over one SQLite file."""

    def __init__(
        self,
        writer: _Lane,
        reader: _Lane,
        slow: _Lane,
        usage: _Lane,
        timeout: float,
        *,
        purge_every: float = sqlite_expiry.PURGE_EVERY_SECONDS,
    ) -> None:
        self._writer = writer
        self._reader = reader
        # Calls given the inspection timeout need a connection that waits as long for a lock:
        # on the writer's, an operator's purge gave up after the store timeout while another
        # worker was writing, and waiting there would hold up this worker's compactions.
        self._slow = slow
        self._usage = usage
        self._timeout = timeout
        self._over_budget_timeout = timeout
        self._decoded = DecodedCheckpoints()
        self._expiry = sqlite_expiry.Expiry(self._expire_batch, purge_every)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        timeout_ms: int = 200,
        over_budget_timeout_ms: int = 0,
        purge_every: float = sqlite_expiry.PURGE_EVERY_SECONDS,
    ) -> SqliteStore:
        """Open (creating the file, its directory and schema if needed) the database at `path`,
        and start deleting what has expired every `purge_every` seconds."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        side = sqlite_usage.usage_path(path)
        for file in (path, side):
            _private(file)
        # Another worker may hold the write lock a while at start-up; wait longer than a request.
        slow_ms = max(timeout_ms, 5000)
        inspect_ms = max(timeout_ms, round(INSPECTION_TIMEOUT_SECONDS * 1000))
        writer = await _Lane.open(path, slow_ms, timeout_ms, "w", sqlite_ops.connect)
        reader = await _Lane.open(path, timeout_ms, timeout_ms, "r", sqlite_ops.connect)
        slow = await _Lane.open(path, slow_ms, inspect_ms, "s", sqlite_ops.connect)
        adopt = partial(sqlite_usage.connect, main_path=str(path))
        usage = await _Lane.open(side, slow_ms, inspect_ms, "u", adopt)
        timeout = timeout_ms / 1000
        store = cls(writer, reader, slow, usage, timeout, purge_every=purge_every)
        store._over_budget_timeout = max(over_budget_timeout_ms / 1000, timeout)
        store._expiry.start()
        return store

    async def _run(
        self,
        fn: Callable[..., T],
        *args: Any,
        write: bool = True,
        slow: bool = False,
        lane: _Lane | None = None,
        over_budget: bool = False,
    ) -> T:
        """Run `fn(connection, *args)` on the writer's, reader's (or `lane`'s) thread, within
        the timeout (`slow`: the inspection timeout, on the lane whose locks wait as long;
        `over_budget`: a request over its trigger's lookup or save, within
        over_budget_timeout_ms)."""
        timeout = max(self._timeout, INSPECTION_TIMEOUT_SECONDS) if slow else self._timeout
        if over_budget:
            timeout = self._over_budget_timeout
        lane = lane or (self._slow if slow else self._writer if write else self._reader)
        future = lane.call(fn, lane.con, *args)
        # A caller that timed out no longer awaits the statement: retrieve its outcome here, so
        # a late failure is not logged as "Future exception was never retrieved".
        future.add_done_callback(_retrieve)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError as exc:
            raise StoreError(f"sqlite did not answer within {timeout * 1000:.0f} ms") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc}") from exc

    async def find_checkpoint(
        self, tenant: str, conversation: str, prefix_digests: list[str]
    ) -> Checkpoint | None:
        """Longest matching checkpoint (one thread hop); refreshes retention when found."""
        check_ids(tenant, conversation)
        if not prefix_digests:
            return None
        find = partial(sqlite_ops.find_checkpoint, held=self._decoded.get)
        found, refresh_to = await self._run(
            find,
            tenant,
            conversation,
            prefix_digests,
            self._decoded.load,
            write=False,
            over_budget=True,  # only requests over their trigger look
        )
        if refresh_to:
            await self._run(sqlite_ops.refresh, tenant, conversation, refresh_to, over_budget=True)
        return found

    async def save_compaction(self, compaction: Compaction, ttl_seconds: int) -> Checkpoint:
        """One BEGIN IMMEDIATE transaction; first writer of a source digest wins."""
        check_ids(compaction.checkpoint.tenant, compaction.checkpoint.conversation)
        return await self._run(
            sqlite_ops.save_compaction,
            compaction,
            ttl_seconds,
            self._decoded.load,
            over_budget=True,
        )

    async def save_originals(
        self,
        tenant: str,
        conversation: str,
        originals: Mapping[str, Message],
        refs: Mapping[str, list[str]],
        ttl_seconds: int,
    ) -> None:
        """One BEGIN IMMEDIATE transaction: the conversation row, originals and refs."""
        check_ids(tenant, conversation)
        save = partial(sqlite_ops.save_originals, originals=originals, refs=refs, ttl=ttl_seconds)
        await self._run(save, tenant, conversation, over_budget=True)

    async def resolve_refs(self, tenant: str, ref_ids: list[str]) -> dict[str, list[Message]]:
        """Reference id -> original messages, for the ids this tenant owns."""
        if not ref_ids:
            return {}
        return await self._run(sqlite_ops.resolve_refs, tenant, ref_ids, slow=True)

    async def ref_conversations(self, tenant: str, ref_ids: list[str]) -> dict[str, list[str]]:
        """Reference id -> the live conversations of this tenant that store it."""
        if not ref_ids:
            return {}
        return await self._run(sqlite_ops.ref_conversations, tenant, ref_ids, slow=True)

    async def get_conversation(
        self, tenant: str | None, conversation: str
    ) -> ConversationInfo | None:
        """Everything stored for one conversation (admin: the most recently used of that id)."""
        check_ids(tenant, conversation)
        return await self._run(sqlite_ops.get_conversation, tenant, conversation, slow=True)

    async def list_conversations(self, tenant: str | None) -> list[ConversationInfo]:
        """Conversations with sizes and counts, most recently used first (no originals)."""
        return await self._run(sqlite_ops.list_conversations, tenant, slow=True)

    async def purge(self, tenant: str | None, conversation: str) -> bool:
        """Delete the conversation (admin: every tenant's conversation of that id)."""
        check_ids(tenant, conversation)

        def op(con: sqlite3.Connection) -> bool:
            owners = con.execute(
                "SELECT tenant FROM conversations"
                " WHERE conversation = ? AND (tenant = ? OR ? IS NULL)",
                (conversation, tenant, tenant),
            ).fetchall()
            for (t,) in owners:
                sqlite_ops.delete_summaries(con, t, conversation)
            gone = [sqlite_ops.delete_conversation(con, t, conversation) for (t,) in owners]
            return any(gone)

        gone = await self._run(lambda con: sqlite_ops.run_write(con, partial(op, con)), slow=True)
        await self._run(sqlite_activity.purge, tenant, conversation, slow=True, lane=self._usage)
        return gone

    async def purge_expired(self) -> int:
        """One pass of the background deletion, now: rows whose retention has passed."""
        return await self._expiry.run_pass()

    async def _expire_batch(self, now: float) -> int:
        # On the lane of the calls that may wait long: a restore waits at most one batch.
        return await self._run(sqlite_expiry.delete_batch, now, slow=True)

    async def get_summary(self, tenant: str, digest: str) -> str | None:
        """A cached summary by source digest."""

        def op(con: sqlite3.Connection) -> bytes | None:
            row = con.execute(
                "SELECT body FROM summaries WHERE tenant = ? AND digest = ? AND expires_at > ?",
                (tenant, digest, time.time()),
            ).fetchone()
            return None if row is None else bytes(row[0])

        raw = await self._run(op, write=False)
        return None if raw is None else codec.load_summary(raw, tenant, digest)

    async def put_summary(self, tenant: str, digest: str, summary: str, ttl_seconds: int) -> None:
        """Cache a summary, expiring after `ttl_seconds`."""
        row = (
            tenant,
            digest,
            codec.dump_summary(tenant, digest, summary),
            time.time() + ttl_seconds,
        )

        def op(con: sqlite3.Connection) -> None:
            con.execute("INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?)", row)

        await self._run(lambda con: sqlite_ops.run_write(con, partial(op, con)))

    async def record_usage(self, record: UsageRecord) -> None:
        """Add one request to its (tenant, policy, model, day) aggregate."""
        await self.add_usage([codec.usage_delta(record)])

    async def add_usage(self, deltas: Sequence[UsageDelta]) -> None:
        """One transaction in the usage file, on its own thread (never the writer's)."""
        if deltas:
            await self._run(sqlite_usage.add_usage, deltas, slow=True, lane=self._usage)

    async def usage(self, tenant: str | None, since_day: str) -> list[dict[str, Any]]:
        """Aggregates per (tenant, policy, model, day) from `since_day` on."""
        return await self._run(sqlite_usage.usage, tenant, since_day, slow=True, lane=self._usage)

    async def add_activity(self, deltas: Sequence[ActivityDelta], ttl_seconds: int) -> None:
        """One transaction in the usage file, on its own thread (never the writer's)."""
        if deltas:
            await self._run(
                sqlite_activity.add, deltas, float(ttl_seconds), slow=True, lane=self._usage
            )

    async def activity(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        """The most recently active conversations, newest first."""
        return await self._run(sqlite_activity.recent, tenant, limit, slow=True, lane=self._usage)

    async def put_window(self, scope: str, model: str, window: int, ttl_seconds: int) -> None:
        """Record a learned context window (rare: only after a validated overflow)."""
        await self._run(windows_ops.sqlite_put, scope, model, window, ttl_seconds, slow=True)

    async def windows(self, scope: str) -> dict[str, int]:
        """Every live learned window of an upstream."""
        return await self._run(windows_ops.sqlite_windows, scope, slow=True)

    async def put_calibration(self, api: str, model: str, ratio: float, ttl_seconds: int) -> None:
        """Record a calibration ratio (next to the learned windows, see `windows_ops`)."""
        value = round(ratio * windows_ops.CALIBRATION_SCALE)
        scope = windows_ops.calibration_scope(api)
        await self._run(windows_ops.sqlite_put, scope, model, value, ttl_seconds, slow=True)

    async def calibrations(self, api: str) -> dict[str, float]:
        """Every live calibration ratio of an API."""
        scope = windows_ops.calibration_scope(api)
        found = await self._run(windows_ops.sqlite_windows, scope, slow=True)
        return {m: v / windows_ops.CALIBRATION_SCALE for m, v in found.items()}

    async def ping(self) -> None:
        """Raise StoreError unless the database answers."""
        await self._run(lambda con: con.execute("SELECT 1").fetchone())

    async def check_config(self) -> list[str]:
        """Warn if WAL could not be enabled (e.g. a network filesystem)."""
        (mode,) = await self._run(lambda con: con.execute("PRAGMA journal_mode").fetchone())
        if str(mode).lower() != "wal":
            return [f"sqlite journal_mode is {mode}, not wal: workers will block each other"]
        return []

    async def close(self) -> None:
        """Stop the background deletion, close each connection on its own thread, then stop
        the threads."""
        await self._expiry.aclose()
        for lane in (self._usage, self._slow, self._reader, self._writer):
            await lane.close()


class _Lane:
    """One thread and the connection only it uses. Calls are handed over on a queue and come
    back with one `call_soon_threadsafe` (an executor's futures, locks and callback chain cost
    a replay lookup about a third more)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # A daemon: a process that exits without closing the store leaves SQLite to roll back
        # (WAL) rather than wait for this thread.
        self._thread = threading.Thread(target=self._serve, name=f"compactd-sqlite-{name}")
        self._thread.daemon = True
        self._thread.start()
        self._con: sqlite3.Connection | None = None

    @property
    def con(self) -> sqlite3.Connection:
        """The lane's connection (to be used on its thread only, through `call`)."""
        assert self._con is not None
        return self._con

    @classmethod
    async def open(
        cls,
        path: Path,
        open_busy_ms: int,
        busy_ms: int,
        name: str,
        connect: Callable[[str, int], sqlite3.Connection],
    ) -> _Lane:
        lane = cls(name)
        try:
            lane._con = await lane.call(connect, str(path), open_busy_ms)
            await lane.call(lane.con.execute, f"PRAGMA busy_timeout = {busy_ms}")
        except sqlite3.Error as exc:
            lane._jobs.put(None)
            raise StoreError(f"sqlite {path}: {exc}") from exc
        return lane

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` run on the lane's thread, as a future of the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001  # handed to the caller, as an executor does
                _hand_back(loop, future, None, exc)
            else:
                _hand_back(loop, future, result, None)

        self._jobs.put(job)
        return future

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=_IDLE_S)
            except queue.Empty:
                release_thread_cache()  # idle: its cached heap blocks can go back to the system
                job = self._jobs.get()
            if job is None:
                return
            job()

    async def close(self) -> None:
        await self.call(self.con.close)
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    exc: BaseException | None,
) -> None:
    """Settle `future` on its loop with what a lane's job returned or raised."""

    def settle() -> None:
        if future.done():  # cancelled meanwhile
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop closed before the job ended
        loop.call_soon_threadsafe(settle)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _private(path: Path) -> None:
    """Create `path` 0600 if it is absent; tighten it (and its -wal/-shm) if it is not."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)
