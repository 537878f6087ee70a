"""The real anthropic SDK through compactd on real sockets: create and stream, tools, thinking."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.api_fakes import FakeMessages
from tests.dialects.conversations import messages_history
from tests.upstream import serve

TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
THINKING: Any = {"type": "enabled", "budget_tokens": 2000}


@pytest.fixture
async def fake_messages():
    fake = FakeMessages()
    async with serve(fake) as url:
        yield fake, url


def client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-alpha", max_retries=0)


def tool_reply(fake: FakeMessages) -> Any:
    use = {"type": "tool_use", "name": "Bash", "input": {"command": "ls"}}
    return lambda body: {
        "content": [fake.thinking("I will list."), {**use, "id": f"toolu_r{fake.counter}"}]
    }


async def create(sdk: anthropic.AsyncAnthropic, messages: list[Any]) -> Any:
    """messages.create with tools and thinking: (headers, parsed message)."""
    raw = await sdk.messages.with_raw_response.create(
        model="claude-sonnet-5", max_tokens=4000, thinking=THINKING, tools=TOOLS, messages=messages
    )
    return raw.headers, await raw.parse()


@contextlib.asynccontextmanager
async def tool_session(
    fake_messages: Any, make_proxy: Any
) -> AsyncIterator[tuple[FakeMessages, anthropic.AsyncAnthropic, list[Any]]]:
    """The SDK through compactd, the fake upstream's first reply a thinking + tool_use turn."""
    fake, base = fake_messages
    fake.replies.append(tool_reply(fake))
    async with make_proxy("http://127.0.0.1:9/v1", upstream={"anthropic_url": base}) as url:
        sdk = client(url)
        yield fake, sdk, [{"role": "user", "content": "List the files."}]
        await sdk.close()


def answer(messages: list[Any], reply: Any) -> Any:
    """The agent's next turn: the model's reply as it came, then its tool call's result."""
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
    )
    use = next(b for b in reply.content if b.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}
    messages.append({"role": "user", "content": [result]})
    return use


async def test_messages_create_with_tools_and_thinking_round_trips(
    fake_messages, make_proxy
) -> None:
    async with tool_session(fake_messages, make_proxy) as (fake, sdk, messages):
        headers, first = await create(sdk, messages)
        assert headers["x-compactd-action"] == "passthrough"
        assert [b.type for b in first.content] == ["thinking", "tool_use"]
        answer(messages, first)
        _, second = await create(sdk, messages)
        assert second.content[-1].text == "Done."
        assert fake.refused == []
        assert first.usage.input_tokens > 0
        await sdk.close()


async def test_messages_stream_delivers_thinking_and_text(fake_messages, make_proxy) -> None:
    fake, base = fake_messages
    async with make_proxy("http://127.0.0.1:9/v1", upstream={"anthropic_url": base}) as url:
        sdk = client(url)
        async with sdk.messages.stream(
            model="claude-sonnet-5",
            max_tokens=4000,
            thinking=THINKING,
            messages=[{"role": "user", "content": "Hello"}],
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text == "Done."
        assert final.content[0].type == "thinking"
        assert final.content[0].signature.startswith("sig:")
        assert fake.refused == []
        await sdk.close()


async def test_messages_stream_with_tools_and_thinking_runs_a_tool_loop_byte_for_byte(
    fake_messages, make_proxy
) -> None:
    async with tool_session(fake_messages, make_proxy) as (fake, sdk, messages):
        for _ in range(2):
            async with sdk.messages.stream(
                model="claude-sonnet-5",
                max_tokens=4000,
                thinking=THINKING,
                tools=TOOLS,
                messages=messages,
            ) as stream:
                deltas = [e.type async for e in stream]
                final = await stream.get_final_message()
                headers = stream.response.headers
                sent = stream.response.request.content
            assert headers["x-compactd-action"] == "passthrough"
            assert headers["x-compactd-api"] == "messages"
            # Under budget the upstream gets exactly the bytes the SDK sent.
            assert hashlib.sha256(fake.last.body).digest() == hashlib.sha256(sent).digest()
            assert "thinking" in deltas
            assert "signature" in deltas
            assert final.content[0].type == "thinking"
            if final.stop_reason != "tool_use":
                break
            use = answer(messages, final)
            assert use.input == {"command": "ls"}  # assembled from its input_json deltas
            assert "input_json" in deltas
        assert final.content[-1].text == "Done."
        assert len(fake.received) == 2
        assert fake.refused == []  # the thinking block went back with its signature intact
        await sdk.close()


async def test_claude_code_like_run_over_budget_is_compacted_and_restored(
    fake_messages, make_proxy
) -> None:
    fake, base = fake_messages
    policy = {"budget_tokens": 4000, "cap_apis": ["messages"]}
    config = {"upstream": {"anthropic_url": base}, "default_policy": policy}
    async with make_proxy("http://127.0.0.1:9/v1", **config) as url:
        sdk = client(url)
        messages = messages_history(fake, 30)
        headers, _ = await create(sdk, messages)
        assert headers["x-compactd-action"] == "compacted"
        assert fake.refused == []
        sent = fake.last.json()["messages"]
        async with sdk.messages.with_streaming_response.create(
            model="claude-sonnet-5",
            max_tokens=4000,
            thinking=THINKING,
            tools=TOOLS,
            messages=messages,
            stream=True,
        ) as response:
            assert response.headers["x-compactd-action"] == "replayed"
            async for _ in response.iter_lines():
                pass
        assert fake.last.json()["messages"] == sent
        async with httpx.AsyncClient() as http:
            restored = await http.post(
                f"{url}/compactd/v1/uncompress",
                json={"api": "messages", "messages": sent},
                headers={"x-api-key": "sk-ant-alpha"},
            )
        assert restored.json()["messages"] == messages
        await sdk.close()


async def test_an_upstream_error_reaches_the_sdk_as_its_own_exception(
    fake_messages, make_proxy
) -> None:
    _fake, base = fake_messages
    async with make_proxy("http://127.0.0.1:9/v1", upstream={"anthropic_url": base}) as url:
        sdk = client(url)
        bad = [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "?"}],
            }
        ]
        with pytest.raises(anthropic.BadRequestError) as info:
            await sdk.messages.create(model="claude-sonnet-5", max_tokens=10, messages=bad)
        assert "tool_use_id" in str(info.value)
        await sdk.close()
