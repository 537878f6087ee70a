"""Shared test fixtures. Area-specific helpers live in their own modules under tests/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from bench import locations

# CI runs every property and state-machine test on the same examples (no flaky seeds); a deeper,
# randomized run is `HYPOTHESIS_PROFILE=explore pytest`. Seeds that ever failed stay as @example.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev")
)


# No test may read the benchmark corpora (a bare clone with nothing beside it must pass). bench/
# finds them only where `$BENCH_CORPORA` says (there is no default), and the suite unsets it for
# itself and every subprocess a test starts, so every bench loader fails here. A read of any
# corpus folder by any other route, wherever it lies, fails too (an audit hook: open, listdir,
# scandir).
os.environ.pop(locations.ENV, None)
_READS = frozenset({"open", "os.listdir", "os.scandir"})


def corpus_read(event: str, args: tuple[object, ...]) -> str | None:
    """The path an audited event reads when it lies in a benchmark corpus folder, else None."""
    if event in _READS and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))  # type: ignore[arg-type]
        if not _FOLDERS.isdisjoint(Path(path).parts):
            return path
    return None


_FOLDERS = frozenset(locations.FOLDERS)


def _no_corpora_reads(event: str, args: tuple[object, ...]) -> None:
    path = corpus_read(event, args)
    if path is not None:
        raise PermissionError(f"a test read {path}: tests must not need the corpora")


sys.addaudithook(_no_corpora_reads)


@pytest.fixture(scope="session", autouse=True)
def _offline_tiktoken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test loads encodings from the packaged copy, never the network."""
    cache = tmp_path_factory.mktemp("tiktoken")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return cache


from collections.abc import AsyncIterator, Callable  # noqa: E402
from contextlib import AbstractAsyncContextManager  # noqa: E402
from typing import Any  # noqa: E402

from tests.upstream import FakeUpstream, serve  # noqa: E402


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FakeUpstream, str]]:
    """A scriptable fake upstream on a real socket: (recorder, base URL ending in /v1)."""
    fake = FakeUpstream()
    async with serve(fake) as url:
        yield fake, f"{url}/v1"


ProxyFactory = Callable[..., AbstractAsyncContextManager[str]]


@pytest.fixture
def make_proxy(tmp_path: Path) -> ProxyFactory:
    """Start compactd (real uvicorn, with compactd's own bounded HTTP protocol, as `compactd
    serve` runs it) in front of an upstream URL with config overrides."""
    from proxy.app.application import create_app
    from proxy.app.server import head_limits, protocol_options
    from proxy.config import load_settings
    from tests.inprocess import embedded_store

    def factory(upstream_url: str, **sections: Any) -> AbstractAsyncContextManager[str]:
        overrides: dict[str, Any] = {"upstream": {"url": upstream_url}, **sections}
        overrides["upstream"] = {"url": upstream_url, **sections.get("upstream", {})}
        server = dict(sections.get("server", {}))
        server.setdefault("data_dir", str(tmp_path / "data"))
        overrides["server"] = server
        overrides["store"] = embedded_store(sections.get("store", {}))
        settings = load_settings(None, env={}, overrides=overrides)
        options = protocol_options(head_limits(settings))
        return serve(create_app(settings), lifespan="on", **options)

    return factory
