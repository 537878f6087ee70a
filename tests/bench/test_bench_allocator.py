"""bench/allocator.py's big conversations: each one compacted afresh, none replaying another's."""

from __future__ import annotations

import json

import pytest

from bench.allocator import MODEL, conversations


def test_each_big_conversation_is_its_own_and_over_a_128k_models_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BENCH_CORPORA", raising=False)  # Python's sources stand in
    bodies = [json.loads(b) for b in conversations(3)]
    assert {b["model"] for b in bodies} == {MODEL}
    assert len({b["messages"][0]["content"] for b in bodies}) == 3
    assert all(b["messages"][1:] == bodies[0]["messages"][1:] for b in bodies)
    assert all(len(json.dumps(b)) > 300_000 for b in bodies)  # ~100k tokens, past the budget
