"""Issue 32, rows 2, 2b and 8: a restore is bounded in messages, bytes and depth, resolves refs
only within the conversation they were sent in, and counts only markers compactd wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.chat.expand import TOOL_NAME
from proxy.chat.refscope import RefScope
from proxy.errors import RestoreTooLargeError
from proxy.providers.markers import dropped_marker, short_marker
from proxy.providers.uncompress import Bounds, uncompress
from proxy.providers.units import refs_in
from proxy.runtime.digest import message_digest
from proxy.store.base import Checkpoint, ConversationInfo
from tests.app.test_restore import grow, turn
from tests.chat.test_expand import a_ref, calls, compacted
from tests.inprocess import MockUpstream, reply, running
from tests.upstream import chat_completion

Message = dict[str, Any]
POLICY = {"default_policy": {"budget_tokens": 1500}}


def _carrier(forwarded: list[Message]) -> Message:
    return next(m for m in forwarded if refs_in(m))


async def test_sixteen_thousand_copies_of_one_ref_are_refused_with_an_openai_413(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, **POLICY) as proxy:
        _, _, last = await grow(proxy, 8)
        # The marker alone (a stand-in may carry kept lines too): the request stays small.
        carrier = _carrier(last["messages"])
        carrier = {"role": carrier["role"], "content": short_marker(refs_in(carrier)[0])}
        one = await proxy.uncompress([carrier])
        assert one.status_code == 200
        assert one.json()["messages_expanded"] == 1
        many = await proxy.uncompress([carrier] * 16_000)
    assert many.status_code == 413
    error = many.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "result_too_large")


async def test_the_restored_bytes_are_capped(tmp_path: Path) -> None:
    limits = {"uncompress_max_bytes": 1024}
    async with running(tmp_path, **POLICY, limits=limits) as proxy:
        _, _, last = await grow(proxy, 8)
        r = await proxy.uncompress([_carrier(last["messages"])] * 3)
    assert r.status_code == 413


async def test_a_ref_of_another_conversation_is_not_resolved(tmp_path: Path) -> None:
    async with running(tmp_path, **POLICY) as proxy:
        _, _, last = await grow(proxy, 8)
        theirs = refs_in(_carrier(last["messages"]))[0]
        mine = [
            {"role": "system", "content": "Another end user of the same app key."},
            {"role": "user", "content": f"hello {dropped_marker(theirs)}"},
        ]
        r = await proxy.chat({"model": "gpt-4o", "messages": mine})
        own = proxy.conversations[-1]
        restored = await proxy.uncompress(mine, conversation=own)
        derived = await proxy.client.post(  # no conversation named: the one `mine` starts
            "/compactd/v1/uncompress",
            json={"messages": mine, "recursive": True},
            headers={"authorization": "Bearer sk-alpha"},
        )
    for answer in (restored, derived):
        assert answer.status_code == 200
        body = answer.json()
        assert body["messages"] == mine  # nothing of the other conversation swapped in
        assert body["missing_ids"] == [theirs]
    assert r.status_code == 200


def _chain(levels: int, fan: int) -> tuple[dict[str, list[Message]], str]:
    """Refs whose originals are `fan` messages, each carrying a forged marker of the ref below
    (the 91-byte bodies of the attack); the lowest stands for 25 plain messages."""
    ids = [f"{level:02x}" * 5 for level in range(levels + 1)]
    refs = {ids[0]: [{"role": "user", "content": f"leaf {i}"} for i in range(25)]}
    for level in range(1, levels + 1):
        refs[ids[level]] = [{"role": "user", "content": dropped_marker(ids[level - 1])}] * fan
    return refs, ids[levels]


def test_a_forged_chain_grows_without_bounds_unless_bounded() -> None:
    refs, top = _chain(levels=4, fan=24)
    start = [{"role": "user", "content": dropped_marker(top)}]
    with pytest.raises(RestoreTooLargeError):
        uncompress(start, refs, recursive=True, bounds=Bounds(max_messages=10_000))
    shallow = uncompress(start, refs, recursive=True, bounds=Bounds(max_depth=2))
    assert len(shallow.messages) == 24 * 24  # two rounds; the markers left are not followed
    assert shallow.missing_ids == ("0202020202",)  # and say so


def test_a_forged_marker_inside_an_original_is_not_followed() -> None:
    refs, top = _chain(levels=4, fan=24)
    info = ConversationInfo(
        "t",
        "c",
        0.0,
        0.0,
        originals={message_digest(m): m for ms in refs.values() for m in ms},
        refs={ref: [message_digest(m) for m in ms] for ref, ms in refs.items()},
    )
    scope = RefScope.of(info)
    start = [{"role": "user", "content": dropped_marker(top)}]
    bounds = Bounds(refs_of=scope.refs_of)
    out = uncompress(start, scope.lookup, recursive=True, bounds=bounds)
    assert out.messages == refs[top]  # one level: the originals' markers are the client's text
    assert len(out.messages) == 24


def test_a_marker_compactd_wrote_inside_an_original_is_followed() -> None:
    leaf = [{"role": "user", "content": "the detail"}, {"role": "assistant", "content": "ok"}]
    stand_in = {"role": "user", "content": short_marker("b1b1b1b1b1")}
    outer = [stand_in, {"role": "user", "content": "later"}]
    info = ConversationInfo(
        "t",
        "c",
        0.0,
        0.0,
        checkpoints=[
            Checkpoint("t", "c", "d", 1, [stand_in], ["engine"], 0.0, parts=[["b1b1b1b1b1"]])
        ],
        originals={message_digest(m): m for m in [*leaf, *outer]},
        refs={
            "b1b1b1b1b1": [message_digest(m) for m in leaf],
            "c2c2c2c2c2": [message_digest(m) for m in outer],
        },
    )
    scope = RefScope.of(info)
    start = [{"role": "user", "content": short_marker("c2c2c2c2c2")}]
    out = uncompress(start, scope.lookup, recursive=True, bounds=Bounds(refs_of=scope.refs_of))
    assert out.messages == [*leaf, {"role": "user", "content": "later"}]


async def test_the_expand_tool_does_not_resolve_another_conversations_ref(tmp_path: Path) -> None:
    policy = {"default_policy": {"budget_tokens": 1500, "expand_tool": True, "providers": ["trim"]}}
    upstream = MockUpstream()
    async with running(tmp_path, upstream, **policy) as proxy:
        await compacted(proxy)  # conversation A
        theirs = a_ref(upstream.last)
        mine: list[Message] = [{"role": "system", "content": "Another end user's agent."}]
        for k in range(8):  # conversation B, of the same key, compacted too
            mine += [
                {**m, "content": f"B: {m['content']}"} if m.get("content") else m for m in turn(k)
            ]
            await proxy.chat({"model": "gpt-4o", "messages": mine})
        upstream.then(
            reply(200, calls((TOOL_NAME, json.dumps({"ref": theirs})))),
            reply(200, chat_completion("nothing")),
        )
        r = await proxy.chat(
            {"model": "gpt-4o", "messages": [*mine, {"role": "user", "content": "?"}]}
        )
        unknown = proxy.metric("compactd_expand_calls_total", outcome="unknown")
    assert r.status_code == 200
    result = json.loads(upstream.last.content)["messages"][-1]
    assert result["role"] == "tool"
    assert result["content"].startswith("Unknown reference")
    assert unknown == 1
