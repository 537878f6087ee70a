"""The start-up check of Redis settings that risk losing stored originals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from proxy.store.redis.store import RedisStore
from tests.store.redis_server import RedisServer, free_port


async def warnings_of(tmp_path: Path, *, appendonly: bool, extra: tuple[str, ...]) -> list[str]:
    server = RedisServer(tmp_path, appendonly=appendonly, extra=extra)
    server.start()
    try:
        store = await RedisStore.open(server.url, timeout_ms=2000)
        try:
            return await store.check_config()
        finally:
            await store.close()
    finally:
        server.stop(signal.SIGKILL)


async def test_a_durable_noeviction_redis_gets_no_warning(tmp_path: Path) -> None:
    assert await warnings_of(tmp_path, appendonly=True, extra=()) == []


async def test_no_persistence_and_an_evicting_policy_are_both_warned_about(
    tmp_path: Path,
) -> None:
    found = await warnings_of(
        tmp_path, appendonly=False, extra=("--maxmemory-policy", "allkeys-lru")
    )

    assert len(found) == 2
    assert "no persistence" in found[0]
    assert "allkeys-lru" in found[1]


async def test_a_redis_with_config_disabled_is_still_checked_through_info(
    tmp_path: Path,
) -> None:
    found = await warnings_of(
        tmp_path,
        appendonly=False,
        extra=("--rename-command", "CONFIG", "", "--maxmemory-policy", "volatile-lru"),
    )

    assert any("CONFIG is disabled" in w for w in found)
    assert any("without AOF" in w for w in found)
    assert any("volatile-lru" in w for w in found)


def test_redis_tests_fail_instead_of_skipping_under_ci_when_redis_is_unreachable() -> None:
    env = {**os.environ, "CI": "true"}
    env["COMPACTD_TEST_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    test = "tests/store/test_factory.py::test_a_redis_url_opens_redis"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[3],
        check=False,
    )

    assert result.returncode == 1, result.stdout
    assert "unreachable" in result.stdout
    assert "skipped" not in result.stdout
