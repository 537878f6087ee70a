"""Issue 11, item 12 (files): the data dir and the embedded store are private to their owner."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.conftest import SMALL, history


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """The umask of a careless service unit: files 0644 and directories 0755 unless we say."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


async def test_the_data_dir_is_made_private_at_start(upstream, make_proxy, tmp_path) -> None:
    data = tmp_path / "shared-data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    async with make_proxy(upstream[1], server={"data_dir": str(data)}):
        pass

    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for file in data.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name


@pytest.mark.usefixtures("permissive_umask")
async def test_every_store_file_is_private_while_it_is_in_use(
    upstream, make_proxy, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    store = {"url": f"sqlite:///{directory / 'compactd.db'}"}
    async with make_proxy(upstream[1], store=store, **SMALL) as url, httpx.AsyncClient() as http:
        body = {"model": "gpt-4o", "messages": history(6)}
        r = await http.post(
            f"{url}/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-files"}
        )
        await http.get(f"{url}/compactd/v1/conversations", headers={"authorization": "Bearer x"})
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    assert r.headers["x-compactd-action"] == "compacted"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {"compactd.db", "compactd.db-wal", "compactd.db-shm"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o600)  # the WAL and shared memory too (originals)
