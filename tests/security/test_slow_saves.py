"""Issue 32, row 5: under load a compaction's save took longer than the 200 ms every lookup gets,
and 6 % of compactions failed open. A save (and the lookup before it) has a deadline of its own (store.over_budget_timeout_ms)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.security.conftest import SMALL, add_slow_table, history

KEY = {"authorization": "Bearer sk-busy"}


def _slow_down_checkpoint_saves(file: Path) -> None:
    """Make every checkpoint insert cost ~0.3 s of SQLite CPU (past a 100 ms timeout)."""
    con = sqlite3.connect(file, isolation_level=None)
    try:
        slow = add_slow_table(con)
        con.execute(f"CREATE TRIGGER slow_save BEFORE INSERT ON checkpoints BEGIN {slow}; END")
    finally:
        con.close()


@pytest.mark.parametrize(
    ("over_budget_timeout_ms", "action"), [(30_000, "compacted"), (100, "error")]
)
async def test_a_slow_save_waits_for_its_own_deadline_not_the_lookups(
    upstream, make_proxy, tmp_path: Path, over_budget_timeout_ms: int, action: str
) -> None:
    _, base = upstream
    file = tmp_path / "store" / "compactd.db"
    store = {
        "url": f"sqlite:///{file}",
        "timeout_ms": 100,
        "over_budget_timeout_ms": over_budget_timeout_ms,
    }
    async with make_proxy(base, store=store, **SMALL) as url:
        async with httpx.AsyncClient(headers=KEY, timeout=60) as http:
            await http.get(f"{url}/readyz")  # the schema exists
            _slow_down_checkpoint_saves(file)
            r = await http.post(
                f"{url}/v1/chat/completions", json={"model": "gpt-4o", "messages": history(6)}
            )
    assert r.headers["x-compactd-action"] == action
    if action == "error":
        assert r.headers["x-compactd-error"] == "store"
