"""`ReplayChecks.problem` answers exactly what `checkpoint.replay_problem` answers, on the first
request that meets a checkpoint and on every later one that meets the same object again."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.chat.checkpoint import replay_problem
from proxy.chat.replay import ReplayChecks
from proxy.runtime.digest import message_digest, prefix_digests
from proxy.store.base import Checkpoint

Message = dict[str, Any]
IDS = ("call_a", "call_b", "call_c")


@st.composite
def message(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    m: Message = {"role": role, "content": draw(st.sampled_from(["a", "b", "c"]))}
    if role == "assistant" and draw(st.booleans()):
        ids = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True))
        m["tool_calls"] = [{"id": i, "type": "function"} for i in ids]
    if role == "tool":
        m["tool_call_id"] = draw(st.sampled_from(IDS))
    return m


@st.composite
def checkpoint(draw: st.DrawFn, messages: list[Message]) -> Checkpoint:
    """A checkpoint over a prefix of `messages`: sound or broken in the ways stored ones can be."""
    k = draw(st.integers(0, len(messages) - 1))
    out: list[Message] = []
    ends: list[int] = []
    parts: list[list[str]] = []
    start = 0
    while start <= k:
        end = draw(st.integers(start + 1, k + 1))
        if end - start == 1 and draw(st.booleans()):
            kept = messages[start]
            if draw(st.integers(0, 9)) == 0:
                kept = {**kept, "content": "changed"}
            out.append(kept)
            parts.append([])
        else:
            stand_in: Message = draw(message())
            out.append(stand_in)
            parts.append([f"r{start}"] if draw(st.integers(0, 9)) else [])
        ends.append(end)
        start = end
    if draw(st.integers(0, 9)) == 0:
        ends = ends[:-1] if len(ends) > 1 else [*ends, k + 2]
    if draw(st.integers(0, 14)) == 0:
        ends, parts = [], []  # written before checkpoints recorded their structure
    digests = prefix_digests([message_digest(m) for m in messages])
    return Checkpoint(
        tenant="t" * 24,
        conversation="c" * 24,
        source_digest=digests[k] if draw(st.integers(0, 9)) else "0" * 32,
        covered_through=k,
        messages=out,
        providers=["engine"],
        created_at=time.time(),
        ends=ends,
        parts=parts,
    )


def _both(checks: ReplayChecks, cp: Checkpoint, messages: list[Message]) -> tuple[str, str]:
    digests = [message_digest(m) for m in messages]
    ours = checks.problem(cp, messages, digests, prefix_digests(digests))
    return ours, replay_problem(cp, messages, digests)


@given(st.data())
def test_replay_checks_answer_as_replay_problem_for_the_same_checkpoint_turn_after_turn(
    data: st.DataObject,
) -> None:
    messages = data.draw(st.lists(message(), min_size=2, max_size=12))
    cp = data.draw(checkpoint(messages))
    checks = ReplayChecks()
    later = [*messages, *data.draw(st.lists(message(), max_size=4))]
    edited = [*messages]
    i = data.draw(st.integers(0, len(edited) - 1))
    edited[i] = data.draw(message())

    for request in (messages, messages, later, edited, later):
        ours, theirs = _both(checks, cp, request)
        assert ours == theirs


def test_facts_are_kept_by_identity_and_an_equal_checkpoint_is_derived_on_its_own() -> None:
    messages: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "next"},
    ]
    digests = [message_digest(m) for m in messages]
    prefixes = prefix_digests(digests)
    cp = Checkpoint(
        tenant="t" * 24,
        conversation="c" * 24,
        source_digest=prefixes[2],
        covered_through=2,
        messages=[messages[0], {"role": "user", "content": "[summary]"}],
        providers=["engine"],
        created_at=0.0,
        ends=[1, 3],
        parts=[[], ["r1"]],
    )
    checks = ReplayChecks(max_entries=1)
    twin = Checkpoint(**{**cp.__dict__, "messages": list(cp.messages)})

    assert checks.problem(cp, messages, digests, prefixes) == ""
    assert checks.problem(cp, messages, digests, prefixes) == ""
    assert (checks.hits, checks.misses) == (1, 1)
    assert checks.problem(twin, messages, digests, prefixes) == ""
    assert (checks.hits, checks.misses) == (1, 2)
