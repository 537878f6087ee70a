"""A replayed body is spliced from kept parts, byte for byte what rebuilding it gives, and a
replayed turn's work does not grow with the number of tools the agent sends."""

from __future__ import annotations

import contextvars
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import body_shapes
from proxy.chat import splice
from proxy.chat.compactor import Compactor
from proxy.store.base import Checkpoint
from proxy.telemetry.metrics import Metrics
from proxy.tokens.counter import TokenCounter
from proxy.wire.rewrite import with_messages
from tests.inprocess import running

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)  # fmt: skip
messages_st = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": json_values}),
    max_size=6,
)


@given(
    fields=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "messages"), json_values),
    position=st.integers(0, 10),
    prefix=messages_st,
    rest=messages_st,
)
def test_a_spliced_body_is_the_rebuilt_body_byte_for_byte(
    fields: dict[str, Any], position: int, prefix: list[Any], rest: list[Any]
) -> None:
    keys = list(fields)
    keys.insert(min(position, len(keys)), "messages")
    body = {k: [] if k == "messages" else fields[k] for k in keys}
    parts = splice.frame(body, "messages")

    assert splice.spliced(parts, splice.items(prefix), rest) == with_messages(body, prefix + rest)


def test_the_prefix_cache_is_bounded_and_counts_what_it_does() -> None:
    cache = splice.PrefixBytes(max_bytes=300)
    big = [{"role": "user", "content": "x" * 100}]
    for version in ("v1", "v2", "v3", "v1"):
        made, _ = cache.get(version, lambda: big)
        assert made == orjson.dumps(big)[1:-1]
    assert (cache.hits, cache.misses, cache.evicted) == (0, 4, 2)
    assert cache.size <= 300
    assert cache.get("v1", big)[1]  # the newest ones stay


def test_a_checkpoint_that_does_not_begin_the_messages_is_not_spliced() -> None:
    from proxy.chat.bodycache import BodyCache

    splicer = splice.Splicer(BodyCache(), 1 << 20, Metrics())
    body = {"model": "m", "messages": [], "tools": [1]}
    mine = [{"role": "user", "content": "a"}]
    cp = Checkpoint("t", "c", "d", 0, mine, ["trim"], 0.0, version="v:1")
    other = [{"role": "user", "content": "a"}]  # equal, but not the checkpoint's objects
    assert splicer.chat_body(body, None, other, cp) == with_messages(body, other)
    assert splicer.prefixes.misses == 0
    assert splicer.chat_body(body, None, [*mine, *other], cp) == with_messages(body, mine + other)
    assert splicer.prefixes.misses == 1


def session(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": f"step {i} [ok] " + "output line é " * 60})
    return msgs


_ON_PATH: contextvars.ContextVar[bool] = contextvars.ContextVar("on_path", default=False)


class _Work:
    """Bytes through orjson and characters tokenized on the request path (reading the body
    and deciding what to send; not accounting, which runs beside it): what a turn costs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.total = 0
        loads, dumps, count = orjson.loads, orjson.dumps, TokenCounter.count_text

        def counted_loads(raw: Any) -> Any:
            self.total += len(raw) if _ON_PATH.get() else 0
            return loads(raw)

        def counted_dumps(value: Any, *args: Any, **kw: Any) -> bytes:
            out = dumps(value, *args, **kw)
            self.total += len(out) if _ON_PATH.get() else 0
            return out

        def counted_text(counter: TokenCounter, text: str) -> int:
            self.total += len(text) if _ON_PATH.get() else 0
            return count(counter, text)

        monkeypatch.setattr(orjson, "loads", counted_loads)
        monkeypatch.setattr(orjson, "dumps", counted_dumps)
        monkeypatch.setattr(TokenCounter, "count_text", counted_text)
        for name in ("read", "decide"):
            monkeypatch.setattr(Compactor, name, _on_path(getattr(Compactor, name)))


def _on_path(method: Any) -> Any:
    async def wrapped(*args: Any, **kw: Any) -> Any:
        token = _ON_PATH.set(True)
        try:
            return await method(*args, **kw)
        finally:
            _ON_PATH.reset(token)

    return wrapped


@pytest.mark.parametrize("shape", ["openai-python", "openai-node", "openai-node-v4"])
async def test_replayed_turns_cost_the_same_with_0_14_or_128_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """Each turn is sent three times, with 0, 14 and 128 tools, in one conversation: the same
    checkpoint replays for all three, and each does the same work (bytes through orjson and
    the tokenizer), turn after turn; the tools are read once per session, not per turn. The
    first of the three to send a turn also tokenizes its new messages (the per-message count
    cache is shared), so the order rotates and that extra must be the same whoever pays it."""
    replayed: list[tuple[int, dict[int, int]]] = []
    steady = False  # the turn after a compaction also counts the new checkpoint's messages once
    async with running(tmp_path, default_policy={"budget_tokens": 20_000}) as proxy:
        counted = _Work(monkeypatch)
        for turn in range(130, 230, 2):  # over the budget from the start, whatever the tools
            spent, actions = {}, set()
            order = body_shapes.TOOL_COUNTS[turn % 3 :] + body_shapes.TOOL_COUNTS[: turn % 3]
            for tools in order:
                raw = body_shapes.body(shape, session(turn), tools)
                before = counted.total
                response = await proxy.chat(raw, x_compactd_conversation_id="agent")
                spent[tools] = counted.total - before
                actions.add(response.headers["x-compactd-action"])
                sent = proxy.upstream.last.content
                # Byte for byte what rebuilding the body around what was sent gives.
                forwarded = json.loads(sent)["messages"]
                assert sent == with_messages(json.loads(raw), forwarded)
            if actions == {"replayed"} and steady:
                replayed.append((order[0], spent))
            steady = actions == {"replayed"}
        monkeypatch.undo()
    assert len(replayed) >= 10, replayed
    assert {first for first, _ in replayed} == set(body_shapes.TOOL_COUNTS)
    extra = set()
    for first, spent in replayed:
        rest = {spent[t] for t in body_shapes.TOOL_COUNTS if t != first}
        assert len(rest) == 1, replayed
        extra.add(spent[first] - rest.pop())
    assert len(extra) == 1, replayed
