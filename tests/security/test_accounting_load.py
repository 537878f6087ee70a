"""Issue 11, item 2: accounting can be slow or down without delaying a single compaction."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx
import orjson

from tests.security.conftest import SMALL, add_slow_table, history

KEY = {"authorization": "Bearer sk-busy"}
SMALL_CHAT = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})


def _slow_down_usage_inserts(directory: Path) -> list[str]:
    """Make every usage insert cost ~0.25 s of SQLite CPU, in whichever file holds the table."""
    slowed = []
    for file in sorted(directory.glob("*.db")):
        con = sqlite3.connect(file, isolation_level=None)
        try:
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'usage'").fetchone():
                slow = add_slow_table(con)
                con.execute(
                    "CREATE TRIGGER slow_usage BEFORE INSERT ON usage"
                    f" WHEN NEW.counter = 'requests' BEGIN {slow}; END"
                )
                slowed.append(file.name)
        finally:
            con.close()
    return slowed


async def test_a_slow_usage_write_never_delays_a_compaction(
    upstream, make_proxy, tmp_path: Path
) -> None:
    _, base = upstream
    store = {"url": f"sqlite:///{tmp_path / 'store' / 'compactd.db'}"}
    async with make_proxy(base, store=store, **SMALL) as url:
        assert _slow_down_usage_inserts(tmp_path / "store")
        async with httpx.AsyncClient(headers=KEY) as http:
            for _ in range(20):  # accounting work that, queued on the store's writer, takes ~5 s
                await http.post(f"{url}/v1/chat/completions", content=SMALL_CHAT)
            await asyncio.sleep(1.2)  # a usage flush is running now
            big = {"model": "gpt-4o", "messages": history(6)}
            r = await http.post(f"{url}/v1/chat/completions", json=big)
            metrics = (await http.get(f"{url}/metrics")).text
    assert r.headers["x-compactd-action"] == "compacted"
    assert "x-compactd-error" not in r.headers
    assert 'compactd_fail_open_total{reason="accounting"}' not in metrics
