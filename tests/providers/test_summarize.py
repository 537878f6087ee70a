"""The summarize provider: LLM summary of the oldest turns, escalation, cache, tool-pair safety."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.providers.base import CompactionResult, Message, OptionError, parse_options
from proxy.providers.summarize import (
    SummarizeOptions,
    SummarizeProvider,
)
from proxy.providers.uncompress import uncompress
from proxy.providers.units import message_text
from proxy.providers.validate import check_result
from tests.inprocess import MockUpstream, reply, running
from tests.live.test_compaction_e2e import history
from tests.providers.build import agent_run, assistant, system, user, words
from tests.providers.tokens import count_tokens, make_config
from tests.upstream import chat_completion

SUMMARY = "User asked to fix src/app.py; KeyError user_7 traced to warm_cache(); decided to retry."


class DictCache:
    """An in-memory SummaryCache."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    async def get(self, digest: str) -> str | None:
        return self.data.get(digest)

    async def put(self, digest: str, summary: str) -> None:
        self.data[digest] = summary


class FakeCompleter:
    """Answers with scripted replies (an Exception is raised) and records every call."""

    def __init__(self, *replies: str | BaseException) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[Message], str, float]] = []

    async def __call__(self, messages: list[Message], model: str, timeout: float) -> str:
        self.calls.append((messages, model, timeout))
        reply = self.replies.pop(0) if self.replies else SUMMARY
        if isinstance(reply, BaseException):
            raise reply
        return reply


def chat(turns: int) -> list[Message]:
    out = [system()]
    for k in range(turns):
        out.append(user(f"Turn {k} about src/app_{k}.py. " + words(150, f"u{k}")))
        out.append(assistant(f"Answer {k}. " + words(200, f"a{k}")))
    out.append(user("And now?"))
    return out


async def run(
    messages: list[Message], fraction: float, completer: object, **extra: object
) -> CompactionResult:
    config = make_config(
        int(count_tokens(messages) * fraction),
        complete=completer,
        summary_cache=extra.pop("cache", None),
        extra_config=extra,
    )
    result = await SummarizeProvider().compress(messages, config)
    assert check_result(messages, result, config) == []
    return result


async def test_oldest_turns_become_one_summary_message_with_a_marker() -> None:
    messages = chat(6)
    completer = FakeCompleter()
    result = await run(messages, 0.5, completer)
    summary = result.messages[1]
    assert SUMMARY in message_text(summary)
    assert message_text(summary).startswith("[compactd:ref=")
    (originals,) = result.verbatim.values()
    assert originals == messages[1 : 1 + len(originals)]
    assert result.messages[-1] == messages[-1]


async def test_the_prompt_asks_to_keep_paths_ids_numbers_urls_errors_and_decisions() -> None:
    completer = FakeCompleter()
    await run(chat(6), 0.5, completer, model="cheap-model", timeout=3.0)
    (request, model, timeout) = completer.calls[0]
    prompt = request[0]["content"]
    for word in ("file path", "identifier", "number", "URL", "error message", "decision"):
        assert word in prompt
    assert "src/app_0.py" in request[1]["content"]
    assert (model, timeout) == ("cheap-model", 3.0)


async def test_a_cached_span_is_never_paid_for_twice() -> None:
    cache = DictCache()
    messages = chat(6)
    first = FakeCompleter()
    a = await run(messages, 0.5, first, cache=cache)
    second = FakeCompleter("a different summary")
    b = await run(messages, 0.5, second, cache=cache)
    assert len(first.calls) == 1
    assert second.calls == []
    assert a.messages == b.messages


async def test_a_summary_is_cached_under_a_digest_its_ref_id_begins() -> None:
    # What lets a purge find the summaries of a conversation's spans by its stored ref ids.
    cache = DictCache()
    result = await run(chat(6), 0.5, FakeCompleter(), cache=cache)
    (digest,) = cache.data
    (ref,) = result.verbatim
    assert digest.startswith(ref)


async def test_a_failed_call_escalates_to_the_aggressive_prompt() -> None:
    completer = FakeCompleter(RuntimeError("upstream 500"), SUMMARY)
    result = await run(chat(6), 0.5, completer)
    assert len(completer.calls) == 2
    assert "bullet points" in completer.calls[1][0][0]["content"]
    assert SUMMARY in message_text(result.messages[1])


async def test_a_timeout_escalates() -> None:
    async def slow(messages: list[Message], model: str, timeout: float) -> str:
        await asyncio.sleep(30)
        return SUMMARY

    result = await run(chat(6), 0.5, slow, timeout=0.01)
    assert "deterministic engine" in " ".join(result.limitations)


async def test_a_reply_that_is_not_shorter_falls_back_to_the_engine() -> None:
    long_reply = words(5000)
    completer = FakeCompleter(long_reply, long_reply)
    result = await run(chat(6), 0.5, completer)
    assert len(completer.calls) == 2
    assert long_reply not in json.dumps(result.messages)
    assert "deterministic engine" in " ".join(result.limitations)


async def test_without_a_completer_the_engine_summary_is_used() -> None:
    messages = chat(6)
    result = await run(messages, 0.5, None)
    assert result.messages != messages
    assert "deterministic engine" in " ".join(result.limitations)


