"""Lean workers: encodings load when first needed and keep one copy of their ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import tiktoken
import tiktoken_ext.openai_public as public

from proxy.budget import ModelTable
from proxy.encodings import load_encoding
from proxy.tokens import Tokenizers

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
from proxy.app import create_app
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
