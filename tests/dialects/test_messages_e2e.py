"""POST /v1/messages through compactd: its own upstream, byte identity, compaction, restore."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import pytest

from tests.dialects.conversations import messages_history, tool_output
from tests.dialects.harness import harness
from tests.tiny_model import table_entry, tiny_model

SMALL = {"default_policy": {"budget_tokens": 4000}}
THINKING = {"type": "enabled", "budget_tokens": 2000}
Json = dict[str, Any]


def request(messages: list[Json], **extra: Any) -> Json:
    return {
        "model": "claude-sonnet-5",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "thinking": THINKING,
        "messages": messages,
        **extra,
    }


async def test_messages_go_to_the_anthropic_upstream_byte_for_byte(tmp_path) -> None:
    async with harness(tmp_path) as h:
        msgs = messages_history(h.messages, 3)
        raw = json.dumps(request(msgs), indent=2).encode()
        response = await h.client.post(
            "/v1/messages",
            content=raw,
            headers={
                "x-api-key": "sk-ant-alpha",
                "anthropic-version": "2023-06-01",
                "anthropic-beta": "interleaved-thinking-2025-05-14",
            },
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-action"] == "passthrough"
        assert response.headers["x-compactd-api"] == "messages"
        assert h.responses.received == []
        last = h.messages.last
        assert hashlib.sha256(last.body).digest() == hashlib.sha256(raw).digest()
        assert last.header("x-api-key") == "sk-ant-alpha"
        assert last.header("anthropic-beta") == "interleaved-thinking-2025-05-14"


async def test_oauth_bearer_traffic_is_forwarded_with_its_authorization(tmp_path) -> None:
    async with harness(tmp_path) as h:
        response = await h.client.post(
            "/v1/messages",
            content=json.dumps(request([{"role": "user", "content": "hi"}])).encode(),
            headers={
                "authorization": "Bearer sk-ant-oat01-token",
                "anthropic-version": "2023-06-01",
            },
        )
        assert response.status_code == 200
        assert h.messages.last.header("authorization") == "Bearer sk-ant-oat01-token"


async def test_over_budget_it_is_compacted_validly_replayed_and_restored(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        msgs = messages_history(h.messages, 30)
        sent = await h.compacted("messages", request(msgs))
        assert sent[-2:] == msgs[-2:]  # the pending turn and its result, untouched
        # Next turn: the model answered, the agent appends its reply and a new result.
        h.messages.counter += 1
        more = [
            *msgs,
            {
                "role": "assistant",
                "content": [
                    h.messages.thinking("one more"),
                    {
                        "type": "tool_use",
                        "id": "toolu_n",
                        "name": "Bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_n", "content": "ok"}],
            },
        ]
        second = await h.message(request(more))
        assert second.headers["x-compactd-action"] == "replayed", second.text
        resent = h.messages.last.json()["messages"]
        assert resent[: len(sent) - 1] == sent[:-1]
        assert h.messages.refused == []
        first_raw = h.messages.received[-2].body
        cut = first_raw.index(orjson.dumps(sent[-2]))
        assert h.messages.last.body[:cut] == first_raw[:cut]
        restored = await h.uncompress({"api": "messages", "messages": sent})
        assert restored.status_code == 200, restored.text
        assert restored.json()["messages"] == msgs
        assert restored.json()["missing_ids"] == []


async def test_a_pending_turn_whose_results_share_their_message_with_text_is_kept(
    tmp_path,
) -> None:
    async with harness(tmp_path, **SMALL) as h:
        msgs = messages_history(h.messages, 30)
        # Claude Code appends text (a system reminder, an interruption) after the results.
        reminder = {"type": "text", "text": "<system-reminder>Keep going.</system-reminder>"}
        msgs[-1]["content"].append(reminder)
        sent = await h.compacted("messages", request(msgs))
        assert sent[-2:] == msgs[-2:]  # the pending turn, its results and the text, untouched
        restored = await h.uncompress({"api": "messages", "messages": sent})
        assert restored.json()["messages"] == msgs


async def test_a_history_with_a_reminder_in_every_turn_restores_exactly(tmp_path) -> None:
    # The engine folds whole Anthropic messages: its stand-in never ends inside one, so each is
    # restored as one message. (A stand-in of `trim` or `summarize` may end inside one and then
    # restores it as two: tests/providers/test_properties.py marks that as a known limitation.)
    async with harness(tmp_path, **SMALL) as h:
        msgs = messages_history(h.messages, 30)
        # Claude Code's user messages: a turn's result, then a reminder in the same message.
        # Units split there, so the stand-in for the dropped turns ends inside one of them.
        reminder = {"type": "text", "text": "<system-reminder>Keep going.</system-reminder>"}
        for message in msgs[2::2]:
            message["content"].append(reminder)
        sent = await h.compacted("messages", request(msgs))
        restored = await h.uncompress({"api": "messages", "messages": sent})
        assert restored.status_code == 200, restored.text
        assert restored.json()["missing_ids"] == []
        assert restored.json()["messages"] == msgs


async def test_a_turn_split_over_two_assistant_messages_stays_valid(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        msgs = messages_history(h.messages, 30)
        # Anthropic joins consecutive same-role messages: the text after this tool_use is part of
        # the turn its result must follow, so nothing may come between them.
        use = {"type": "tool_use", "id": "toolu_s", "name": "Bash", "input": {"command": "ls"}}
        result = {"type": "tool_result", "tool_use_id": "toolu_s", "content": tool_output(99, 40)}
        msgs[1:1] = [
            {"role": "assistant", "content": [use]},
            {"role": "assistant", "content": [{"type": "text", "text": tool_output(98, 20)}]},
            {"role": "user", "content": [result]},
        ]
        sent = await h.compacted("messages", request(msgs))
        assert sent[1:4] == msgs[1:4]


async def test_an_input_and_max_tokens_over_the_window_400_is_retried_compacted(
    tmp_path,
) -> None:
    async with harness(tmp_path, tokens=tiny_model(tmp_path)) as h:
        h.messages.window = 3000
        msgs = messages_history(h.messages, 8, size=12)
        body = {**request(msgs, model="tiny-1", max_tokens=1500)}
        del body["thinking"]
        response = await h.message(body)
        # The input fits the window, but not with its output: Anthropic says so in other words.
        assert h.messages.refused[0].startswith("input length and `max_tokens` exceed")
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-retried"] == "context-length"
        assert response.headers["x-compactd-action"] == "compacted"


async def test_count_tokens_under_budget_and_other_anthropic_paths_are_forwarded_unchanged(
    tmp_path,
) -> None:
    async with harness(tmp_path) as h:
        raw = json.dumps(
            {"model": "claude-sonnet-5", "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        response = await h.client.post(
            "/v1/messages/count_tokens",
            content=raw,
            headers={"x-api-key": "sk-ant-alpha", "anthropic-version": "2023-06-01"},
        )
        assert response.status_code == 200
        assert response.json()["input_tokens"] > 0
        assert h.messages.last.body == raw
        # Counted as compactd would forward it (tests/live/test_protocol_items.py): as is.
        assert response.headers["x-compactd-action"] == "passthrough"
        models = await h.client.get(
            "/v1/models", headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}
        )
        assert models.status_code == 200
        assert h.messages.last.path == "/v1/models"


async def test_our_own_errors_take_anthropics_shape_on_its_paths(tmp_path) -> None:
    async with harness(tmp_path, server={"max_body_bytes": 1000}) as h:
        response = await h.message(request([{"role": "user", "content": "x" * 5000}]))
        assert response.status_code == 413
        assert response.json() == {
            "type": "error",
            "error": {
                "type": "request_too_large",
                "message": "Request body exceeds the limit of 1000 bytes.",
            },
        }
        chat = await h.client.post("/v1/chat/completions", content=b"x" * 5000)
        assert chat.json()["error"]["code"] == "request_too_large"


async def test_streamed_usage_with_cache_reads_is_read(tmp_path) -> None:
    async with harness(tmp_path) as h:
        msgs = messages_history(h.messages, 12)
        msgs[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
        for _ in range(2):
            response = await h.message(request(msgs, stream=True))
            assert response.status_code == 200
            assert b"event: message_stop" in response.content
            assert response.content == h.messages.answers[-1]  # every event, byte for byte
        assert h.metric("compactd_upstream_usage_tokens_total", kind="cached") > 0
        assert h.metric("compactd_upstream_usage_tokens_total", kind="prompt") > 0


async def test_the_upstreams_own_counts_calibrate_the_estimate(tmp_path) -> None:
    async with harness(tmp_path) as h:
        msgs = messages_history(h.messages, 10)
        response = await h.message(request(msgs))
        estimate = int(response.headers["x-compactd-tokens-before"])
        usage = response.json()["usage"]
        actual = (
            usage["input_tokens"]
            + usage["cache_read_input_tokens"]
            + usage["cache_creation_input_tokens"]
        )
        ratio = h.services.calibration.ratio("messages", "claude-sonnet-5")
        assert ratio == pytest.approx(actual / estimate)
        assert ratio != 1.0
        assert h.services.calibration.ratio("responses", "claude-sonnet-5") == 1.0


async def test_an_error_echoing_a_client_figure_does_not_calibrate_other_tenants(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        msgs = messages_history(h.messages, 6)
        # Anthropic echoes an unknown tool_use_id in its 400: the attacker picks the figures.
        forged = "prompt is too long: 9000000 tokens > 200000 maximum"
        result = {"type": "tool_result", "tool_use_id": forged, "content": "x"}
        bogus = [*msgs[:-2], {"role": "user", "content": [result]}]
        refused = await h.message(request(bogus), key="sk-attacker")
        assert refused.status_code == 400
        assert forged in refused.json()["error"]["message"]
        assert h.services.calibration.ratio("messages", "claude-sonnet-5") == 1.0
        victim = await h.message(request(messages_history(h.messages, 3)), key="sk-victim")
        assert victim.headers["x-compactd-action"] == "passthrough"


async def test_a_document_the_estimate_never_sees_does_not_calibrate_other_tenants(
    tmp_path,
) -> None:
    async with harness(tmp_path, **SMALL) as h:
        h.messages.files["file_report"] = "quarterly figures " * 4000
        document = {"type": "document", "source": {"type": "file", "file_id": "file_report"}}
        ask = {"type": "text", "text": "Summarize this report. " + "Be precise. " * 400}
        sent = await h.message(
            request([{"role": "user", "content": [document, ask]}]), key="sk-documents"
        )
        assert sent.status_code == 200, sent.text
        assert sent.json()["usage"]["input_tokens"] > 4 * int(
            sent.headers["x-compactd-tokens-before"]
        )
        assert h.services.calibration.ratio("messages", "claude-sonnet-5") == 1.0
        victim = await h.message(request(messages_history(h.messages, 3)), key="sk-victim")
        assert victim.headers["x-compactd-action"] == "passthrough"


def _marked(msgs: list[Json], *positions: int) -> list[Json]:
    """A copy of `msgs` with Claude Code's breakpoints on the last block of these messages."""
    out: list[Json] = json.loads(json.dumps(msgs))
    for p in positions:
        out[p]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def _breakpoints(messages: list[Json]) -> list[int]:
    """The indexes of the messages that carry a breakpoint."""
    return [i for i, m in enumerate(messages) if '"cache_control"' in json.dumps(m)]


