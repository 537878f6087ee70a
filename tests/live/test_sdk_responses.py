"""The real openai SDK's Responses client through compactd on real sockets."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import httpx
import openai
import pytest

from tests.api_fakes import FakeResponses
from tests.dialects.conversations import responses_input
from tests.upstream import serve


@pytest.fixture
async def fake_responses():
    fake = FakeResponses()
    async with serve(fake) as url:
        yield fake, f"{url}/v1"


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-alpha", max_retries=0)


def call_reply(fake: FakeResponses, name: str = "shell") -> Any:
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        call = {
            "type": "function_call",
            "id": f"fc_r{fake.counter}",
            "call_id": f"call_r{fake.counter}",
            "name": name,
            "arguments": '{"command":["ls"]}',
            "status": "completed",
        }
        return {"output": [fake.reasoning("list files"), call]}

    return reply


async def test_responses_create_round_trips_function_calls_and_reasoning(
    fake_responses, make_proxy
) -> None:
    fake, base = fake_responses
    fake.replies.append(call_reply(fake))
    async with make_proxy(base) as url:
        sdk = client(url)
        items: list[Any] = [{"role": "user", "content": "List the files."}]
        raw = await sdk.responses.with_raw_response.create(
            model="gpt-5", input=items, include=["reasoning.encrypted_content"], store=False
        )
        first = raw.parse()
        assert raw.headers["x-compactd-action"] == "passthrough"
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls
        assert calls[0].name == "shell"
        # The client sends the output back with the call's result, as an agent loop does.
        items += [o.model_dump(exclude_none=True) for o in first.output]
        items.append(
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.py"}
        )
        raw = await sdk.responses.with_raw_response.create(model="gpt-5", input=items, store=False)
        second = raw.parse()
        assert second.output_text == "Done."
        assert fake.refused == []
        assert raw.headers["x-compactd-action"] == "passthrough"
        assert (
            hashlib.sha256(fake.last.body).hexdigest()
            == hashlib.sha256(raw.http_request.content).hexdigest()
        )
        await sdk.close()


async def test_streamed_responses_arrive_event_for_event(fake_responses, make_proxy) -> None:
    _fake, base = fake_responses
    async with make_proxy(base) as url:
        sdk = client(url)
        kinds = []
        async with sdk.responses.stream(model="gpt-5", input="Say done.") as stream:
            async for event in stream:
                kinds.append(event.type)
            final = await stream.get_final_response()
        assert final.output_text == "Done."
        assert kinds[0] == "response.created"
        assert kinds[-1] == "response.completed"
        await sdk.close()


async def test_an_agent_run_over_budget_is_compacted_replayed_and_restored(
    fake_responses, make_proxy
) -> None:
    fake, base = fake_responses
    async with make_proxy(base, default_policy={"budget_tokens": 4000}) as url:
        sdk = client(url)
        items = responses_input(fake, 30)
        raw = await sdk.responses.with_raw_response.create(model="gpt-5", input=items, store=False)
        raw.parse()
        assert raw.headers["x-compactd-action"] == "compacted"
        assert fake.refused == []
        sent = fake.last.json()["input"]
        fake.counter += 1
        items += [
            fake.reasoning("again"),
            {"type": "function_call", "call_id": "call_n", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_n", "output": "ok"},
        ]
        stream_headers = {}
        async with sdk.responses.with_streaming_response.create(
            model="gpt-5", input=items, store=False, stream=True
        ) as response:
            stream_headers = response.headers
            async for _ in response.iter_lines():
                pass
        assert stream_headers["x-compactd-action"] == "replayed"
        assert fake.last.json()["input"][: len(sent)] == sent
        async with httpx.AsyncClient() as http:
            restored = await http.post(
                f"{url}/compactd/v1/uncompress",
                json={"api": "responses", "input": sent},
                headers={"authorization": "Bearer sk-alpha"},
            )
        assert restored.json()["input"] == items[: len(restored.json()["input"])]
        assert restored.json()["missing_ids"] == []
        await sdk.close()


async def test_usage_of_a_streamed_image_generation_is_read_past_its_long_events(
    fake_responses, make_proxy
) -> None:
    fake, base = fake_responses
    # A generated image's base64 (~1.5 MB) is in three events, each over the 1 MiB limit.
    image = {"type": "image_generation_call", "id": "ig_1", "status": "completed"}
    image["result"] = base64.b64encode(bytes(range(256)) * 4500).decode()
    fake.replies.append(lambda body: {"output": [image, fake.message("Here it is.")]})
    async with make_proxy(base) as url:
        sdk = client(url)
        async with sdk.responses.stream(model="gpt-5", input="Draw a cat.") as stream:
            final = await stream.get_final_response()
        await sdk.close()
        async with httpx.AsyncClient(headers={"authorization": "Bearer sk-alpha"}) as http:
            metrics = (await http.get(f"{url}/metrics")).text
    assert final.usage is not None
    prompt = 'compactd_upstream_usage_tokens_total{api="responses",kind="prompt",model="gpt-5"}'
    assert f"{prompt} {float(final.usage.input_tokens)}" in metrics
