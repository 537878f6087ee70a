"""bench/session_apis: a chat session converted to each API's shape goes through compactd and
its validating fake upstream, turn by turn, compacted and replayed, never refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.session import Corpus, Session
from bench.session_apis import run


def agent_session(turns: int = 12) -> Session:
    """A synthetic tool-using run (tests never read the corpora)."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are an airline agent."},
        {"role": "user", "content": "Change my flight HAT170 to May 21, reservation ZFA04Y."},
    ]
    for t in range(turns):
        call = {
            "id": f"call_{t}",
            "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"day": t})},
        }
        messages.append(
            {"role": "assistant", "content": f"Checking day {t}.", "tool_calls": [call]}
        )
        rows = "\n".join(
            f"flight HAT{t}{k:02d} departs 0{k % 10}:15, $ {100 + k}" for k in range(40)
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{t}", "content": rows})
    messages.append({"role": "assistant", "content": "Done: HAT170 on May 21."})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Find flights",
                "parameters": {"type": "object"},
            },
        }
    ]
    turns_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return Session("synthetic", "s1", messages, tools, turns_at, budget=2500)


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_every_shape_is_compacted_replayed_and_never_refused(api: str) -> None:
    tally = await run(Corpus("synthetic", [agent_session()]), api)
    assert tally.n["turns"] == 13
    assert tally.n["errors"] == 0
    assert tally.n["refused"] == 0
    assert tally.n["events"] >= 1
    assert tally.actions.get("replayed", 0) >= 1
    assert tally.n["stable"] == tally.n["quiet"]  # every turn without an event kept its prefix
    assert tally.n["prompt"] > 0


async def test_with_a_band_messages_turns_near_the_trigger_are_counted_upstream() -> None:
    tally = await run(Corpus("synthetic", [agent_session()]), "messages", band=0.5)
    assert tally.n["confirms"] >= 1
    assert tally.n["errors"] == 0
    assert tally.n["refused"] == 0
    assert tally.n["stable"] == tally.n["quiet"]


@pytest.mark.parametrize("api", ["chat", "messages"])
async def test_with_own_keys_a_fork_compacts_by_itself_and_keeps_its_prefix(api: str) -> None:
    """Two sessions with the same messages: under the harness's one key the second replays the
    first's checkpoints (fewer events, a prefix that jumps to the twin's later ones); each with a
    key of its own compacts as often as the first and keeps every quiet turn's prefix."""
    first = agent_session()
    forks = Corpus("forks", [first, replace(first, id="s2")])
    shared = await run(forks, api)
    own = await run(forks, api, own_keys=True)
    alone = await run(Corpus("one", [first]), api)
    assert shared.n["errors"] == own.n["errors"] == 0
    assert own.n["events"] == 2 * alone.n["events"]
    assert shared.n["events"] < own.n["events"]
    assert shared.n["stable"] < shared.n["quiet"]
    assert own.n["stable"] == own.n["quiet"]
