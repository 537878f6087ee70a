"""The agents' newest protocol items through compactd, driven by the real openai and anthropic
SDKs on real sockets against fakes that behave as the APIs document (`tests.protocol_fakes`):
Codex's `compaction_trigger` and encrypted `compaction` items, `context_management` on both
APIs, Anthropic's compaction blocks, and Claude Code's `count_tokens`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from tests.dialects.conversations import messages_history, responses_input
from tests.protocol_fakes import (
    COMPACT_BETA,
    TRIGGER,
    CompactingMessages,
    CompactingResponses,
    compaction_block,
)
from tests.upstream import serve

Json = dict[str, Any]
TOOLS: Any = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
SYSTEM = "You are Claude Code."
POLICY = {"budget_tokens": 4000, "cap_apis": ["chat.completions", "responses", "messages"]}


@contextlib.asynccontextmanager
async def stack(
    make_proxy: Any, **policy: Any
) -> AsyncIterator[tuple[CompactingResponses, CompactingMessages, str]]:
    """compactd (budget 4,000 unless `policy` says) in front of both fakes: (fakes, its URL)."""
    responses, messages = CompactingResponses(), CompactingMessages()
    async with serve(responses) as r_url, serve(messages) as m_url:
        config = {"upstream": {"anthropic_url": m_url}, "default_policy": {**POLICY, **policy}}
        async with make_proxy(f"{r_url}/v1", **config) as url:
            yield responses, messages, url


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-alpha", max_retries=0)


def anthropic_client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-alpha", max_retries=0)


def triggers(items: list[Json]) -> list[int]:
    return [i for i, it in enumerate(items) if it.get("type") == TRIGGER]


# --- Responses: compaction_trigger and compaction items ------------------------------------------


async def test_codex_compaction_trigger_stays_last_once_and_its_item_is_resent_verbatim(
    make_proxy,
) -> None:
    async with stack(make_proxy) as (fake, _, url):
        sdk = openai_client(url)
        trigger: Json = {"type": TRIGGER}
        # Under the budget: forwarded byte for byte, the trigger included.
        short = [*responses_input(fake, 2), trigger]
        raw = await sdk.responses.with_raw_response.create(model="gpt-5", input=short, store=False)
        assert raw.headers["x-compactd-action"] == "passthrough"
        assert fake.last.body == raw.http_request.content
        # Over the budget: compacted, the trigger still the last item, exactly once.
        history = [*responses_input(fake, 30), trigger]
        raw = await sdk.responses.with_raw_response.create(
            model="gpt-5", input=history, store=False
        )
        assert raw.headers["x-compactd-action"] == "compacted"
        assert fake.refused == []
        sent = fake.last.json()["input"]
        assert triggers(sent) == [len(sent) - 1]
        assert len(sent) < len(history)
        # Exactly one compaction item back, relayed byte for byte.
        assert raw.content == fake.answers[-1]
        first = raw.parse()
        assert [o.type for o in first.output] == ["compaction"]
        compaction = first.output[0].model_dump(exclude_none=True)
        assert compaction == fake.compactions[-1]
        # Codex goes on from the compaction item: over the budget again, compacted, the item
        # reaches the upstream exactly as it was issued (the fake refuses any other).
        history = [compaction, {"role": "user", "content": "Go on."}]
        history += responses_input(fake, 30)[2:]
        raw = await sdk.responses.with_raw_response.create(
            model="gpt-5", input=history, store=False
        )
        assert raw.headers["x-compactd-action"] == "compacted"
        assert fake.refused == []
        sent = fake.last.json()["input"]
        assert sent[0] == compaction
        # The next turn replays that compaction and asks for another: the trigger is last once.
        fake.counter += 1
        history += [fake.reasoning("one more"), fake.message("Nearly there."), trigger]
        raw = await sdk.responses.with_raw_response.create(
            model="gpt-5", input=history, store=False
        )
        assert raw.headers["x-compactd-action"] == "replayed"
        resent = fake.last.json()["input"]
        assert resent[: len(sent)] == sent
        assert resent[0] == compaction
        assert triggers(resent) == [len(resent) - 1]
        assert [o.type for o in raw.parse().output] == ["compaction"]
        assert fake.refused == []
        await sdk.close()


async def test_responses_context_management_passes_through_and_its_item_comes_back(
    make_proxy,
) -> None:
    async with stack(make_proxy) as (fake, _, url):
        sdk = openai_client(url)
        management: Any = [{"type": "compaction", "compact_threshold": 2000}]
        history = responses_input(fake, 30)
        raw = await sdk.responses.with_raw_response.create(
            model="gpt-5", input=history, store=False, context_management=management
        )
        assert raw.headers["x-compactd-action"] == "compacted"
        body = fake.last.json()
        assert body["context_management"] == management
        assert list(body) == list(json.loads(raw.http_request.content))  # keys in their order
        first = raw.parse()
        assert first.output[0].type == "compaction"
        item = first.output[0].model_dump(exclude_none=True)
        history += [o.model_dump(exclude_none=True) for o in first.output]
        history.append({"role": "user", "content": "Thanks."})
        # Streamed this time: the events arrive as the upstream sent them.
        async with sdk.responses.stream(
            model="gpt-5", input=history, store=False, context_management=management
        ) as stream:
            final = await stream.get_final_response()
        assert fake.answers[-1].count(b"response.completed") == 2  # event: and type:
        assert final.output_text == "Done."
        assert fake.refused == []
        assert fake.last.json()["context_management"] == management
        assert item in fake.last.json()["input"]
        await sdk.close()


# --- Messages: count_tokens ----------------------------------------------------------------------


async def count(sdk: anthropic.AsyncAnthropic, messages: list[Json]) -> tuple[Any, int]:
    raw = await sdk.messages.with_raw_response.count_tokens(
        model="claude-sonnet-5", system=SYSTEM, tools=TOOLS, messages=messages
    )
    return raw.headers, (await raw.parse()).input_tokens


async def test_count_tokens_answers_with_the_size_compactd_forwards(make_proxy) -> None:
    async with stack(make_proxy) as (_, fake, url):
        sdk = anthropic_client(url)
        # Under the budget: the client's own request, counted as it is.
        short = messages_history(fake, 2)
        headers, tokens = await count(sdk, short)
        assert headers["x-compactd-action"] == "passthrough"
        assert tokens == fake.prompt_tokens({"system": SYSTEM, "tools": TOOLS, "messages": short})
        # Over it: the count is of the compacted request, which is what the next message sends.
        history = messages_history(fake, 30)
        whole = fake.prompt_tokens({"system": SYSTEM, "tools": TOOLS, "messages": history})
        headers, tokens = await count(sdk, history)
        assert headers["x-compactd-action"] == "compacted"
        counted = fake.last.json()
        assert fake.last.path == "/v1/messages/count_tokens"
        assert set(counted) == {"model", "system", "tools", "messages"}
        assert tokens == fake.prompt_tokens(counted) < whole / 2
        raw = await sdk.messages.with_raw_response.create(
            model="claude-sonnet-5", max_tokens=1000, system=SYSTEM, tools=TOOLS, messages=history
        )
        assert raw.headers["x-compactd-action"] == "replayed"
        assert fake.last.json()["messages"] == counted["messages"]
        assert (await raw.parse()).usage.input_tokens == tokens
        assert fake.refused == []
        await sdk.close()


# --- Messages: context_management and compaction blocks ------------------------------------------


def management(trigger: int) -> Any:
    return {
        "edits": [
            {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 3}},
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger}},
        ]
    }


async def beta_create(sdk: anthropic.AsyncAnthropic, messages: list[Json], edits: Any) -> Any:
    return await sdk.beta.messages.with_raw_response.create(
        model="claude-sonnet-5",
        max_tokens=1000,
        system=SYSTEM,
        tools=TOOLS,
        messages=messages,
        betas=[COMPACT_BETA],
        context_management=edits,
    )


async def test_anthropic_compaction_blocks_and_context_management_are_never_rewritten(
    make_proxy,
) -> None:
    async with stack(make_proxy, budget_tokens=6000) as (_, fake, url):
        sdk = anthropic_client(url)
        edits = management(1500)
        # Under compactd's budget, over the upstream's trigger: the upstream compacts.
        history = messages_history(fake, 4)
        raw = await beta_create(sdk, history, edits)
        assert raw.headers["x-compactd-action"] == "passthrough"
        assert await raw.read() == fake.answers[-1]
        reply = await raw.parse()
        assert reply.content[0].type == "compaction"
        assert reply.stop_reason == "end_turn"
        block = reply.content[0].model_dump(exclude_none=True)
        assert block == fake.compactions[-1]
        history.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        kept = len(history)
        # The agent runs on far past compactd's budget: compactd compacts only what follows the
        # compaction block; the block, what it superseded and context_management go as they came.
        history.append({"role": "user", "content": "Go on."})
        history += messages_history(fake, 40)[1:]
        raw = await beta_create(sdk, history, edits)
        assert raw.headers["x-compactd-action"] == "compacted"
        assert fake.refused == []
        sent = fake.last.json()
        assert sent["context_management"] == edits
        assert sent["messages"][:kept] == history[:kept]
        assert sent["messages"][kept - 1]["content"][0] == block
        await sdk.close()


async def test_what_a_compaction_block_superseded_is_not_counted(make_proxy) -> None:
    async with stack(make_proxy, budget_tokens=6000) as (_, fake, url):
        sdk = anthropic_client(url)
        # A long history the upstream already summarised: only the summary and after count.
        history = messages_history(fake, 40)
        block = compaction_block("The tests in src/ were fixed; mod39 is next.")
        fake.compactions.append(block)
        history.append({"role": "assistant", "content": [block, {"type": "text", "text": "Ok."}]})
        history.append({"role": "user", "content": "Go on."})
        raw = await beta_create(sdk, history, management(100_000))
        assert raw.headers["x-compactd-action"] == "passthrough"
        assert int(raw.headers["x-compactd-tokens-before"]) < 1000
        assert fake.last.body == raw.http_request.content
        assert fake.refused == []
        await sdk.close()


@pytest.mark.parametrize("where", ["first", "twice"])
async def test_a_misplaced_trigger_gets_the_upstreams_own_answer(make_proxy, where: str) -> None:
    async with stack(make_proxy) as (fake, _, url):
        sdk = openai_client(url)
        trigger: Json = {"type": TRIGGER}
        items = [trigger, *responses_input(fake, 2)]
        if where == "twice":
            items = [*items[1:], trigger, trigger]
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.responses.create(model="gpt-5", input=items, store=False)
        assert "final input item" in str(info.value)
        assert fake.last.body == info.value.response.request.content
        await sdk.close()
