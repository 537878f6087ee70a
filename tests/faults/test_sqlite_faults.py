"""The embedded store's files turned read-only, and its disk filled, under load.

The open connections keep working for reads; writes fail, so compactions fail open (the
original is forwarded) until the files are writable or the disk has room again. No request gets
a 5xx of ours, every acknowledged compaction is restorable, nothing else is changed.

Each phase waits for events, not the clock: while the fault holds, fresh over-budget
conversations (probes) must each attempt a compaction write, so the fault is met whatever the
background load happened to be doing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.faults.conftest import Immutable
from tests.faults.driver import BUDGET, Load, check, echo, failed_open

DISK_PROBE_TURNS = 60
"""~43 KB of distinct originals per probe: the 16 MiB disk's last free pages (and the WAL's
reusable ones) are used up within a few hundred probes at the very most."""


async def test_store_files_turned_read_only_under_load_lose_nothing(
    upstream, make_proxy, tmp_path: Path
) -> None:
    fake, base = upstream
    fake.default = echo
    db = tmp_path / "store" / "compactd.db"
    async with make_proxy(base, store={"url": f"sqlite:///{db}"}, **BUDGET) as url:
        load = Load(url)
        async with load.running():
            await load.settled()
            files = [p for p in db.parent.iterdir() if not p.name.endswith("-shm")]
            with Immutable(*files):  # -shm is mapped: SQLite needs it writable to read at all
                failed_open(await load.probe())  # a write to an immutable file fails at once
                await load.more()
            await load.probe_until("compacted")
            await load.more()
        actions = await check(load)
    assert actions.get("compacted", 0) >= 1
    assert actions.get("replayed", 0) >= 1


async def test_a_full_disk_under_load_loses_nothing(upstream, make_proxy, small_disk: Path) -> None:
    fake, base = upstream
    fake.default = echo
    db = small_disk / "compactd.db"
    filler = small_disk / "filler"
    async with make_proxy(base, store={"url": f"sqlite:///{db}"}, **BUDGET) as url:
        load = Load(url)
        async with load.running():
            await load.settled()
            with filler.open("wb") as fh, contextlib.suppress(OSError):
                while True:  # until ENOSPC
                    fh.write(b"\0" * (1 << 20))
            # A write may still fit in pages SQLite already holds (a WAL it restarts from the
            # top); fresh compactions use them up, and then one must fail open.
            probes = await load.probe_until("error", attempts=500, turns=DISK_PROBE_TURNS)
            assert all(p.action in ("compacted", "error") for p in probes)
            failed_open(probes[-1])
            await load.more()
            filler.unlink()
            await load.probe_until("compacted")
            await load.more()
        actions = await check(load)
    assert actions.get("compacted", 0) >= 1
    assert actions.get("replayed", 0) >= 1
