"""open_store picks the backend from the URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config import StoreSettings
from proxy.store.factory import open_store, sqlite_path
from proxy.store.redis.store import RedisStore
from proxy.store.sqlite.store import SqliteStore
from tests.live.test_lean_workers import WORKER


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", "/data/compactd.db"),
        ("sqlite://", "/data/compactd.db"),
        ("sqlite:///", "/data/compactd.db"),
        ("sqlite:///var/lib/c.db", "/var/lib/c.db"),
        ("sqlite://rel/c.db", "/data/rel/c.db"),
    ],
)
def test_sqlite_urls_name_a_file(url: str, expected: str) -> None:
    assert sqlite_path(url, Path("/data")) == Path(expected)


async def test_an_empty_url_opens_the_embedded_sqlite_file(tmp_path: Path) -> None:
    store = await open_store(StoreSettings(), tmp_path)

    assert isinstance(store, SqliteStore)
    await store.close()
    assert (tmp_path / "compactd.db").exists()


async def test_a_redis_url_opens_redis(machine_redis_url: str, tmp_path: Path) -> None:
    store = await open_store(StoreSettings(url=machine_redis_url), tmp_path)

    assert isinstance(store, RedisStore)
    await store.ping()
    await store.close()


def test_a_redis_backed_worker_never_imports_sqlite(machine_redis_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env |= {"COMPACTD_DATA_DIR": str(tmp_path), "COMPACTD_SECRET": "lean"}
    env["COMPACTD_STORE_URL"] = machine_redis_url
    out = subprocess.run(
        [sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, check=True
    )
    loaded = set(out.stdout.strip().split(","))

    assert {"proxy", "tiktoken", "redis"} <= loaded  # the worker did start, on Redis
    assert "sqlite3" not in loaded  # its module and library: ~1-2 MB a Redis worker never uses
