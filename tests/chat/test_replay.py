"""Replay under retries, regenerations, edits and bad stored data: what the issue saw break."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from proxy.providers.validate import pairing_problems
from tests.inprocess import Proxy, running

Message = dict[str, Any]
SMALL = {"default_policy": {"budget_tokens": 1200, "recency_turns": 0}}


def agent_run(steps: int) -> list[Message]:
    """A system prompt, one user request, then `steps` tool calls each with its result."""
    msgs: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests in src/."},
    ]
    for k in range(steps):
        call = f"call_{k}"
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "read", "arguments": f'{{"path": "src/m{k}.py"}}'},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": call, "content": f"# m{k}\n" + "x = 1\n" * 60})
    return msgs


async def send(proxy: Proxy, messages: list[Message]) -> tuple[str, list[Message]]:
    r = await proxy.chat({"model": "gpt-4o", "messages": messages})
    return r.headers["x-compactd-action"], proxy.upstream.last_json()["messages"]


async def restored(proxy: Proxy, sent: list[Message]) -> list[Message]:
    r = await proxy.uncompress(sent)
    assert r.json()["missing_ids"] == []
    out: list[Message] = r.json()["messages"]
    return out


async def test_a_retry_of_a_shorter_prefix_keeps_its_final_tool_call_and_result(
    tmp_path: Path,
) -> None:
    # The issue: a 40-message agent request is compacted, then its first 38 messages are resent;
    # the replayed checkpoint reached into the final tool exchange and replaced it by a stub.
    full = agent_run(19)
    async with running(tmp_path, **SMALL) as proxy:
        first, _ = await send(proxy, full)
        action, sent = await send(proxy, full[:38])
        back = await restored(proxy, sent)
    assert first == "compacted"
    assert action in ("compacted", "replayed", "passthrough")
    assert sent[-2:] == full[36:38]
    assert sent[0] == full[0]
    assert pairing_problems(sent) == set()
    assert back == full[:38]


async def test_regenerating_the_last_answer_resends_the_question_untouched(tmp_path: Path) -> None:
    history = agent_run(12)
    history += [
        {"role": "assistant", "content": "All tests pass now."},
        {"role": "user", "content": "Great, summarize the fix."},
        {"role": "assistant", "content": "I changed x to 1 everywhere."},
    ]
    async with running(tmp_path, **SMALL) as proxy:
        await send(proxy, [*history, {"role": "user", "content": "Thanks!"}])
        # Regenerate: the same request without the answer, then without the last exchange.
        _, again = await send(proxy, history[:-1])
        _, earlier = await send(proxy, history[:-2])
        back = await restored(proxy, again)
    assert again[-1] == history[-2]
    assert earlier[-1] == history[-3]
    assert back == history[:-1]
    assert pairing_problems(again) == pairing_problems(earlier) == set()


async def test_an_edited_middle_message_never_replays_what_came_after_it(tmp_path: Path) -> None:
    history = agent_run(14)
    async with running(tmp_path, **SMALL) as proxy:
        await send(proxy, history)
        edited = [*history[:6], {**history[6], "content": "# edited\n" + "y = 2\n" * 60}]
        edited += history[7:]
        _, sent = await send(proxy, edited)
        back = await restored(proxy, sent)
    assert back == edited


def rewrite_checkpoints(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change every stored checkpoint in place, as corruption or a bug would."""
    database = sqlite3.connect(tmp_path / "data" / "compactd.db")
    with database:
        for (body,) in database.execute("SELECT body FROM checkpoints").fetchall():
            value = orjson.loads(body)
            change(value)
            database.execute(
                "UPDATE checkpoints SET body = ? WHERE body = ?", (orjson.dumps(value), body)
            )
    database.close()


async def test_an_unreadable_checkpoint_counts_as_absent(tmp_path: Path) -> None:
    history = agent_run(14)
    async with running(tmp_path, **SMALL) as proxy:
        assert (await send(proxy, history))[0] == "compacted"
        database = sqlite3.connect(tmp_path / "data" / "compactd.db")
        with database:
            database.execute("UPDATE checkpoints SET body = ?", (b"{not json",))
        database.close()
        action, sent = await send(proxy, history)
        discarded = proxy.metric("compactd_checkpoints_discarded_total", reason="unreadable")
    assert action == "compacted"  # compacted afresh, never half-replayed
    assert sent[-2:] == history[-2:]
    assert discarded >= 1


async def test_a_checkpoint_claiming_another_tenant_counts_as_absent(tmp_path: Path) -> None:
    history = agent_run(14)
    async with running(tmp_path, **SMALL) as proxy:
        await send(proxy, history)
        rewrite_checkpoints(tmp_path, lambda value: value.update(t="b" * 24))
        action, sent = await send(proxy, [*history, {"role": "user", "content": "next"}])
        discarded = proxy.metric("compactd_checkpoints_discarded_total", reason="other_tenant")
    assert action == "compacted"
    assert discarded >= 1
    assert sent[-1] == {"role": "user", "content": "next"}


async def test_a_checkpoint_that_does_not_keep_a_protected_message_is_not_replayed(
    tmp_path: Path,
) -> None:
    # A stored checkpoint whose structure says it rewrote the (now) last user message: the
    # request must not go out with that message replaced.
    history = agent_run(14)
    async with running(tmp_path, **SMALL) as proxy:
        await send(proxy, history)
        rewrite_checkpoints(
            tmp_path, lambda value: value.update(r=[["abcdef0123"] for _ in value["r"]])
        )
        _, sent = await send(proxy, history)
        invalid = proxy.metric("compactd_checkpoints_discarded_total", reason="invalid")
    assert sent[1] == history[1]
    assert invalid >= 1
