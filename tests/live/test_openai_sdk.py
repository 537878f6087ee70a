"""The official openai SDK works unchanged through compactd, for every kind of call."""

from __future__ import annotations

import io
import json

import openai
import pytest

from tests.upstream import chat_completion, respond, sse_chunks, stream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture
async def sdk_proxy(upstream, make_proxy):
    fake, base = upstream
    async with make_proxy(base) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        yield fake, client
        await client.close()


async def test_chat_non_stream_with_tools_n_and_json_mode(sdk_proxy) -> None:
    fake, client = sdk_proxy
    reply = chat_completion("{}", n=2)
    reply["choices"][0]["message"]["tool_calls"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
        }
    ]
    fake.then(respond(200, reply))
    messages = [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Bergen"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"temp": 7}'},
    ]
    out = await client.chat.completions.create(
        model="gpt-4o", messages=messages, tools=TOOLS, n=2, response_format={"type": "json_object"}
    )
    assert len(out.choices) == 2
    assert out.choices[0].message.tool_calls[0].function.name == "get_weather"
    sent = fake.last.json()
    assert sent["messages"] == messages
    assert sent["tools"] == TOOLS
    assert sent["n"] == 2


async def test_chat_stream_delivers_every_delta(sdk_proxy) -> None:
    fake, client = sdk_proxy
    fake.then(stream(sse_chunks(["The ", "sky ", "is ", "blue."])))
    got = [
        c.choices[0].delta.content
        async for c in await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "sky?"}], stream=True
        )
    ]
    assert "".join(got) == "The sky is blue."


async def test_images_in_content_parts_reach_upstream_unchanged(sdk_proxy) -> None:
    fake, client = sdk_proxy
    content = [
        {"type": "text", "text": "What is in this image?"},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + "iVBORw0KGgo" * 50, "detail": "low"},
        },
    ]
    raw = await client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": content}]
    )
    raw.parse()
    assert fake.last.json()["messages"][0]["content"] == content
    assert int(raw.headers["x-compactd-tokens-before"]) > 85  # the image's low-detail tokens count


async def test_models_embeddings_and_responses_pass_through(sdk_proxy) -> None:
    fake, client = sdk_proxy
    fake.then(
        respond(
            200,
            {
                "object": "list",
                "data": [{"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "openai"}],
            },
        ),
        respond(
            200,
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                "model": "text-embedding-3-small",
                "usage": {"prompt_tokens": 2, "total_tokens": 2},
            },
        ),
        respond(
            200,
            {
                "id": "resp_1",
                "object": "response",
                "created_at": 1,
                "model": "gpt-4o",
                "status": "completed",
                "output": [],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
            },
        ),
    )
    models = await client.models.list()
    emb = await client.embeddings.create(model="text-embedding-3-small", input="hello")
    resp = await client.responses.create(model="gpt-4o", input="hi")
    assert [m.id for m in models.data] == ["gpt-4o"]
    assert emb.data[0].embedding == [0.1, 0.2]
    assert resp.id == "resp_1"
    assert [r.path for r in fake.received] == ["/v1/models", "/v1/embeddings", "/v1/responses"]
    assert json.loads(fake.received[2].body)["input"] == "hi"


async def test_file_upload_multipart_reaches_upstream_intact(sdk_proxy) -> None:
    fake, client = sdk_proxy
    fake.then(
        respond(
            200,
            {
                "id": "file-1",
                "object": "file",
                "bytes": 6,
                "created_at": 1,
                "filename": "a.jsonl",
                "purpose": "batch",
                "status": "processed",
            },
        )
    )
    data = b'{"a":1}\n' * 1000
    f = await client.files.create(file=("a.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.id == "file-1"
    assert fake.last.header("content-type").startswith("multipart/form-data")
    assert data in fake.last.body


async def test_upstream_errors_reach_the_sdk_as_its_own_exceptions(sdk_proxy) -> None:
    fake, client = sdk_proxy
    fake.then(
        respond(
            429,
            {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}},
            headers=[(b"x-request-id", b"req_9")],
        )
    )
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.request_id == "req_9"
    assert info.value.message.endswith("slow down")
