"""Issue 11, items 9, 10 and 12 (SSE): what an upstream sends is bounded and relayed correctly."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import httpx
import orjson
import pytest

from proxy.wire.usage import SSEUsageTap, usage_from_json
from tests.upstream import chat_completion, respond

KEY = {"authorization": "Bearer sk-upstream"}
CHAT = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_an_oversized_upstream_header_is_an_openai_shaped_502(
    upstream, make_proxy, path: str
) -> None:
    fake, base = upstream
    fake.then(respond(200, headers=[(b"x-huge", b"a" * 40_000)]))
    async with make_proxy(base) as url, httpx.AsyncClient(headers=KEY) as http:
        r = await http.post(f"{url}{path}", content=CHAT)
        fake.then(respond(200, headers=[(b"x-big", b"b" * 10_000)]))
        fine = await http.post(f"{url}{path}", content=CHAT)
    assert r.status_code == 502
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "upstream_bad_response"
    assert fine.status_code == 200
    assert fine.headers["x-big"] == "b" * 10_000


async def test_a_long_upstream_400_on_the_chat_path_is_relayed_whole(upstream, make_proxy) -> None:
    fake, base = upstream
    error = {"error": {"message": "bad request: " + "detail " * 40_000, "type": "x", "code": None}}
    raw = json.dumps(error).encode()
    assert len(raw) > 200_000
    fake.then(respond(400, raw))
    async with make_proxy(base) as url, httpx.AsyncClient(headers=KEY) as http:
        r = await http.post(f"{url}/v1/chat/completions", content=CHAT)
    assert r.status_code == 400
    assert r.content == raw
    assert int(r.headers["content-length"]) == len(raw)


def test_the_usage_tap_stops_holding_an_event_that_never_ends() -> None:
    tap = SSEUsageTap(strip_usage_chunk=True, max_event_bytes=64 * 1024)
    released = tap.feed(b'data: {"choices": [], "x": "' + b"a" * 40_000)
    more = tap.feed(b"a" * 40_000)  # past the limit: what was held goes out, as it came
    rest = tap.feed(b'"}\n\ndata: [DONE]\n\n')

    assert released == b""
    assert more == b'data: {"choices": [], "x": "' + b"a" * 80_000
    assert rest == b'"}\n\ndata: [DONE]\n\n'
    assert tap.close() == b""


@pytest.mark.parametrize("strip", [False, True], ids=["copy", "strip"])
def test_the_usage_tap_holds_at_most_one_bounded_event(strip: bool) -> None:
    piece = b"a" * (64 * 1024)
    tap = SSEUsageTap(strip_usage_chunk=strip, max_event_bytes=256 * 1024)
    tracemalloc.start()
    try:
        tap.feed(b'data: {"choices": [], "usage": {"x": "')
        for _ in range(128):  # an 8 MiB event without its blank line
            tap.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024


def test_the_usage_tap_does_not_inflate_a_gzip_bomb() -> None:
    bomb = gzip.compress(b"data: " + b"0" * (64 << 20))
    tap = SSEUsageTap(content_encoding="gzip", max_event_bytes=1 << 20)

    assert tap.feed(bomb) == bomb
    assert tap.usage is None
    assert usage_from_json(gzip.compress(b" " * (64 << 20)), "gzip") is None
    small = gzip.compress(json.dumps(chat_completion()).encode())
    assert usage_from_json(small, "gzip") is not None
