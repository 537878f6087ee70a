"""Lean workers: encodings load when first needed and keep one copy of their ranks; `serve`
runs its workers on jemalloc when it is installed; code only some requests need is imported
when one first comes."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tiktoken
import tiktoken_ext.openai_public as public

from proxy.errors import AllocatorError
from proxy.runtime.allocator import MALLOC_CONF, jemalloc_library, preload_environment
from proxy.tokens.budget import ModelTable
from proxy.tokens.counter import Tokenizers
from proxy.tokens.encodings import load_encoding
from tests.instances import instances
from tests.live.test_websocket import EchoUpstream
from tests.upstream import serve

TEXTS = ["hello world", "def f(x):\n    return x ** 2\n", "naïve café — 😀 " * 50, " " * 300]


def test_only_the_preloaded_encoding_is_held_until_a_model_needs_another() -> None:
    tokenizers = Tokenizers(cache_size=10)
    table = ModelTable.load(None)
    before = tokenizers.loaded
    tokenizers.for_model(table.lookup("gpt-4o"))
    after_gpt4o = tokenizers.loaded
    counter = tokenizers.for_model(table.lookup("gpt-4"))

    assert before == ("o200k_base",)
    assert after_gpt4o == ("o200k_base",)
    assert tokenizers.loaded == ("o200k_base", "cl100k_base")
    assert counter.encoding_name == "cl100k_base"


def test_threads_seeing_a_new_encoding_at_once_share_one_counter() -> None:
    tokenizers = Tokenizers(cache_size=10, preload=())
    got: list[object] = []
    threads = [
        threading.Thread(target=lambda: got.append(tokenizers.counter("cl100k_base")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len({id(c) for c in got}) == 1


def test_a_trimmed_encoding_encodes_exactly_as_tiktoken_built_afresh() -> None:
    for name, make in (("o200k_base", public.o200k_base), ("cl100k_base", public.cl100k_base)):
        trimmed = load_encoding(name)
        fresh = tiktoken.Encoding(**make())  # the Python ranks kept, as tiktoken ships it

        assert trimmed._mergeable_ranks == {}  # the duplicate copy is gone
        for text in TEXTS:
            assert trimmed.encode_ordinary(text) == fresh.encode_ordinary(text)
            assert trimmed.encode(text, disallowed_special=()) == fresh.encode(
                text, disallowed_special=()
            )


WORKER = """
import asyncio, sys
from proxy.app.application import create_app
from proxy.config import load_settings

async def main():
    app = create_app(load_settings(None))
    async with app.router.router.lifespan_context(app.router):
        print(",".join(sorted({m.split(".")[0] for m in sys.modules})))

asyncio.run(main())
"""


def test_an_embedded_store_worker_never_imports_redis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env |= {"COMPACTD_DATA_DIR": str(tmp_path), "COMPACTD_SECRET": "lean"}
    out = subprocess.run(
        [sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, check=True
    )
    loaded = set(out.stdout.strip().split(","))

    assert {"proxy", "tiktoken", "sqlite3"} <= loaded  # the worker did start
    assert not loaded & {"redis", "hiredis"}  # ~6 MB a SQLite-backed worker never uses


def _mapped(pid: int, name: str) -> bool:
    return name in Path(f"/proc/{pid}/maps").read_text()


def _need_jemalloc() -> None:
    if jemalloc_library() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("libjemalloc.so.2 is missing (.ci/run installs libjemalloc2)")
        pytest.skip("libjemalloc.so.2 not installed (apt-get install libjemalloc2)")


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_serve_runs_itself_and_its_workers_on_jemalloc(tmp_path: Path, workers: str) -> None:
    _need_jemalloc()
    env = {"COMPACTD_SECRET": "lean", "COMPACTD_SERVER_ALLOCATOR": "auto"}
    async with instances(tmp_path, [env], "--workers", workers) as (server,):
        pids = server.worker_pids()  # uvicorn's supervisor, its workers, multiprocessing's helpers
        spawned = [p for p in pids[1:] if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]

        assert len(spawned) == (int(workers) if int(workers) > 1 else 0)
        assert all(_mapped(pid, "libjemalloc") for pid in pids)
        if importlib.util.find_spec("watchfiles") is None:  # an older venv may still hold it
            assert not any(_mapped(pid, "_rust_notify") for pid in pids)  # watchfiles' module
        assert server.proc is not None
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:5] == [b"-m", b"proxy", b"serve", b"--port"]  # the same command


async def test_the_system_allocator_is_kept_when_configured(tmp_path: Path) -> None:
    env = {"COMPACTD_SECRET": "lean", "COMPACTD_SERVER_ALLOCATOR": "system"}
    async with instances(tmp_path, [env]) as (server,):
        assert not any(_mapped(pid, "libjemalloc") for pid in server.worker_pids())


def test_a_preload_the_loader_refused_is_not_tried_again() -> None:
    _need_jemalloc()
    library = jemalloc_library()
    fresh = preload_environment("auto", {"PATH": "/bin", "LD_PRELOAD": "libfoo.so"})
    again = preload_environment("auto", {"LD_PRELOAD": f"libfoo.so {library}"})
    own_conf = preload_environment("jemalloc", {"MALLOC_CONF": "narenas:2"})

    assert fresh is not None
    assert fresh["LD_PRELOAD"] == f"libfoo.so {library}"
    assert fresh["MALLOC_CONF"] == MALLOC_CONF
    assert again is None  # running without it: starting once more would loop
    assert own_conf is not None
    assert own_conf["MALLOC_CONF"] == "narenas:2"  # the operator's settings win
    assert preload_environment("system", {}) is None


def test_the_restart_drops_code_column_positions_unless_the_environment_keeps_them() -> None:
    _need_jemalloc()
    env = preload_environment("auto", {"PATH": "/bin"})
    kept = preload_environment("auto", {"PYTHONNODEBUGRANGES": ""})  # empty: Python keeps them
    assert env is not None
    assert kept is not None
    probe = "import json; print(next(json.dumps.__code__.co_positions())[2])"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )

    assert env["PYTHONNODEBUGRANGES"] == "1"
    assert out.stdout.strip() == "None"  # no column offsets: ~1 MB less per worker
    assert kept["PYTHONNODEBUGRANGES"] == ""


MALLCTL = """
import ctypes
libc = ctypes.CDLL(None)
for name, kind in ((b"opt.dirty_decay_ms", ctypes.c_ssize_t), (b"opt.muzzy_decay_ms", ctypes.c_ssize_t),
                   (b"opt.background_thread", ctypes.c_bool), (b"opt.narenas", ctypes.c_uint)):
    value, size = kind(), ctypes.c_size_t(ctypes.sizeof(kind))
    assert libc.mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) == 0, name
    print(name.decode(), int(value.value))
