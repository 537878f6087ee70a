"""Where the benchmark corpora are: `$BENCH_CORPORA`, else `shared/corpora` beside the
checkout (never inside the repository). Resolved when a corpus is read, not at import, so one
setting moves every bench script; the test suite points it at an empty directory (a test cannot
read the corpora, not even through bench/ or a subprocess it starts)."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "BENCH_CORPORA"
TAU = "tau_bench_airline_gpt4o"
AIDER_SESSIONS = "aider_chat_history/sessions_openai_with_console.jsonl"
"""aider sessions with the console output kept (bench/quality, bench/session, bench/count)."""
AIDER_PLAIN = "aider_chat_history/sessions_openai.jsonl"
"""aider sessions without it (bench/overhead's large bodies)."""


def beside_checkout() -> Path:
    """The default: `../shared/corpora` relative to the repository root."""
    return Path(__file__).resolve().parents[2] / "shared" / "corpora"


def corpora() -> Path:
    """The corpora directory in effect."""
    configured = os.environ.get(ENV)
    return Path(configured) if configured else beside_checkout()


def corpus(relative: str) -> Path:
    """A corpus file or folder (`TAU`, `AIDER_SESSIONS`, …) under `corpora()`."""
    return corpora() / relative
