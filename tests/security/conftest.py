"""Fixtures for the attack suite: a store URL per backend (SQLite file, private redis-server)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.store.conftest import private_redis  # noqa: F401  (re-exported fixture)
from tests.store.redis_server import RedisServer


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each backend in turn: a fresh SQLite file, or a private redis-server of this test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'attack.db'}"
        return
    server = RedisServer(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def history(turns: int, tag: str = "") -> list[dict[str, Any]]:
    """A conversation well over a 600-token budget."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": f"You are helpful.{tag}"}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Turn {t}{tag}: " + "lorem ipsum dolor " * 25})
        msgs.append({"role": "assistant", "content": f"Answer {t}: " + "noted " * 40})
    msgs.append({"role": "user", "content": f"And now?{tag}"})
    return msgs


SMALL = {"default_policy": {"budget_tokens": 600}}


def add_slow_table(con: sqlite3.Connection) -> str:
    """Give a SQLite file a 3,000-row table; returns a statement costing ~0.3 s of CPU (for
    triggers, which cannot hold a WITH clause)."""
    con.execute("CREATE TABLE slow (x INTEGER)")
    con.execute(
        "WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c WHERE x < 2999)"
        " INSERT INTO slow SELECT x FROM c"
    )
    return "SELECT count(*) FROM slow a, slow b WHERE a.x + b.x >= 0"
