"""Opens the store the settings name: Redis (one server or a cluster) for a redis URL, else the
embedded SQLite file."""

from __future__ import annotations

from pathlib import Path

from proxy.config import StoreSettings
from proxy.store.base import Store

DEFAULT_SQLITE_FILE = "compactd.db"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")


def sqlite_path(url: str, data_dir: Path) -> Path:
    """`sqlite:///abs/path` -> that file; a relative path is under data_dir; empty -> default."""
    rest = url.removeprefix("sqlite://")
    if rest in ("", "/"):
        return data_dir / DEFAULT_SQLITE_FILE
    path = Path(rest).expanduser()
    return path if path.is_absolute() else data_dir / path


async def open_store(settings: StoreSettings, data_dir: Path) -> Store:
    """The configured store, opened (pool created; schema ready)."""
    url = settings.url
    if url.startswith(REDIS_SCHEMES):
        # Imported here: redis-py costs a worker ~6 MB that an embedded-store worker never uses.
        from proxy.store.redis.store import RedisStore  # noqa: PLC0415

        return await RedisStore.open(
            url,
            timeout_ms=settings.timeout_ms,
            over_budget_timeout_ms=settings.over_budget_timeout_ms,
            pool_size=settings.pool_size,
            min_replicas_ack=settings.min_replicas_ack,
        )
    if url and not url.startswith("sqlite://"):
        raise ValueError(f"store.url: unsupported scheme in {url!r}")
    # Imported here too: sqlite3 and its library (~1 MB) are a Redis-backed worker's dead weight.
    from proxy.store.sqlite.store import SqliteStore  # noqa: PLC0415

    return await SqliteStore.open(
        sqlite_path(url, data_dir),
        timeout_ms=settings.timeout_ms,
        over_budget_timeout_ms=settings.over_budget_timeout_ms,
    )
