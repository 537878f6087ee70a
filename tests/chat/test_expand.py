"""The expand tool: offered in constant bytes, answered by compactd, never seen by the client."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.chat.expand import TOOL, TOOL_NAME, cut, render
from proxy.providers.units import refs_in
from tests.app.test_restore import turn
from tests.inprocess import MockUpstream, Proxy, Reply, reply, running
from tests.upstream import chat_completion, respond, sse_chunks, stream

Message = dict[str, Any]
# trim: the first reference it leaves is a stub of whole turns, tool output included, which
# is what these tests ask the tool to bring back.
POLICY = {"default_policy": {"budget_tokens": 1500, "expand_tool": True, "providers": ["trim"]}}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def calls(*named: tuple[str, str]) -> dict[str, Any]:
    """A chat completion whose message calls these (name, arguments) tools."""
    body = chat_completion()
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_x{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(named)
        ],
    }
    body["choices"][0]["finish_reason"] = "tool_calls"
    return body


def sse_events(body: dict[str, Any]) -> list[bytes]:
    """The SSE form of a completion: role, content, one delta per tool call, finish, usage."""
    message = body["choices"][0]["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": i, **call}]})
    chunks: list[dict[str, Any]] = [
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}
        for d in deltas
    ]
    finish = {"index": 0, "delta": {}, "finish_reason": body["choices"][0]["finish_reason"]}
    chunks.append({"id": "c", "object": "chat.completion.chunk", "choices": [finish]})
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    chunks.append({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


class _Events(httpx.AsyncByteStream):
    def __init__(self, events: list[bytes]) -> None:
        self.events = events

    async def __aiter__(self) -> Any:
        for event in self.events:
            yield event


def sse(body: dict[str, Any]) -> Reply:
    """An upstream answer streaming `body` as events."""

    def answer(request: httpx.Request) -> httpx.Response:
        del request
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Events(sse_events(body)))

    return answer


def data(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body."""
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


async def compacted(proxy: Proxy, turns: int = 8, **body: Any) -> list[Message]:
    """A conversation grown until compactd compacts it; its messages."""
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    for k in range(turns):
        messages += turn(k)
        r = await proxy.chat({"model": "gpt-4o", "messages": messages, **body})
        assert r.status_code == 200
    assert r.headers["x-compactd-action"] in ("compacted", "replayed")
    return messages


def a_ref(request: httpx.Request) -> str:
    sent = json.loads(request.content)["messages"]
    return next(ref for m in sent for ref in refs_in(m))


async def test_offered_in_constant_bytes_only_on_rewritten_requests(tmp_path: Path) -> None:
    async with running(tmp_path, **POLICY) as proxy:
        first = await proxy.chat({"model": "gpt-4o", "messages": turn(0)[:1]})
        assert first.headers["x-compactd-action"] == "passthrough"
        assert "tools" not in proxy.upstream.last_json()
        await compacted(proxy, 10, tools=[WEATHER])
        tools = [r for r in proxy.upstream.received if b"compactd_expand" in r.content]
    assert len(tools) >= 2
    tails = {orjson.dumps(json.loads(r.content)["tools"][-1]) for r in tools}
    assert tails == {orjson.dumps(TOOL)}  # the same bytes on every rewritten turn
    assert all(json.loads(r.content)["tools"][0] == WEATHER for r in tools)


