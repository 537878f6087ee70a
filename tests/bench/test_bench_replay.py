"""bench/replay.py measures replayed turns per body shape and tool count and reports them."""

from __future__ import annotations

import argparse

from bench import replay


async def test_a_short_session_is_compacted_then_replayed_and_reported() -> None:
    args = argparse.Namespace(shapes="openai-python", tools="0,14", turns=3, store="sqlite")
    rows = await replay._child(args)

    assert [r["action"] for r in rows] == ["compacted", "replayed", "replayed"] * 2
    redis = {"shape": "_redis", "commandstats": {"cmdstat_evalsha": {"calls": 2}}}
    table = replay._report({"after": [*rows, redis]})
    assert "| after | openai-python | 14 | 2 |" in table
    assert "| after | replayed | 4 |" in table
    assert "after redis cmdstat_evalsha: {'calls': 2}" in table