"""


def _on_default_jemalloc(program: str) -> subprocess.CompletedProcess[str]:
    """`program` run by a Python started as `serve` restarts itself (the default settings)."""
    _need_jemalloc()
    env = preload_environment("auto", {k: v for k, v in os.environ.items() if k != "MALLOC_CONF"})
    assert env is not None
    return subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
    )


def test_jemalloc_takes_every_setting_of_the_default_configuration() -> None:
    # jemalloc ignores a setting it does not know with a warning on stderr, nothing else.
    out = _on_default_jemalloc(MALLCTL)

    assert "<jemalloc>" not in out.stderr
    assert out.stdout.split("\n")[:4] == [
        "opt.dirty_decay_ms 1000",
        "opt.muzzy_decay_ms 0",
        "opt.background_thread 1",
        "opt.narenas 1",
    ]


def test_jemalloc_chosen_but_missing_stops_serve_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("proxy.runtime.allocator.jemalloc_library", lambda: None)
    monkeypatch.setattr("proxy.runtime.allocator.running_jemalloc", lambda: False)

    with pytest.raises(AllocatorError, match="jemalloc was chosen but is not installed"):
        preload_environment("jemalloc", {})
    assert preload_environment("auto", {}) is None  # auto: the system allocator


def test_freed_memory_is_handed_back_after_each_encoding_load_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = tiktoken.get_encoding

    def get_encoding(name: str) -> tiktoken.Encoding:
        calls.append(f"load {name}")
        return real(name)

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # built afresh, not cached
    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    monkeypatch.setattr(
        "proxy.tokens.encodings.release_freed_memory", lambda: calls.append("release")
    )
    for name in ("o200k_base", "cl100k_base", "o200k_base"):
        load_encoding(name)

    # The third is tiktoken's cached encoding: nothing was freed, the heap is not walked again
    # (malloc_trim of a large heap stalls every thread that allocates meanwhile).
    assert calls == ["load o200k_base", "release", "load cl100k_base", "release", "load o200k_base"]


def _closure(name: str, seen: set[str]) -> set[str]:
    """`name` and every distribution it requires when installed without extras."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return seen
    seen.add(key)
    with contextlib.suppress(metadata.PackageNotFoundError):
        for requirement in metadata.requires(name) or []:
            spec, _, marker = requirement.partition(";")
            if "extra" not in marker:
                match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
                assert match is not None
                _closure(match.group(0), seen)
    return seen


def test_an_installed_compactd_brings_no_file_watcher_into_its_workers() -> None:
    # uvicorn imports watchfiles (~1.8 MB per worker) whenever it is installed, for --reload.
    installed = _closure("compactd", set())

    assert {"uvicorn", "httptools", "uvloop", "websockets"} <= installed
    assert not installed & {"watchfiles", "python-dotenv"}


