"""Issue 11, item 12: a SQLite statement that fails after its caller timed out logs nothing."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import StoreError
from proxy.store.sqlite.store import SqliteStore
from tests.security.conftest import add_slow_table
from tests.store.test_contract import A, compaction, history


async def test_a_statement_failing_after_its_timeout_is_not_an_unretrieved_future(
    tmp_path: Path,
) -> None:
    path = tmp_path / "compactd.db"
    store = await SqliteStore.open(path, timeout_ms=50)
    con = sqlite3.connect(path, isolation_level=None)
    slow = add_slow_table(con)
    # ~0.3 s of work, then a failure: long after the 50 ms the caller waits.
    con.execute(
        "CREATE TRIGGER slow_fail BEFORE INSERT ON checkpoints"
        f" BEGIN {slow}; SELECT RAISE(ABORT, 'injected'); END"
    )
    con.close()
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        with pytest.raises(StoreError, match="within 50 ms"):
            await store.save_compaction(compaction(A, "c1", history(4), 2), 1000)
        for _ in range(200):  # a ping queued behind the slow statement answers once it failed
            try:
                await store.ping()
                break
            except StoreError:
                await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
        await store.close()
    assert [c["message"] for c in seen] == []
