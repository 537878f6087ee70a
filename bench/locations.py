"""Where the benchmark corpora are: the directory `$BENCH_CORPORA` names (bench/README.md,
"The corpora", says where they live and how to make the converted ones). There is no
default: nothing in this repository knows a path to them, so code that runs without the
variable, the test suite above all, cannot read them by any route through bench/. Resolved when
a corpus is read, not at import, so one setting moves every bench script."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "BENCH_CORPORA"
TAU = "tau_bench_airline_gpt4o"
AIDER = "aider_chat_history"
AIDER_SESSIONS = f"{AIDER}/sessions_openai_with_console.jsonl"
"""aider sessions with the console output kept (bench/quality, bench/session, bench/count)."""
AIDER_PLAIN = f"{AIDER}/sessions_openai.jsonl"
"""aider sessions without it (bench/overhead's large bodies)."""
LABELS = {
    "swe-agent": "mini_swe_agent_trajs",
    "memorybank": "memorybank_chats",
    "memory-tests": "memory_benchmark_sessions",
    "chitchat": "chitchat_long",
    "swe-windowed": "swe_agent_windowed_trajs",
    "irc-help": "ubuntu_irc_support_chats",
}
"""The folders bench/corpora.py writes, by the names bench/quality and bench/session give them."""
CONVERTED = tuple(LABELS.values())
"""The folders bench/corpora.py writes."""
FOLDERS = (TAU, AIDER, *CONVERTED)
"""Every corpus folder, wherever the corpora are."""


class CorporaUnsetError(FileNotFoundError):
    """`$BENCH_CORPORA` is not set: a bench asked for a corpus with nowhere to look."""


def corpora() -> Path:
    """The corpora directory `$BENCH_CORPORA` names."""
    configured = os.environ.get(ENV)
    if not configured:
        raise CorporaUnsetError(
            f"set {ENV} to the benchmark corpora's directory (bench/README.md: 'The corpora')"
        )
    return Path(configured)


def corpus(relative: str) -> Path:
    """A corpus file or folder (`TAU`, `AIDER_SESSIONS`, …) under `corpora()`."""
    return corpora() / relative


def converted(label: str) -> Path | None:
    """bench/corpora.py's file of the converted corpus `label` (a key of `LABELS`), or None with
    a note on stderr if it has not been made yet (a bench then skips that corpus)."""
    path = corpus(LABELS[label]) / "conversations.jsonl"
    if not path.exists():
        print(f"({label}: {path} missing; run bench/corpora.py)", file=sys.stderr)
        return None
    return path
