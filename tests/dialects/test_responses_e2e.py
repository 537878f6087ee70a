"""POST /v1/responses through compactd: byte identity, compaction, replay, restore."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from tests.api_fakes import FakeResponses
from tests.dialects.conversations import responses_input
from tests.dialects.harness import harness

SMALL = {"default_policy": {"budget_tokens": 4000}}
TRIM = {"default_policy": {"budget_tokens": 3000, "providers": ["trim"]}}
PROSE = "The service switches blue-green, with a health check on every node. " * 12
Json = dict[str, Any]


def request(items: list[Json], **extra: Any) -> Json:
    return {
        "model": "gpt-5",
        "instructions": "You are Codex.",
        "input": items,
        "store": False,
        **extra,
    }


def research(fake: FakeResponses, turns: int, run: Callable[[int], list[Json]]) -> list[Json]:
    """A research conversation: each turn a question and the model's `run(turn)` for it."""
    items: list[Json] = [{"role": "user", "content": "Research the deployment."}]
    for t in range(turns):
        fake.counter += 1
        items += [{"role": "user", "content": f"And part {t}?"}, *run(t)]
    return [*items, {"role": "user", "content": "Summarize."}]


async def test_under_budget_the_request_goes_upstream_byte_for_byte(tmp_path) -> None:
    async with harness(tmp_path) as h:
        items = responses_input(h.responses, 3)
        raw = json.dumps(request(items), indent=1).encode()  # odd spacing survives too
        response = await h.client.post(
            "/v1/responses",
            content=raw,
            headers={"authorization": "Bearer sk-alpha", "content-type": "application/json"},
        )
        assert response.status_code == 200
        assert response.headers["x-compactd-action"] == "passthrough"
        assert response.headers["x-compactd-api"] == "responses"
        assert hashlib.sha256(h.responses.last.body).digest() == hashlib.sha256(raw).digest()
        assert int(response.headers["x-compactd-tokens-before"]) > 0


