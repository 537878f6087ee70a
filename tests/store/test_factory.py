"""open_store picks the backend from the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import StoreSettings
from proxy.store.factory import open_store, sqlite_path
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore


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
