"""A Responses stream refused inside a 200 as too long is retried compacted, like a 400.

The API answers a streamed request over its model's window with `response.created`,
`response.in_progress`, an `error` event (`context_length_exceeded`) and `response.failed`
(`proxy.chat.stream_overflow`). The first tests run compactd in-process before the fake Responses API; those
about what reaches the client when run compactd and a scripted upstream on real sockets.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from tests.api_fakes import OVERFLOW_MESSAGE, sse_event, true_tokens
from tests.dialects.conversations import responses_input
from tests.dialects.harness import harness
from tests.tiny_model import tiny_model
from tests.upstream import stream

Json = dict[str, Any]
# tiny-1: a 4,000-token window, so a request of 2,000-3,800 tokens is sent uncompacted and
# near enough to its window to be held.
TURNS = 3


def request(items: list[Json], **extra: Any) -> Json:
    return {"model": "tiny-1", "instructions": "You are Codex.", "input": items, **extra}


def near_window(response: httpx.Response) -> None:
    """The request was forwarded as it was, at half its window or more."""
    assert 2000 <= int(response.headers["x-compactd-tokens-before"]) <= 3800, response.headers


async def test_a_stream_refused_inside_a_200_as_too_long_is_retried_compacted(tmp_path) -> None:
    async with harness(tmp_path, tokens=tiny_model(tmp_path)) as h:
        items = responses_input(h.responses, TURNS)
        h.responses.window = true_tokens(items) - 1
        response = await h.create(request(items, stream=True))
        near_window(response)
        assert h.responses.refused == [OVERFLOW_MESSAGE]
        assert len(h.responses.received) == 2
        assert response.status_code == 200
        assert response.headers["x-compactd-retried"] == "context-length"
        assert response.headers["x-compactd-action"] == "compacted"
        # The client gets the retry's stream alone, byte for byte: none of the refusal's events.
        assert response.content == h.responses.answers[-1]
        assert b"event: response.completed" in response.content
        retry = h.responses.last.json()
        assert retry["stream"] is True
        assert true_tokens(retry["input"]) <= h.responses.window
        overflows = "compactd_context_overflows_total"
        assert h.metric(overflows, where="stream", outcome="retried") == 1


async def test_a_stream_refused_that_no_retry_can_shrink_reaches_the_client_as_sent(
    tmp_path,
) -> None:
    async with harness(tmp_path, tokens=tiny_model(tmp_path)) as h:
        # One prompt, nothing before it to compact: a retry would send the same.
        prompt = " ".join(f"word{i % 997}" for i in range(1000))
        h.responses.window = true_tokens(prompt) - 1
        response = await h.create(request([{"role": "user", "content": prompt}], stream=True))
        near_window(response)
        assert len(h.responses.received) == 1
        assert response.content == h.responses.answers[-1]
        assert b"context_length_exceeded" in response.content
        overflows = "compactd_context_overflows_total"
        assert h.metric(overflows, where="stream", outcome="relayed") == 1


async def test_a_request_that_does_not_stream_is_retried_after_the_apis_400(tmp_path) -> None:
    async with harness(tmp_path, tokens=tiny_model(tmp_path)) as h:
        items = responses_input(h.responses, TURNS)
        h.responses.window = true_tokens(items) - 1
        response = await h.create(request(items))
        assert h.responses.refused == [OVERFLOW_MESSAGE]
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-retried"] == "context-length"
        overflows = "compactd_context_overflows_total"
        assert h.metric(overflows, where="response", outcome="retried") == 1


async def test_with_the_wait_off_a_stream_is_relayed_with_its_refusal(tmp_path) -> None:
    overrides = {"tokens": tiny_model(tmp_path), "upstream": {"stream_overflow_wait_ms": 0}}
    async with harness(tmp_path, **overrides) as h:
        items = responses_input(h.responses, TURNS)
        h.responses.window = true_tokens(items) - 1
        response = await h.create(request(items, stream=True))
        near_window(response)
        assert len(h.responses.received) == 1
        assert response.content == h.responses.answers[-1]
        assert b"context_length_exceeded" in response.content
        assert "x-compactd-retried" not in response.headers
        assert h.metric("compactd_context_overflows_total", where="stream", outcome="relayed") == 0


# --- over real sockets ----------------------------------------------------------------------


def announced(seq: int = 0) -> list[bytes]:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    return [
        sse_event("response.created", {"type": "response.created", "response": response}),
        sse_event("response.in_progress", {"type": "response.in_progress", "response": response}),
    ]


def answered(text: str) -> list[bytes]:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
    done = {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
    done["usage"] = {"input_tokens": 9, "output_tokens": 1, "total_tokens": 10}
    return [
        *announced(),
        sse_event(
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
        sse_event(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "output_index": 0,
                "content_index": 0,
                "item_id": "msg_1",
                "delta": text,
            },
        ),
        sse_event("response.completed", {"type": "response.completed", "response": done}),
    ]


def failed(code: str, message: str) -> list[bytes]:
    error = {"type": "error", "code": code, "message": message, "param": None}
    response = {"id": "resp_1", "object": "response", "status": "failed", "output": []}
    response["error"] = {"code": code, "message": message}
    end = {"type": "response.failed", "response": response}
    return [*announced(), sse_event("error", error), sse_event("response.failed", end)]


def conversation(words: int) -> list[Json]:
    """A chat of ten turns, `words` in all: what a retry can compact."""
    per = words // 10
    return [
        {
            "role": "user" if t % 2 == 0 else "assistant",
            "content": " ".join(f"word{(t * per + i) % 997}" for i in range(per)),
        }
        for t in range(10)
    ] + [{"role": "user", "content": "And now?"}]


def body(words: int, model: str = "tiny-1") -> bytes:
    return json.dumps({"model": model, "stream": True, "input": conversation(words)}).encode()


NEAR = 1000  # words: ~2,900 tokens of tiny-1's 4,000


async def test_the_openai_sdk_streams_the_answer_to_the_retry(
    upstream, make_proxy, tmp_path
) -> None:
    fake, base = upstream
    fake.then(stream(failed("context_length_exceeded", OVERFLOW_MESSAGE)), stream(answered("ok")))
    async with make_proxy(base, tokens=tiny_model(tmp_path)) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        raw = await sdk.responses.with_raw_response.create(
            model="tiny-1",
            input=conversation(NEAR),  # type: ignore[arg-type]
            stream=True,
        )
        kinds = [event.type async for event in raw.parse()]
        await sdk.close()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_text.delta",
        "response.completed",
    ]
    assert raw.headers["x-compactd-retried"] == "context-length"
    assert len(fake.received) == 2
    assert len(fake.received[1].body) < 0.8 * len(fake.received[0].body)


async def test_a_stream_failing_for_another_reason_reaches_the_client_as_sent(
    upstream, make_proxy, tmp_path
) -> None:
    fake, base = upstream
    events = failed("server_error", "The server had an error.")
    fake.then(stream(events))
    async with make_proxy(base, tokens=tiny_model(tmp_path)) as url, httpx.AsyncClient() as c:
        r = await c.post(f"{url}/v1/responses", content=body(NEAR))
    near_window(r)
    assert r.content == b"".join(events)
    assert len(fake.received) == 1


@pytest.mark.parametrize(
    ("words", "model", "wait_ms", "gate_at"),
    [(NEAR, "tiny-1", 600_000, 3), (NEAR, "tiny-1", 50, 1), (50, "gpt-5", 600_000, 1)],
    ids=[
        "near-the-window-held-until-the-first-telling-event",
        "near-the-window-held-until-the-wait-runs-out",
        "far-below-the-window-never-held",
    ],
)
async def test_a_stream_that_reports_no_overflow_goes_out_as_it_arrives(
    upstream, make_proxy, tmp_path, words, model, wait_ms, gate_at
) -> None:
    fake, base = upstream
    gate = asyncio.Event()
    events = answered("ok")
    # The upstream sends its events after the first `gate_at` only once the client has its
    # first bytes: a hold that lasted past the first telling event (the third,
    # `response.output_item.added`), past the wait, or at all far below the window would
    # never end.
    fake.then(stream(events, gate=gate, gate_at=gate_at))
    proxy = make_proxy(
        base, tokens=tiny_model(tmp_path), upstream={"stream_overflow_wait_ms": wait_ms}
    )
    async with proxy as url, httpx.AsyncClient() as client:
        async with client.stream("POST", f"{url}/v1/responses", content=body(words, model)) as r:
            chunks = r.aiter_raw()
            first = await asyncio.wait_for(anext(chunks), 10)
            gate.set()
            rest = b"".join([c async for c in chunks])
    assert first.startswith(b"event: response.created\n")
    assert first + rest == b"".join(events)
