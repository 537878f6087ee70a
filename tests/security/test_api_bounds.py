"""Issue 11, item 7: every endpoint of compactd's own API is bounded, with OpenAI-shaped errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson

KEY = {"authorization": "Bearer sk-api"}
LIMIT = {"server": {"max_api_body_bytes": 1 << 20}}


async def _chunks(total: int) -> AsyncIterator[bytes]:
    yield b'{"messages": [{"role": "user", "content": "'
    for _ in range(total // 65536):
        yield b"x" * 65536
    yield b'"}]}'


def _is_413(r: httpx.Response) -> bool:
    return r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


async def test_uncompress_refuses_a_body_over_the_limit_declared_or_streamed(
    upstream, make_proxy
) -> None:
    async with make_proxy(upstream[1], **LIMIT) as url, httpx.AsyncClient(headers=KEY) as http:
        declared = await http.post(
            f"{url}/compactd/v1/uncompress",
            content=b"x" * (2 << 20),
            headers={"content-type": "application/json"},
        )
        streamed = await http.post(f"{url}/compactd/v1/uncompress", content=_chunks(3 << 20))
        fine = await http.post(
            f"{url}/compactd/v1/uncompress", json={"messages": [{"role": "user", "content": "hi"}]}
        )
    assert _is_413(declared)
    assert _is_413(streamed)
    assert fine.status_code == 200


async def test_uncompress_with_tens_of_thousands_of_ids_answers(upstream, make_proxy) -> None:
    markers = " ".join(f"[compactd:ref={i:010x}]" for i in range(40_000))
    body = orjson.dumps({"messages": [{"role": "user", "content": markers}]})
    async with make_proxy(upstream[1]) as url, httpx.AsyncClient(headers=KEY) as http:
        r = await http.post(f"{url}/compactd/v1/uncompress", content=body)
    assert r.status_code == 200
    assert len(r.json()["missing_ids"]) == 40_000


async def test_an_absurd_stats_window_is_a_400_not_a_500(upstream, make_proxy) -> None:
    admin = {"authorization": "Bearer admin-k"}
    async with make_proxy(upstream[1], server={"admin_key": "admin-k"}) as url:
        async with httpx.AsyncClient(headers=admin) as http:
            huge = await http.get(f"{url}/compactd/v1/stats?since=99999999999999d")
            digits = await http.get(f"{url}/compactd/v1/stats?since={'9' * 5000}d")
    assert huge.status_code == 400
    assert digits.status_code == 400
    assert huge.json()["error"]["type"] == "invalid_request_error"


async def test_a_method_an_endpoint_does_not_take_is_an_openai_shaped_405(
    upstream, make_proxy
) -> None:
    async with make_proxy(upstream[1]) as url, httpx.AsyncClient(headers=KEY) as http:
        answers = [
            await http.get(f"{url}/compactd/v1/uncompress"),
            await http.post(f"{url}/compactd/v1/conversations/c1"),
            await http.put(f"{url}/compactd/v1/stats"),
        ]
    assert [r.status_code for r in answers] == [405, 405, 405]
    assert all(r.json()["error"]["code"] == "method_not_allowed" for r in answers)
    assert answers[0].headers["allow"] == "POST"
