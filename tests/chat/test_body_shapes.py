"""Every SDK's body shape finds the body cache, whatever follows the messages, however many tools.

The bodies are the real SDKs' own bytes (bench/body_shapes.py): openai-python and anthropic
serialize them here, openai-node's and Codex's are reproduced byte for byte. The work of a turn
that extends a known body is measured as what it hands to orjson (`BodyCache.parsed_bytes`),
which must not grow with the number of tools.
"""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import body_shapes
from proxy.chat.bodycache import BodyCache

TRICKY = ['"messages": [', "]]]", '],"tools":[', "{", "\\", '"', "é", "\u2028", "}]}"]


def session(turns: int) -> list[dict[str, Any]]:
    """An agent session whose text holds brackets, quotes and the word messages in strings."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 40}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        body = f"step {i}: {TRICKY[i % len(TRICKY)]} " + "output line [ok] " * 120
        msgs.append({"role": role, "content": body})
    return msgs


def _items(parsed: Any, shape: str) -> Any:
    return parsed[body_shapes.field_of(shape)]


@pytest.mark.parametrize("tools", body_shapes.TOOL_COUNTS)
@pytest.mark.parametrize("shape", body_shapes.SHAPES)
def test_a_growing_session_hits_the_cache_on_every_turn_whatever_its_tools(
    shape: str, tools: int
) -> None:
    cache = BodyCache()
    parsed_per_turn = []
    for turn in range(40, 52, 2):  # each turn adds a user message and a reply
        raw = body_shapes.body(shape, session(turn), tools)
        before = cache.parsed_bytes
        parsed = cache.parse(raw)
        parsed_per_turn.append(cache.parsed_bytes - before)
        assert parsed == orjson.loads(raw)
        assert list(parsed) == list(orjson.loads(raw))  # key order kept
    assert (cache.misses, cache.hits) == (1, 5)
    # A hit parses the two new messages (and their separators), never the tools; Claude Code
    # moved its breakpoints off the last turn's two, which are read again.
    new_messages = [len(orjson.dumps(m)) for m in session(42)[-2:]]
    factor = 4 if shape == "claude-code" else 2
    for spent in parsed_per_turn[1:]:
        assert spent < factor * sum(new_messages) + 400


@pytest.mark.parametrize("shape", body_shapes.SHAPES)
def test_a_turns_parse_is_the_same_work_with_0_14_or_128_tools(shape: str) -> None:
    spent = {}
    for tools in body_shapes.TOOL_COUNTS:
        cache = BodyCache()
        cache.parse(body_shapes.body(shape, session(40), tools))
        before = cache.parsed_bytes
        cache.parse(body_shapes.body(shape, session(42), tools))
        spent[tools] = cache.parsed_bytes - before
    assert len(set(spent.values())) == 1, spent


def test_what_depends_only_on_the_fields_is_derived_once_per_session() -> None:
    """`memo` (the tools' token count, the frame a rewrite is spliced into) survives every
    turn whose bytes around the messages are the same, and only those."""
    cache = BodyCache()
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    for turn in range(40, 50, 2):
        parsed = cache.parse(body_shapes.body("openai-python", session(turn), 128))
        assert cache.memo(parsed["messages"], "tools", make) == 1
    changed = body_shapes.body("openai-python", session(50), 127)
    parsed = cache.parse(changed)
    assert cache.hits == 5  # the tools changed: still a hit, found by the scan
    assert cache.memo(parsed["messages"], "tools", make) == 2
    assert len(made) == 2


def _dump(body: dict[str, Any], style: str) -> bytes:
    if style == "indent":
        return json.dumps(body, indent=2, ensure_ascii=False).encode()
    if style == "spaced":
        return json.dumps(body).encode()
    return orjson.dumps(body)


@settings(max_examples=60, deadline=None)
@given(
    tools=st.sampled_from([0, 1, 3, 14, 40, 128]),
    seed=st.integers(0, 2**16),
    style=st.sampled_from(["compact", "indent", "spaced"]),
    field=st.sampled_from(["messages", "input"]),
    changed_tail=st.booleans(),
)
def test_any_key_order_and_tool_count_hits_the_cache(
    tools: int, seed: int, style: str, field: str, changed_tail: bool
) -> None:
    rng = random.Random(seed)
    schemas = [body_shapes.tool_schema(i) for i in range(tools)]
    fields: dict[str, Any] = {
        "model": "gpt-4.1",
        "tools": schemas,
        "metadata": {"note": '"messages":[1,2]'},  # the key's text inside a string before it
        "tool_choice": "auto",
        "stop": ["]", "}"],
        "temperature": 0.5,
    }
    keys = [*fields, field]
    rng.shuffle(keys)
    cache = BodyCache()
    first, second = session(40), session(42)
    for n, msgs in enumerate((first, second)):
        values = {**fields, field: msgs}
        if changed_tail and n and keys.index("temperature") > keys.index(field):
            values["temperature"] = 0.25  # a field after the array changed (one before: a miss)
        raw = _dump({k: values[k] for k in keys}, style)
        parsed = cache.parse(raw)
        assert parsed == orjson.loads(raw)
        assert list(parsed) == keys
    assert cache.hits == 1
