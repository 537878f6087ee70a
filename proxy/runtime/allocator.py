"""The C allocator a worker runs on: jemalloc when the machine has it, else the system's.

Most of a worker's memory is tiktoken's Rust encoder: every token of a vocabulary is three
small heap blocks (the encoder map's key, the decoder map's value, the sorted token list). The
average token is 7 bytes; glibc's malloc gives every such block 32 bytes, jemalloc 8 or 16.
With both encodings loaded that is ~19 MB per worker (measured by `bench/rss.py`, see
docs/performance.md, memory per worker). jemalloc can only be chosen before a process starts,
so `compactd serve` starts itself again once with it preloaded (`LD_PRELOAD`; the workers
inherit it).

`MALLOC_CONF` (when the environment does not set its own) lets a background thread hand freed
pages back after a second instead of keeping them ten, so a worker at rest holds what it uses,
and keeps one arena: a worker's few threads share its slabs instead of each half-filling its own
(jemalloc's default is four per core); the thread caches keep them off its lock.
That thread cannot reach the blocks a thread keeps in its own cache (jemalloc's tcache, up to
~0.3 MB each): a thread of ours that falls idle hands its back (`release_thread_cache`).

The restart also drops the column positions of code objects (`PYTHONNODEBUGRANGES`, ~1 MB per
worker): like the allocator, that can only be chosen before the interpreter starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.errors import AllocatorError

ALLOCATORS = ("auto", "jemalloc", "system")
MALLOC_CONF = "narenas:1,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
_MALLCTL_ARENAS_ALL = 4096
"""jemalloc's arena index meaning every arena (`arena.4096.purge`)."""
_KNOWN_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
)


def jemalloc_library() -> str | None:
    """The path (or soname) of an installed jemalloc, or None."""
    for path in _KNOWN_PATHS:
        if Path(path).exists():
            return path
    return ctypes.util.find_library("jemalloc")


def running_jemalloc() -> bool:
    """Whether this process allocates with jemalloc (it exports `mallctl`)."""
    return hasattr(ctypes.CDLL(None), "mallctl")


def preload_environment(choice: str, environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to start this program again with jemalloc preloaded, or None when it
    should go on as it is (the system allocator chosen, jemalloc already running or missing,
    or a preload that was tried and did not take)."""
    if choice == "system" or sys.platform != "linux" or running_jemalloc():
        return None
    library = jemalloc_library()
    if library is None:
        if choice == "jemalloc":
            raise AllocatorError("server.allocator: jemalloc was chosen but is not installed")
        return None
    preloaded = environ.get("LD_PRELOAD", "")
    if library in preloaded.split():
        return None  # the dynamic loader refused it once: do not start again and again
    env = dict(environ)
    env["LD_PRELOAD"] = f"{preloaded} {library}".strip()
    env.setdefault("MALLOC_CONF", MALLOC_CONF)
    # Code objects without column positions (~1 MB per worker); a traceback then points at the
    # line, without carets under the failing expression. Set it empty to keep them.
    env.setdefault("PYTHONNODEBUGRANGES", "1")
    return env


def restart_with_jemalloc(choice: str) -> None:
    """Replace this process by the same command with jemalloc preloaded, when it applies."""
    env = preload_environment(choice, os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # noqa: S606


@functools.cache
def _mallctl() -> Any:
    """jemalloc's `mallctl` when this process runs on it, else None."""
    return getattr(ctypes.CDLL(None), "mallctl", None)


def release_thread_cache() -> None:
    """Hand the blocks the calling thread keeps cached for its next allocations back to
    jemalloc (which returns their pages once freed for a second); nothing on another allocator.
    For a thread that falls idle: its next allocations fetch them anew."""
    mallctl = _mallctl()
    if mallctl is not None:
        mallctl(b"thread.tcache.flush", None, None, None, ctypes.c_size_t(0))


def release_freed_memory() -> None:
    """Hand the pages of freed heap blocks back to the system now (after loading an encoding
    frees the ~200k Python objects its vocabulary was parsed into)."""
    mallctl = _mallctl()
    with contextlib.suppress(AttributeError, OSError):
        if mallctl is not None:
            name = f"arena.{_MALLCTL_ARENAS_ALL}.purge".encode()
            mallctl(name, None, None, None, ctypes.c_size_t(0))
        else:
            ctypes.CDLL(None).malloc_trim(0)