async def test_non_streaming_call_is_resolved_and_continued(tmp_path: Path) -> None:
    upstream = MockUpstream()
    async with running(tmp_path, upstream, **POLICY) as proxy:
        messages = await compacted(proxy)
        ref = a_ref(upstream.last)
        upstream.then(
            reply(200, calls((TOOL_NAME, json.dumps({"ref": ref})))),
            reply(200, chat_completion("Found it")),
        )
        n = len(upstream.received)
        billed = proxy.metric(
            "compactd_upstream_usage_tokens_total",
            kind="prompt",
            model="gpt-4o",
            api="chat.completions",
        )
        r = await proxy.chat(
            {
                "model": "gpt-4o",
                "messages": [*messages, {"role": "user", "content": "What was SECRET-0?"}],
            }
        )
        expanded = proxy.metric("compactd_expand_calls_total", outcome="expanded")
        billed = (
            proxy.metric(
                "compactd_upstream_usage_tokens_total",
                kind="prompt",
                model="gpt-4o",
                api="chat.completions",
            )
            - billed
        )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Found it"
    assert len(upstream.received) == n + 2
    first, second = (json.loads(x.content) for x in upstream.received[-2:])
    added = second["messages"][len(first["messages"]) :]
    assert added[0]["tool_calls"][0]["function"]["name"] == TOOL_NAME
    assert added[1]["role"] == "tool"
    assert "def f" in added[1]["content"]
    assert "    pass" in added[1]["content"]
    assert second["messages"][: len(first["messages"])] == first["messages"]  # prefix kept
    assert expanded == 1
    assert billed == 2 * 12  # both calls' usage is accounted


async def test_streaming_call_is_continued_and_the_client_sees_one_answer(tmp_path: Path) -> None:
    upstream = MockUpstream()
    async with running(tmp_path, upstream, **POLICY) as proxy:
        messages = await compacted(proxy)
        ref = a_ref(upstream.last)
        thinking = calls((TOOL_NAME, json.dumps({"ref": ref})))
        thinking["choices"][0]["message"]["content"] = "Let me look. "
        upstream.then(sse(thinking), sse(chat_completion("It was SECRET-0.")))
        r = await proxy.chat(
            {
                "model": "gpt-4o",
                "stream": True,
                "messages": [*messages, {"role": "user", "content": "?"}],
            }
        )
        continuation = json.loads(upstream.received[-1].content)
    text = r.text
    assert TOOL_NAME not in text
    deltas = data(text)
    content = "".join(
        (c["choices"][0]["delta"].get("content") or "") for c in deltas if c.get("choices")
    )
    assert content == "Let me look. It was SECRET-0."
    assert sum(1 for c in deltas if c.get("choices") and "role" in c["choices"][0]["delta"]) == 1
    assert not any(c.get("usage") for c in deltas)  # the client did not ask for usage
    assert text.endswith("data: [DONE]\n\n")
    assert continuation["stream_options"] == {"include_usage": True}
    assert continuation["messages"][-2]["content"] == "Let me look. "