async def test_the_replayed_prefix_ends_on_a_client_breakpoint_and_is_read_from_cache(
    tmp_path,
) -> None:
    async with harness(tmp_path, default_policy={"budget_tokens": 8000}) as h:
        msgs = messages_history(h.messages, 50)
        # The system breakpoint, one on an old result (lost to compaction), one on the newest.
        first = request(_marked(msgs, 31, -1))
        sent = await h.compacted("messages", first)
        assert len(h.messages.breakpoints(h.messages.last.json())) <= 4
        marks = _breakpoints(sent)
        assert marks[-1] == len(sent) - 1  # the newest, where the client put it
        # The lost one moved to the end of the compacted prefix: the last message compactd made.
        moved = marks[-2]
        assert sent[moved] not in msgs
        tail = len(sent) - moved - 1  # after it, the client's own messages, marks and all
        assert sent[moved + 1 :] == first["messages"][-tail:]
        prefix = h.messages.prompt_tokens({**first, "messages": sent[: moved + 1]})
        assert prefix >= 1024  # long enough to be cached

        # Next turns: a burst of small calls, more blocks than the cache looks back over from
        # the client's new breakpoint, so only the moved breakpoint's entry can be read.
        more = list(msgs)
        for k in range(12):
            h.messages.counter += 1
            use = {"type": "tool_use", "id": f"toolu_b{k}", "name": "Bash", "input": {"c": "ls"}}
            result = {"type": "tool_result", "tool_use_id": f"toolu_b{k}", "content": "ok"}
            more.append({"role": "assistant", "content": [h.messages.thinking(f"b{k}"), use]})
            more.append({"role": "user", "content": [result]})
        second = await h.message(request(_marked(more, 31, -1)))
        assert second.headers["x-compactd-action"] == "replayed", second.text
        assert h.messages.refused == []
        resent = h.messages.last.json()["messages"]
        assert resent[: moved + 1] == sent[: moved + 1]  # breakpoint and all
        usage = second.json()["usage"]
        assert usage["cache_read_input_tokens"] >= prefix
        assert h.metric("compactd_upstream_usage_tokens_total", kind="cached") >= prefix


