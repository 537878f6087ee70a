"""The embedded store's files turned read-only, and its disk filled, under load.

The open connections keep working for reads; writes fail, so compactions fail open (the
original is forwarded) until the files are writable or the disk has room again. No request gets
a 5xx of ours, every acknowledged compaction is restorable, nothing else is changed.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from tests.faults.conftest import Immutable
from tests.faults.driver import BUDGET, Load, check, echo, sleep_until


async def test_store_files_turned_read_only_under_load_lose_nothing(
    upstream, make_proxy, tmp_path: Path
) -> None:
    fake, base = upstream
    fake.default = echo
    db = tmp_path / "store" / "compactd.db"
    async with make_proxy(base, store={"url": f"sqlite:///{db}"}, **BUDGET) as url:
        load = Load(url)

        async def faults() -> None:
            start = time.monotonic()
            await sleep_until(start + 1.5)
            files = [p for p in db.parent.iterdir() if not p.name.endswith("-shm")]
            with Immutable(*files):  # -shm is mapped: SQLite needs it writable to read at all
                await sleep_until(start + 3.5)
            await sleep_until(start + 5.0)

        await load.run(faults)
        actions = await check(load)
    assert actions.get("error", 0) >= 1
    assert actions.get("compacted", 0) >= 1
    assert actions.get("replayed", 0) >= 1


async def test_a_full_disk_under_load_loses_nothing(upstream, make_proxy, small_disk: Path) -> None:
    fake, base = upstream
    fake.default = echo
    db = small_disk / "compactd.db"
    filler = small_disk / "filler"
    async with make_proxy(base, store={"url": f"sqlite:///{db}"}, **BUDGET) as url:
        load = Load(url)

        async def faults() -> None:
            start = time.monotonic()
            await sleep_until(start + 1.5)
            with filler.open("wb") as fh, contextlib.suppress(OSError):
                while True:  # until ENOSPC
                    fh.write(b"\0" * (1 << 20))
            await sleep_until(start + 3.5)
            filler.unlink()
            await sleep_until(start + 5.0)

        await load.run(faults)
        actions = await check(load)
    assert actions.get("error", 0) >= 1
    assert actions.get("compacted", 0) >= 1
