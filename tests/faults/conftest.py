"""Fault-suite fixtures: the private redis-server of tests/store (AOF, appendfsync always)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.conftest import private_redis  # noqa: F401  (re-exported fixture)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 16 MiB tmpfs of its own, so a test can fill the disk (needs root: a
    mount; without it the test is skipped, saying so)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("full-disk test: no mount(8) on this machine")
    done = _run("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount))
    if done.returncode != 0:
        pytest.skip(f"full-disk test needs a private tmpfs (root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        _run("umount", "-l", str(mount))


class Immutable:
    """Files made unwritable while open (chattr +i: writes to open descriptors fail too)."""

    def __init__(self, *paths: Path) -> None:
        self.paths = [str(p) for p in paths]

    def __enter__(self) -> Immutable:
        done = _run("chattr", "+i", *self.paths)
        if done.returncode != 0:
            _run("chattr", "-i", *self.paths)
            pytest.skip(f"read-only test needs chattr +i (root, ext*/xfs): {done.stderr.strip()}")
        return self

    def __exit__(self, *exc: object) -> None:
        _run("chattr", "-i", *self.paths)
