"""Issue 11, item 12 (files): the data dir and the embedded store are private to their owner."""

from __future__ import annotations

import stat


async def test_the_data_dir_is_made_private_at_start(upstream, make_proxy, tmp_path) -> None:
    data = tmp_path / "shared-data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    async with make_proxy(upstream[1], server={"data_dir": str(data)}):
        pass

    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for file in data.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name