@pytest.mark.parametrize("streaming", [False, True])
async def test_called_with_the_clients_tools_only_theirs_reach_the_client(
    tmp_path: Path, streaming: bool
) -> None:
    upstream = MockUpstream()
    async with running(tmp_path, upstream, **POLICY) as proxy:
        messages = await compacted(proxy, tools=[WEATHER])
        both = calls((TOOL_NAME, '{"ref":"abc123"}'), ("get_weather", '{"city":"Oslo"}'))
        upstream.then(sse(both) if streaming else reply(200, both))
        n = len(upstream.received)
        body = {
            "model": "gpt-4o",
            "tools": [WEATHER],
            "messages": [*messages, {"role": "user", "content": "?"}],
        }
        r = await proxy.chat({**body, "stream": streaming})
        mixed = proxy.metric("compactd_expand_calls_total", outcome="mixed")
    assert len(upstream.received) == n + 1  # no continuation
    assert TOOL_NAME not in r.text
    if streaming:
        deltas = data(r.text)
        calls_seen = [
            tc
            for c in deltas
            if c.get("choices")
            for tc in c["choices"][0]["delta"].get("tool_calls", [])
        ]
        assert [(tc["index"], tc["function"]["name"]) for tc in calls_seen] == [(0, "get_weather")]
    else:
        tool_calls = r.json()["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in tool_calls] == ["get_weather"]
    assert mixed == 1


async def test_unknown_and_foreign_refs_and_the_limit(tmp_path: Path) -> None:
    upstream = MockUpstream()
    policy = {"default_policy": {**POLICY["default_policy"], "expand_max_calls": 2}}
    async with running(tmp_path, upstream, **policy) as proxy:
        other = [
            {"role": "system", "content": "Another tenant."},
            *turn(0),
            *turn(1),
            *turn(2),
            *turn(3),
        ]
        await proxy.chat({"model": "gpt-4o", "messages": other}, key="sk-beta")
        foreign = a_ref(upstream.last)
        messages = await compacted(proxy)
        asks = calls((TOOL_NAME, json.dumps({"ref": foreign})))
        upstream.then(reply(200, asks), reply(200, asks), reply(200, chat_completion("Gave up")))
        n = len(upstream.received)
        r = await proxy.chat(
            {"model": "gpt-4o", "messages": [*messages, {"role": "user", "content": "?"}]}
        )
        unknown = proxy.metric("compactd_expand_calls_total", outcome="unknown")
    sent = [json.loads(x.content) for x in upstream.received[n:]]
    assert len(sent) == 3
    assert "Unknown reference" in sent[1]["messages"][-1]["content"]  # another tenant's: unknown
    assert any(t["function"]["name"] == TOOL_NAME for t in sent[1]["tools"])
    assert "tools" not in sent[2]  # the last continuation: the model has to answer
    assert r.json()["choices"][0]["message"]["content"] == "Gave up"
    assert unknown == 2


async def test_the_openai_sdk_never_sees_the_tool(upstream: Any, make_proxy: Any) -> None:
    fake, base = upstream
    async with make_proxy(base, **POLICY) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        messages: list[Any] = [{"role": "system", "content": "You are a coding agent."}]
        for k in range(8):
            messages += turn(k)
            fake.then(respond(200, chat_completion("ok")))
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=messages
            )
        assert raw.headers["x-compactd-action"] in ("compacted", "replayed")
        ref = next(r for m in json.loads(fake.received[-1].body)["messages"] for r in refs_in(m))
        messages.append({"role": "user", "content": "And SECRET-0?"})
        asks = calls((TOOL_NAME, json.dumps({"ref": ref})))
        fake.then(respond(200, asks), respond(200, chat_completion("It was SECRET-0")))
        done = await client.chat.completions.create(model="gpt-4o", messages=messages)
        fake.then(stream(sse_events(asks)), stream(sse_chunks(["It ", "was ", "SECRET-0"])))
        events = await client.chat.completions.create(
            model="gpt-4o", messages=messages, stream=True
        )
        pieces = [chunk async for chunk in events]
        await client.close()
    assert done.choices[0].message.content == "It was SECRET-0"
    assert done.choices[0].message.tool_calls is None
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == (
        "It was SECRET-0"
    )
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in pieces)


def test_an_expansion_is_cut_at_its_token_limit() -> None:
    text = render("abc123", [{"role": "tool", "tool_call_id": "c1", "content": "x " * 5000}])
    assert text.startswith("[compactd:ref=abc123 expanded: 1 message(s)]\ntool (c1): x x")
    short = cut(text, 5000, 400)
    assert short.endswith("[… cut by compactd: 400 of 5,000 tokens shown]")
    assert len(short) < len(text) / 10
    assert cut(text, 300, 400) == text


async def test_a_ref_that_does_not_decode_is_unknown_not_a_failure(tmp_path: Path) -> None:
    # Bad input (issue 9): a stored ref that does not decode is treated as absent.
    upstream = MockUpstream()
    async with running(tmp_path, upstream, **POLICY) as proxy:
        messages = await compacted(proxy)
        ref = a_ref(upstream.last)
        database = sqlite3.connect(tmp_path / "data" / "compactd.db")
        with database:
            database.execute("UPDATE refs SET body = ? WHERE ref_id = ?", (b"{bad", ref))
        database.close()
        upstream.then(
            reply(200, calls((TOOL_NAME, json.dumps({"ref": ref})))),
            reply(200, chat_completion("Without it")),
        )
        n = len(upstream.received)
        r = await proxy.chat(
            {"model": "gpt-4o", "messages": [*messages, {"role": "user", "content": "?"}]}
        )
        unknown = proxy.metric("compactd_expand_calls_total", outcome="unknown")
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Without it"
    continued = json.loads(upstream.received[n + 1].content)["messages"][-1]
    assert "Unknown reference" in continued["content"]
    assert unknown == 1
