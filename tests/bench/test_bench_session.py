"""bench/session: raw message bytes, per-turn figures, and a replay through the real proxy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.session import Corpus, Session, replay, sessions_of
from bench.session_replay import TimedStore, TurnLog, message_spans
from proxy.store.sqlite.store import SqliteStore


def test_message_spans_are_the_raw_bytes_of_each_top_level_message() -> None:
    body = (
        b'{"model": "m", "tools": [{"messages": [1]}],\n "messages" : [ {"role":"user",'
        b'"content":"a \\"]\\" b"} ,{"content": "x", "role": "assistant"}], "n": 1}'
    )
    assert message_spans(body) == [
        b'{"role":"user","content":"a \\"]\\" b"}',
        b'{"content": "x", "role": "assistant"}',
    ]


def test_a_changed_prefix_counts_against_quiet_turns_but_not_compaction_turns() -> None:
    log = TurnLog()
    a, b, c = [b"1"], [b"1", b"2"], [b"9", b"2", b"3"]
    turns = [
        ("passthrough", a, None),
        ("passthrough", b, (a, a)),
        ("compacted", c, (b, b)),
        ("replayed", a, (c, c)),
    ]
    for n, (action, spans, previous) in enumerate(turns, 1):
        log.add(
            status=200,
            action=action,
            before=10,
            after=10,
            spans=spans,
            canon=spans,
            previous=previous,
            store_seconds=None,
            where=f"s@{n}",
            counted=10,
        )
    assert (log.followups, log.prefix_ok, log.quiet, log.quiet_ok) == (3, 1, 2, 1)
    assert log.quiet_misses == ["s@4"]


async def test_timed_store_keeps_only_request_path_calls_per_request(tmp_path: Path) -> None:
    store = TimedStore(await SqliteStore.open(tmp_path / "s.db"))
    try:
        store.reset()
        assert await store.find_checkpoint("t1", "c1", ["d0"]) is None
        assert await store.usage(None, "2000-01-01") == []
        assert store.request_seconds() is not None
        assert set(store.calls) == {"find_checkpoint", "usage"}
        store.reset()
        assert store.request_seconds() is None
    finally:
        await store.close()


def _synthetic_session() -> Session:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are terse."}]
    for i in range(10):
        messages.append({"role": "user", "content": f"q{i} " + "please check the logs " * 20})
        messages.append({"role": "assistant", "content": f"a{i} " + "the logs look fine " * 40})
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return Session("synthetic", "s0", messages, None, turns, budget=900)


async def test_replay_compacts_and_keeps_the_prefix_between_compactions() -> None:
    row, ops = await replay(
        Corpus("synthetic", [_synthetic_session()]), "sqlite", "sdk", True, print
    )
    assert row["turns"] == 10
    assert row["errors"] == 0
    assert row["actions"].get("compacted", 0) >= 1
    assert row["actions"].get("replayed", 0) >= 1
    assert row["prefix_quiet"].startswith("100.0 %")
    assert {op["op"] for op in ops} >= {"find_checkpoint", "save_compaction"}


def _console_session() -> Session:
    """An aider-like session (console output sent as user messages, fenced code, edits)."""
    messages: list[dict[str, object]] = [{"role": "system", "content": "Act as a coder."}]
    for i in range(10):
        console = "\n".join(
            f"src/app_{i}.py:{n}: E501 line too long ({80 + n} > 79)" for n in range(30)
        )
        messages.append({"role": "user", "content": f"I ran `ruff check`:\n```\n{console}\n```"})
        code = "\n".join(f"    value_{n} = compute({n}, {i})" for n in range(25))
        messages.append(
            {"role": "assistant", "content": f"src/app_{i}.py\n```python\ndef f():\n{code}\n```"}
        )
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return Session("console", "c0", messages, None, turns, budget=1500)


async def test_tokens_after_header_matches_the_forwarded_body_of_a_console_session() -> None:
    row, _ = await replay(Corpus("console", [_console_session()]), "sqlite", "corpus", False, print)
    assert row["errors"] == 0
    assert row["actions"].get("compacted", 0) >= 1
    assert row["miscounted_at"] == []


def test_converted_corpora_give_their_dev_rows_with_their_own_tools() -> None:
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 3
    tool = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    rows = [
        {"id": "held", "split": "held-out", "messages": chat},
        {"id": "short", "split": "dev", "messages": chat[:4]},
        {"id": "own", "split": "dev", "messages": chat, "tools": tool},
        {"id": "plain", "messages": chat},
        {"id": "past-the-limit", "split": "dev", "messages": chat},
    ]
    corpus = sessions_of("c", rows, None, limit=2, min_turns=3)
    assert [(s.id, s.tools, s.turns) for s in corpus.sessions] == [
        ("own", tool, [1, 3, 5]),
        ("plain", None, [1, 3, 5]),
    ]


async def test_forks_share_checkpoints_within_a_key_and_not_across_keys() -> None:
    """Two sessions with the same messages (a fork, as multi-session corpora hold one history
    with several final questions): under one key the second replays the first's checkpoints,
    including ones the first made later in the conversation, so a turn of it can change its
    prefix without a compaction of its own; under keys of their own each compacts by itself and
    every quiet turn keeps its prefix."""
    first = _synthetic_session()
    forks = Corpus("forks", [first, dataclasses.replace(first, id="s1")])
    shared, _ = await replay(forks, "sqlite", "corpus", False, print)
    own, _ = await replay(forks, "sqlite", "corpus", False, print, own_keys=True)
    alone, _ = await replay(Corpus("one", [first]), "sqlite", "corpus", False, print)
    assert shared["errors"] == own["errors"] == 0
    assert own["actions"]["compacted"] == 2 * alone["actions"]["compacted"]
    assert shared["actions"]["compacted"] < own["actions"]["compacted"]
    assert shared["quiet_misses"]
    assert all(m.startswith("s1@") for m in shared["quiet_misses"])
    assert own["prefix_quiet"].startswith("100.0 %")
