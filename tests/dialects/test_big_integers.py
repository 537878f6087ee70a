"""A request holding an integer beyond 64 bits is never rewritten: it goes upstream as sent.

orjson reads an integer outside [-2**63, 2**64 - 1] as a float: a compacted request, serialized
again, carried `1.8446744073709552e+19` where the client wrote `18446744073709551616` (a `seed`,
a tool schema's `maximum`, a `tool_use.input` value), and its stored originals the same. Such a
request fails open on every API: the client's bytes, `x-compactd-action: error`, a metric.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.dialects.conversations import messages_history, responses_input
from tests.dialects.harness import Harness, harness
from tests.dialects.test_plugin_apis import chat_messages

SMALL = {"default_policy": {"budget_tokens": 4000}}
BIG = 2**64
"""The first integer orjson cannot keep."""
HUGE = 123456789012345678901234567890
LOW = -(2**63) - 1
"""The first negative one."""
Json = dict[str, Any]


def schema() -> Json:
    return {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "maximum": HUGE, "default": LOW, "enum": [BIG, 1, LOW]},
        },
    }


def with_big_input(msgs: list[Json], turn: int) -> list[Json]:
    """The history with a big integer in the `tool_use.input` of this turn."""
    out: list[Json] = json.loads(json.dumps(msgs))
    use = out[1 + 2 * turn]["content"][2]
    assert use["type"] == "tool_use"
    use["input"] = {**use["input"], "count": BIG, "floor": LOW}
    return out


def chat(h: Harness) -> Json:
    tools = [{"type": "function", "function": {"name": "shell", "parameters": schema()}}]
    return {"model": "gpt-5", "seed": BIG, "messages": chat_messages(30), "tools": tools}


def responses(h: Harness) -> Json:
    items = responses_input(h.responses, 30)
    items[0] = {**items[0], "trace": [HUGE, LOW]}  # an item kept as sent, with a number
    text = {"format": {"type": "json_schema", "name": "out", "schema": schema()}}
    return {"model": "gpt-5", "input": items, "store": False, "text": text}


def messages(h: Harness) -> Json:
    # In the oldest turn, which a compaction would drop (and store as an original).
    msgs = with_big_input(messages_history(h.messages, 30), 0)
    return {"model": "claude-sonnet-5", "max_tokens": 1024, "messages": msgs}


CASES = {
    "chat.completions": ("/v1/chat/completions", chat, "responses"),
    "responses": ("/v1/responses", responses, "responses"),
    "messages": ("/v1/messages", messages, "messages"),
}


@pytest.mark.parametrize("api", list(CASES))
async def test_an_over_budget_request_with_a_big_integer_is_forwarded_as_sent(
    tmp_path, api
) -> None:
    path, make, upstream = CASES[api]
    async with harness(tmp_path, **SMALL) as h:
        body = make(h)
        send = {"/v1/chat/completions": h.chat, "/v1/responses": h.create}.get(path, h.message)
        response = await send(body)
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-action"] == "error"
        assert response.headers["x-compactd-error"] == "wide_integer"
        fake = h.responses if upstream == "responses" else h.messages
        assert fake.last.body == h.sent[-1]
        assert h.metric("compactd_fail_open_total", reason="wide_integer") == 1
        conversations = await h.client.get(
            "/compactd/v1/conversations", headers={"authorization": "Bearer sk-alpha"}
        )
        assert conversations.json()["data"] == []  # nothing stored from it


async def test_the_same_request_without_the_big_integer_is_compacted(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        body = chat(h)
        body["seed"] = 2**64 - 1  # the largest orjson keeps, and the lowest
        body["tools"][0]["function"]["parameters"] = {"type": "integer", "minimum": -(2**63)}
        response = await h.chat(body)
        assert response.headers["x-compactd-action"] == "compacted"
        assert b'"seed":18446744073709551615,' in h.responses.last.body
        assert b'"minimum":-9223372036854775808}' in h.responses.last.body


async def test_an_under_budget_request_with_a_big_integer_passes_through(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        body = {"model": "gpt-5", "seed": BIG, "messages": [{"role": "user", "content": "hi"}]}
        response = await h.chat(body)
        assert response.headers["x-compactd-action"] == "passthrough"
        assert h.responses.last.body == h.sent[-1]


async def test_a_replayed_turn_with_a_big_integer_is_forwarded_as_sent(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        body = chat(h)
        body["seed"] = 7
        body["tools"][0]["function"]["parameters"] = {"type": "object"}
        first = await h.chat(body)
        assert first.headers["x-compactd-action"] == "compacted"
        # The next turn replays the checkpoint, and its new messages would be written again.
        extra = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
        plain = {**body, "messages": [*body["messages"], *extra]}
        again = await h.chat(plain)
        assert again.headers["x-compactd-action"] == "replayed"
        wide = {**plain, "seed": BIG}
        response = await h.chat(wide)
        assert response.headers["x-compactd-action"] == "error"
        assert response.headers["x-compactd-error"] == "wide_integer"
        assert h.responses.last.body == h.sent[-1]