async def test_an_idle_worker_imports_websockets_only_when_a_session_is_relayed(
    tmp_path: Path,
) -> None:
    # websockets' C extension is mapped once the package is imported (~2.5 MB per worker).
    upstream = EchoUpstream()
    async with serve(upstream) as base:
        env = {"COMPACTD_SECRET": "lean", "COMPACTD_UPSTREAM_URL": f"{base}/v1"}
        async with instances(tmp_path, [env]) as (server,), aiohttp.ClientSession() as http:
            before = _mapped(server.worker_pids()[0], "websockets/speedups")
            url = server.url.replace("http://", "ws://") + "/v1/responses?model=gpt-5"
            async with http.ws_connect(url) as ws:
                created = (await ws.receive()).data
                await ws.send_str("ping")
                echo = (await ws.receive()).data
            after = _mapped(server.worker_pids()[0], "websockets/speedups")

    assert not before
    assert created == '{"type":"session.created"}'
    assert echo == "ping"
    assert upstream.frames[0] == "ping"
    assert after  # the real implementation served the upgrade


async def test_the_upstream_transport_reads_no_ca_bundle_of_its_own_and_still_verifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ssl

    from proxy.app.application import build_transport
    from proxy.config import load_settings
    from proxy.wire.stale_retry import StaleRetry

    loads: list[str] = []

    def recording(name: str) -> Any:
        real = getattr(ssl.SSLContext, name)

        def record(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> Any:
            loads.append(name)
            return real(self, *args, **kwargs)

        return record

    for name in ("load_verify_locations", "set_default_verify_paths", "load_default_certs"):
        monkeypatch.setattr(ssl.SSLContext, name, recording(name))
    retrying = build_transport(load_settings(None))
    assert isinstance(retrying, StaleRetry)
    # The pool's transport and the retries' (built on the first retry, here at once).
    for transport in (retrying.pooled, retrying.fresh):
        session = transport.get_client()  # type: ignore[attr-defined]
        used = session.connector._ssl
        await session.close()

        assert loads == []  # ~0.7 MB per worker: httpx_aiohttp would load certifi's bundle here
        assert used is True  # the connector verifies with aiohttp's default context
        context = transport.ssl_context  # type: ignore[attr-defined]
        assert context is aiohttp.connector._SSL_CONTEXT_VERIFIED
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname


JEMALLOC_STAT = """
import ctypes
libc = ctypes.CDLL(None)

def stat(name):
    epoch = ctypes.c_uint64(1)
    libc.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(8))
    value, size = ctypes.c_size_t(), ctypes.c_size_t(8)
    libc.mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0)
    return value.value
"""
"""A program's opening: `stat(name)` reads one of jemalloc's size_t statistics, fresh."""

TCACHE = (
    JEMALLOC_STAT
    + """
from proxy.runtime.allocator import release_thread_cache

def cached():
    return stat(b"stats.arenas.4096.tcache_bytes")

blocks = [bytes(600 + i % 900) for i in range(2000)]  # above pymalloc's 512: jemalloc's
del blocks
before = cached()
release_thread_cache()
print(before, cached())
"""
)


def test_a_thread_hands_its_allocator_cache_back() -> None:
    out = _on_default_jemalloc(TCACHE)
    before, after = (int(x) for x in out.stdout.split())

    assert before > 0  # freed blocks kept for this thread's next allocations
    assert after < before


def test_aiohttp_s_context_for_unverified_requests_holds_no_ca_store_and_verifies_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ssl

    from proxy.app.application import build_transport
    from proxy.config import load_settings

    connector = aiohttp.connector
    built = connector._make_ssl_context(False)  # as aiohttp builds it at import
    monkeypatch.setattr(connector, "_SSL_CONTEXT_UNVERIFIED", built)  # put back afterwards
    build_transport(load_settings(None))
    light = connector._SSL_CONTEXT_UNVERIFIED

    assert built.cert_store_stats()["x509"] > 0  # the system CA store, read for nothing
    assert light is not built
    assert light.cert_store_stats()["x509"] == 0  # ~0.7 MB per worker
    assert light.verify_mode == built.verify_mode == ssl.CERT_NONE
    assert light.check_hostname is built.check_hostname is False
    assert light.options == built.options
    assert light.protocol == built.protocol
    assert (light.minimum_version, light.maximum_version) == (
        built.minimum_version,
        built.maximum_version,
    )
    assert [c["name"] for c in light.get_ciphers()] == [c["name"] for c in built.get_ciphers()]


REGEX_COPIES = (
    JEMALLOC_STAT
    + """
import gc
from tiktoken import _tiktoken
from proxy.tokens.encodings import load_encoding

encoding = load_encoding("o200k_base")
gc.collect()
before = stat(b"stats.allocated")
bpe = _tiktoken.CoreBPE({b"a": 0}, encoding._special_tokens, encoding._pat_str)
print(stat(b"stats.allocated") - before)
"""
)


def test_tiktoken_s_copies_of_an_encoding_s_regex_stay_light() -> None:
    # tiktoken's Rust encoder keeps 128 copies of the pattern (one per thread hash) whatever the
    # vocabulary: ~1.1 MB for o200k_base's since tiktoken 0.13, ~8.7 MB on 0.9-0.12.
    out = _on_default_jemalloc(REGEX_COPIES)

    assert int(out.stdout) < 3 << 20
