"""Conversation activity (what the conversation list shows of every conversation, compacted or
not), on Redis, a Redis Cluster and SQLite alike."""

from __future__ import annotations

import time

from proxy.store.base import ActivityDelta
from tests.store.backends import Backend
from tests.store.test_contract import compaction, history

TTL = 3600
A, B = "aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb"


def seen(tenant: str, conv: str, at: float, **counters: int) -> ActivityDelta:
    api = counters.pop("api", None)
    api_name = "responses" if api else "chat.completions"
    return ActivityDelta(tenant, conv, api_name, f"gpt-{int(at) % 7}", at, counters)


async def test_batches_add_up_per_conversation_and_the_latest_request_names_api_and_model(
    backend: Backend,
) -> None:
    now = time.time()
    store = backend.store
    await store.add_activity(
        [
            seen(A, "conv-1", now - 30, requests=2, tokens_before=900, tokens_after=900),
            seen(A, "conv-2", now - 20, requests=1, tokens_before=50, tokens_after=50),
        ],
        TTL,
    )
    # A second worker's batch: conv-1 again (compacted this time), and another tenant's.
    await store.add_activity(
        [
            seen(A, "conv-1", now - 10, api=1, requests=1, compactions=1, tokens_before=1200,
                 tokens_after=400),
            seen(B, "conv-3", now - 5, requests=1, tokens_before=10, tokens_after=10),
        ],
        TTL,
    )  # fmt: skip
    mine = await store.activity(A, 10)
    assert [r["conversation"] for r in mine] == ["conv-1", "conv-2"]  # newest first
    first = mine[0]
    assert first["tenant"] == A
    assert (first["api"], first["model"]) == ("responses", f"gpt-{int(now - 10) % 7}")
    assert (first["requests"], first["compactions"]) == (3, 1)
    assert (first["tokens_before"], first["tokens_after"]) == (2100, 1300)
    assert first["first_seen"] == now - 30
    assert first["last_seen"] == now - 10
    everyone = await store.activity(None, 10)
    assert [(r["tenant"], r["conversation"]) for r in everyone] == [
        (B, "conv-3"),
        (A, "conv-1"),
        (A, "conv-2"),
    ]
    assert [r["conversation"] for r in await store.activity(None, 2)] == ["conv-3", "conv-1"]
    assert await store.activity("c" * 24, 10) == []


async def test_activity_past_its_time_is_gone_and_a_purge_forgets_it(backend: Backend) -> None:
    now = time.time()
    store = backend.store
    await store.add_activity(
        [
            seen(A, "old", now - 2 * TTL, requests=1),
            seen(A, "kept", now - 5, requests=1),
            seen(A, "compacted", now - 1, requests=1, compactions=1),
        ],
        TTL,
    )
    assert [r["conversation"] for r in await store.activity(A, 10)] == ["compacted", "kept"]
    await store.save_compaction(compaction(A, "compacted", history(6), 3), TTL)
    assert await store.purge(A, "compacted")
    assert not await store.purge(A, "kept")  # nothing stored: not found, its activity forgotten
    assert await store.activity(A, 10) == []