async def test_an_oauth_token_is_never_sent_to_the_openai_upstream_for_a_summary(tmp_path) -> None:
    policy = {"budget_tokens": 4000, "providers": ["summarize"]}
    async with harness(tmp_path, default_policy=policy) as h:
        msgs = messages_history(h.messages, 30)
        response = await h.message(request(msgs), authorization="Bearer sk-ant-oat01-token")
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-action"] == "compacted"
        assert h.messages.last.header("authorization") == "Bearer sk-ant-oat01-token"
        # The summary call goes to upstream.url (OpenAI): the Anthropic credential is not its.
        sent = [r.header("authorization") for r in h.responses.received]
        assert "Bearer sk-ant-oat01-token" not in sent


async def test_an_echoed_prompt_length_does_not_calibrate_every_tenants_budget(tmp_path) -> None:
    # An upstream validation error that quotes client input can state any "prompt is too long"
    # figures; taken as the upstream's count, one such request would quarter every tenant's
    # Claude budget (the ratio is per model, shared through the store).
    async with harness(tmp_path) as h:
        msgs = messages_history(h.messages, 10)
        crafted = "prompt is too long: 999999 tokens > 200000 maximum"
        msgs[-1]["content"].append({"type": "tool_result", "tool_use_id": crafted, "content": "x"})
        response = await h.message(request(msgs), key="sk-ant-attacker")
        assert response.status_code == 400
        assert crafted in response.json()["error"]["message"]
        assert int(response.headers["x-compactd-tokens-before"]) > 1000
        assert h.services.calibration.ratio("messages", "claude-sonnet-5") == 1.0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_turn_that_ran_server_tools_does_not_calibrate(tmp_path, stream: bool) -> None:
    # Web search and fetch results are read as input the request never carried: the upstream's
    # input count of such a turn says nothing about our estimate of what was sent.
    async with harness(tmp_path) as h:
        own = h.messages.usage

        def searched(body: Json) -> Json:
            usage = own(body)
            usage["input_tokens"] += 20_000
            usage["server_tool_use"] = {"web_search_requests": 2, "web_fetch_requests": 1}
            return usage

        h.messages.usage = searched  # type: ignore[method-assign]
        msgs = messages_history(h.messages, 10)
        response = await h.message(request(msgs, stream=stream))
        assert response.status_code == 200
        assert int(response.headers["x-compactd-tokens-before"]) > 1000
        assert h.services.calibration.ratio("messages", "claude-sonnet-5") == 1.0


async def test_the_1m_context_beta_gives_a_claude_request_its_window(tmp_path) -> None:
    # Claude Code's "[1m]" models send anthropic-beta: context-1m-...: a request past the
    # model's 200k-style window goes out as sent rather than compacted to fit it.
    models = tmp_path / "models.toml"
    models.write_text(
        table_entry("default", 32_768, 4_096) + table_entry("[models]", 20_000, 1_000, "claude-*")
    )
    async with harness(tmp_path, tokens={"models_file": str(models)}) as h:
        msgs = messages_history(h.messages, 60)
        beta = {"anthropic-beta": "interleaved-thinking-2025-05-14, context-1m-2025-08-07"}
        wide = await h.message(request(msgs), **beta)
        assert wide.status_code == 200
        assert int(wide.headers["x-compactd-tokens-before"]) > 20_000
        assert wide.headers["x-compactd-action"] == "passthrough"
        assert h.messages.last.body == h.sent[-1]
        assert (await h.message(request(msgs))).headers["x-compactd-action"] == "compacted"