async def test_over_budget_it_is_compacted_validly_and_replayed_then_restored(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        items = responses_input(h.responses, 30)
        sent = await h.compacted("responses", request(items))
        # The final item, the last user prompt and the developer message are untouched.
        assert sent[-1] == items[-1]
        assert sent[0] == items[0]
        assert items[1] in sent
        # Every reasoning item that was sent is the upstream's own, followed by its call.
        for i, item in enumerate(sent):
            if item.get("type") == "reasoning":
                assert item in items
                assert sent[i + 1].get("type") == "function_call"

        # Next turn: the client appends the model's output and a new call's result.
        h.responses.counter += 1
        more = [
            *items,
            h.responses.reasoning("next step"),
            {"type": "function_call", "call_id": "call_x", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_x", "output": "ok"},
        ]
        second = await h.create(request(more))
        assert second.headers["x-compactd-action"] == "replayed", second.headers
        resent = h.responses.last.json()["input"]
        assert resent[: len(sent)] == sent  # the compacted prefix, item for item
        # Byte for byte: the first request's input, without its tail, opens the second's.
        first_raw = h.responses.received[-2].body
        cut = first_raw.index(orjson.dumps(sent[-1]))
        assert h.responses.last.body[:cut] == first_raw[:cut]
        assert h.responses.refused == []

        restored = await h.uncompress({"api": "responses", "input": sent})
        assert restored.status_code == 200, restored.text
        assert restored.json()["input"] == items
        assert restored.json()["missing_ids"] == []


@pytest.mark.parametrize(
    "history", [{"previous_response_id": "resp_1"}, {"conversation": {"id": "conv_1"}}]
)
async def test_server_side_history_is_forwarded_counted_and_said_so(tmp_path, history) -> None:
    async with harness(tmp_path, **SMALL) as h:
        items = responses_input(h.responses, 30)
        body = request(items, **history)
        raw = json.dumps(body).encode()
        response = await h.client.post(
            "/v1/responses",
            content=raw,
            headers={"authorization": "Bearer sk-alpha", "content-type": "application/json"},
        )
        assert response.headers["x-compactd-action"] == "server-history"
        assert h.responses.last.body == raw
        assert int(response.headers["x-compactd-tokens-before"]) > 4000


async def test_streamed_usage_is_read_from_response_completed(tmp_path) -> None:
    async with harness(tmp_path) as h:
        items = responses_input(h.responses, 2)
        response = await h.create(request(items, stream=True))
        assert response.status_code == 200
        assert b"event: response.completed" in response.content
        assert response.content == h.responses.answers[-1]  # every event, byte for byte
        assert h.metric("compactd_upstream_usage_tokens_total", kind="prompt") > 0
        assert h.metric("compactd_upstream_usage_tokens_total", kind="cached") == 0
        # The same prefix again: the cached tokens of response.completed are read as well.
        again = await h.create(request(items, stream=True))
        cached = json.loads(again.content.split(b"event: response.completed\ndata: ")[1])
        expected = cached["response"]["usage"]["input_tokens_details"]["cached_tokens"]
        assert expected > 0
        assert h.metric("compactd_upstream_usage_tokens_total", kind="cached") == expected


async def test_other_responses_paths_are_forwarded_unchanged(tmp_path) -> None:
    async with harness(tmp_path) as h:
        for method, path in [
            ("POST", "/v1/responses/compact"),
            ("GET", "/v1/responses/resp_1"),
            ("POST", "/v1/responses/input_tokens"),
        ]:
            raw = b'{"model":"gpt-5","input":[{"role":"user","content":"x"}]}'
            response = await h.client.request(
                method,
                path,
                content=raw if method == "POST" else None,
                headers={"authorization": "Bearer sk-alpha"},
            )
            assert response.status_code == 200
            assert h.responses.last.path == path
            assert "x-compactd-action" not in response.headers
            if method == "POST":
                assert h.responses.last.body == raw


async def test_no_spelling_of_the_path_gets_around_compaction(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        items = responses_input(h.responses, 30)
        raw = json.dumps(request(items)).encode()
        auth = {"authorization": "Bearer sk-alpha", "content-type": "application/json"}
        for path in ("/v1/responses/", "/v1/%72esponses", "/v1//responses"):
            response = await h.client.post(path, content=raw, headers=auth)
            assert response.headers["x-compactd-action"] in ("compacted", "replayed"), path
            assert h.responses.last.path == "/v1/responses"
        refused = await h.client.post("/v1/responses%2f", content=raw, headers=auth)
        assert refused.status_code == 400  # a path that only names the route once decoded


async def test_a_policy_can_match_the_api_and_metrics_carry_it(tmp_path) -> None:
    agents = {"name": "agents", "match_apis": ["responses"], "budget_tokens": 4000}
    async with harness(tmp_path, policies=[agents]) as h:
        items = responses_input(h.responses, 30)
        response = await h.create(request(items))
        assert response.headers["x-compactd-policy"] == "agents"
        assert response.headers["x-compactd-action"] == "compacted"
        assert h.metric("compactd_requests_total", action="compacted", api="responses") == 1
        assert h.metric("compactd_requests_total", api="chat.completions") == 0


async def test_a_run_with_two_answers_is_rewritten_into_a_request_the_api_accepts(tmp_path) -> None:
    async with harness(tmp_path, **TRIM) as h:
        fake = h.responses
        items = research(
            fake,
            12,
            lambda t: [
                fake.reasoning(f"search for part {t}"),
                fake.message(f"Part {t}, first: {PROSE}") | {"id": f"msg_a{t}"},
                {"type": "web_search_call", "id": f"ws_{t}", "status": "completed", "action": {}},
                fake.reasoning(f"answer part {t}"),
                fake.message(f"Part {t}, then: {PROSE}") | {"id": f"msg_b{t}"},
            ],
        )
        # Runs are rewritten (their text in their first message), not only dropped.
        sent = await h.compacted("responses", request(items))
        rewritten = [i for i in sent if "compactd:ref" in json.dumps(i) and "id" in i]
        assert rewritten
        assert all(item["id"].startswith("msg_a") for item in rewritten)
        restored = await h.uncompress({"api": "responses", "input": sent})
        assert restored.json()["input"] == items


async def test_a_restore_keeps_the_breakpoints_of_the_items_sent_as_they_were(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        items = responses_input(h.responses, 30)
        mark = {"mode": "explicit", "ttl": "30m"}
        prompt = {"type": "input_text", "text": "Go on.", "prompt_cache_breakpoint": mark}
        items.append({"role": "user", "content": [prompt]})
        sent = await h.compacted("responses", request(items))
        assert sent[-1] == items[-1]
        restored = await h.uncompress({"api": "responses", "input": sent})
        # What the client resends from a restore is cached where it asked for it.
        assert restored.json()["input"] == items


async def test_the_run_after_a_reference_to_reasoning_is_kept_with_it(tmp_path) -> None:
    async with harness(tmp_path, **TRIM) as h:

        def answer(t: int) -> list[Json]:
            reasoning = h.responses.reasoning(f"think about part {t}")
            return [reasoning, h.responses.message(f"Part {t}: {PROSE}") | {"id": f"msg_{t}"}]

        items = research(h.responses, 24, answer)
        # A client with `store: true` sends the reasoning of an old turn by reference: pinned,
        # and the answer it belongs to must stay right after it.
        items[2] = {"type": "item_reference", "id": items[2]["id"]}
        sent = await h.compacted("responses", request(items, store=True))
        at = sent.index(items[2])
        assert sent[at + 1] == items[3]