async def test_agent_runs_are_summarized_in_whole_tool_exchanges() -> None:
    messages = agent_run(12, result_tokens=300)
    result = await run(messages, 0.4, FakeCompleter())
    assert SUMMARY in message_text(result.messages[2])
    ids = [c["id"] for m in result.messages for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert ids == answered


def test_unknown_options_are_rejected() -> None:
    with pytest.raises(OptionError, match=r"modle: unknown option \(did you mean model\?\)"):
        parse_options(SummarizeOptions, {"modle": "gpt-4o-mini"})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[dict[str, object]]]]:
    """A real HTTP server on a local socket answering chat completions with SUMMARY."""
    seen: list[dict[str, object]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        seen.append(json.loads(await reader.readexactly(length)))
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": SUMMARY}}]})
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body.encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1", seen
    server.close()


async def test_summarize_against_a_real_http_upstream(
    upstream: tuple[str, list[dict[str, object]]],
) -> None:
    base_url, seen = upstream

    async with httpx.AsyncClient(base_url=base_url) as client:

        async def complete(messages: list[Message], model: str, timeout: float) -> str:
            response = await client.post(
                "/chat/completions",
                json={"model": model, "messages": messages},
                timeout=timeout,
            )
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"])

        result = await run(chat(6), 0.5, complete)

    assert seen[0]["model"] == "gpt-4o-mini"
    assert SUMMARY in message_text(result.messages[1])


@pytest.mark.parametrize(
    "credential",
    [
        (b"authorization", b"Bearer sk-cl\xc3\xa9"),
        (b"api-key", b"azure-cl\xc3\xa9"),  # Azure OpenAI: no Authorization header at all
    ],
)
async def test_the_summary_call_presents_the_clients_key_as_the_client_did(
    tmp_path: Path, credential: tuple[bytes, bytes]
) -> None:
    upstream = MockUpstream(default=reply(body=chat_completion(SUMMARY)))
    policy = {"budget_tokens": 600, "providers": ["summarize"]}
    async with running(tmp_path, upstream, default_policy=policy) as proxy:
        body = json.dumps({"model": "gpt-4o", "messages": history(12)}).encode()
        headers = [credential, (b"content-type", b"application/json")]
        response = await proxy.client.post("/v1/chat/completions", content=body, headers=headers)

    assert response.headers["x-compactd-action"] == "compacted"
    summaries = [r for r in upstream.received if json.loads(r.content)["model"] == "gpt-4o-mini"]
    assert summaries
    for sent in summaries:
        keys = [(k, v) for k, v in sent.headers.raw if k in (b"authorization", b"api-key")]
        assert keys == [credential]


async def test_the_engine_finishes_on_top_of_a_summary_and_both_undo() -> None:
    messages = chat(10)
    result = await run(messages, 0.15, FakeCompleter(words(600, "summary")))
    assert result.limitations[0] == "oldest turns replaced by an LLM summary"
    assert len(result.limitations) > 1
    restored = uncompress(result.messages, result.verbatim, recursive=True)
    assert restored.messages == messages


async def test_a_summary_is_the_models_words_never_a_list_of_terms_it_left_out() -> None:
    messages = chat(6)
    messages[1] = user("Please book flight HAT136 for mia_li_3668. " + words(150))
    result = await run(messages, 0.5, FakeCompleter("The user wants a booking."))
    text = message_text(result.messages[1])
    assert "The user wants a booking." in text
    assert "facts:" not in text
    assert "HAT136" not in text, "what the summary left out is restored from its ref, not listed"


@pytest.mark.parametrize("model", ["", "gpt-4o"])
async def test_with_the_conversations_model_the_request_is_the_cached_prefix_plus_one_instruction(
    model: str,
) -> None:
    messages = chat(6)
    completer = FakeCompleter("", SUMMARY)  # the normal prompt's empty reply escalates
    result = await run(messages, 0.5, completer, model=model)
    (originals,) = result.verbatim.values()
    stop = messages.index(originals[-1]) + 1
    for request, used, _ in completer.calls:
        assert used == "gpt-4o"  # make_config's conversation model
        *head, instruction = request
        # Byte for byte the prefix the provider has cached: the messages up to the span's end.
        assert orjson.dumps(head) == orjson.dumps(messages[:stop])
        assert orjson.dumps(request).startswith(orjson.dumps(messages[:stop])[:-1])
        assert instruction["role"] == "user"
        assert f"the last {len(originals)} messages above" in instruction["content"]
        assert "file path" in instruction["content"]
    assert len(completer.calls) == 2
    assert "terse bullet points" in completer.calls[1][0][-1]["content"]
    assert SUMMARY in message_text(result.messages[1])


async def test_another_model_gets_a_fresh_prompt_since_it_cannot_share_the_cache() -> None:
    completer = FakeCompleter()
    await run(chat(6), 0.5, completer, model="gpt-4o-mini")
    ((request, _, _),) = completer.calls
    assert [m["role"] for m in request] == ["system", "user"]
    assert "src/app_0.py" in request[1]["content"]


async def test_a_span_over_max_input_chars_gets_the_fresh_prompt_it_can_cut() -> None:
    completer = FakeCompleter()
    await run(chat(6), 0.5, completer, model="", max_input_chars=1000)
    ((request, _, _),) = completer.calls
    assert [m["role"] for m in request] == ["system", "user"]
    assert "[…]" in request[1]["content"]
