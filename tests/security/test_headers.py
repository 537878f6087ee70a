"""Issue 11, item 3: request heads are bounded before they are parsed, with a 431 (OpenAI-shaped;
Anthropic-shaped on Anthropic's paths)."""

from __future__ import annotations

import asyncio
from unittest.mock import ANY
from urllib.parse import urlsplit

import httpx
import orjson

HANG_GUARD = 30


async def _raw(url: str, chunks: list[bytes]) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers before closing."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        for chunk in chunks:
            if reader.at_eof():
                break
            writer.write(chunk)
            try:
                await writer.drain()
            except ConnectionError:
                break
        return await reader.read()
    except ConnectionError:
        return b""
    finally:
        writer.close()


def _head(extra: bytes) -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + extra


async def _assert_431(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), head[:80]
    assert orjson.loads(body)["error"]["code"] == "request_headers_too_large"


async def test_a_huge_header_is_refused_while_it_arrives(upstream, make_proxy) -> None:
    fake, base = upstream
    async with make_proxy(base) as url, asyncio.timeout(HANG_GUARD):
        # 16 MB in 64 KiB pieces: refused after the first ones, long before the end.
        pieces = [_head(b"x-big: ")] + [b"a" * 65536] * 256
        answer = await _raw(url, pieces)
        async with httpx.AsyncClient() as http:
            ok = await http.get(f"{url}/healthz")
    await _assert_431(answer)
    assert ok.status_code == 200
    assert fake.received == []


async def test_too_many_headers_are_refused(upstream, make_proxy) -> None:
    _, base = upstream
    async with make_proxy(base, server={"max_headers": 20}) as url, asyncio.timeout(HANG_GUARD):
        fields = b"".join(b"x-h%d: v\r\n" % i for i in range(40))
        answer = await _raw(url, [_head(fields + b"content-length: 0\r\n\r\n")])
    await _assert_431(answer)


async def test_a_long_request_line_counts_too(upstream, make_proxy) -> None:
    _, base = upstream
    async with make_proxy(base, server={"max_header_bytes": 4096}) as url:
        async with asyncio.timeout(HANG_GUARD):
            answer = await _raw(url, [b"GET /v1/models?q=" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"])
    await _assert_431(answer)


async def test_a_messages_request_over_the_limits_is_refused_in_anthropics_shape(
    upstream, make_proxy
) -> None:
    _, base = upstream
    async with make_proxy(base) as url, asyncio.timeout(HANG_GUARD):
        head = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-big: "
        answer = await _raw(url, [head] + [b"a" * 65536] * 4)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), head[:80]
    assert orjson.loads(body)["type"] == "error"
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_headers_under_the_limits_pass_untouched(upstream, make_proxy) -> None:
    fake, base = upstream
    async with make_proxy(base) as url, httpx.AsyncClient() as http:
        r = await http.get(f"{url}/v1/models", headers={"x-long": "b" * 30000})
    assert r.status_code == 200
    assert fake.last.header("x-long") == "b" * 30000


async def test_the_app_itself_refuses_too_many_headers_under_any_server(tmp_path) -> None:
    from proxy.app.application import create_app
    from proxy.config import load_settings

    settings = load_settings(
        None, env={}, overrides={"server": {"data_dir": str(tmp_path), "max_headers": 10}}
    )
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as http:
        r = await http.get("/healthz", headers={f"x-h{i}": "v" for i in range(20)})
        m = await http.post("/v1/messages", headers={f"x-h{i}": "v" for i in range(20)})
    assert r.status_code == 431
    assert r.json()["error"]["code"] == "request_headers_too_large"
    assert m.status_code == 431
    assert m.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": ANY}}
