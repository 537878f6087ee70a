"""Issue 32, row 3: a request head or body that never finishes is answered 408 and closed, and a
worker holds at most `limits.max_connections` connections (one more: 503 at once), on sockets."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

SHORT = {"limits": {"head_timeout_seconds": 0.5, "body_timeout_seconds": 0.5}}
WAIT = 20.0  # what a test waits for an answer at most: never reached unless the bound is broken


async def _exchange(url: str, data: bytes, *, pause: float = 0.0) -> tuple[int, dict[str, Any]]:
    """Send `data` on a new connection and read until the server closes it: (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)
        raw = await asyncio.wait_for(reader.read(), WAIT)  # to EOF: the server closed
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, json.loads(body) if body else {}


async def test_a_head_that_never_finishes_gets_408_and_is_closed(upstream, make_proxy) -> None:
    async with make_proxy(upstream[1], **SHORT) as url:
        partial = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: "
        status, body = await _exchange(url, partial)
        anthropic = await _exchange(url, b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n")
        silent = await _exchange(url, b"")
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert body["error"]["type"] == "invalid_request_error"
    assert anthropic[0] == 408
    assert anthropic[1]["type"] == "error"  # Anthropic's shape on its API
    assert silent[0] == 408


async def test_a_body_that_stops_arriving_gets_408_and_is_closed(upstream, make_proxy) -> None:
    fake, base = upstream
    async with make_proxy(base, **SHORT) as url:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-a\r\n"
            b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
        )
        status, body = await _exchange(url, head + b'{"model": "gpt-4o", ')
        async with httpx.AsyncClient() as http:
            healthy = await http.get(f"{url}/healthz")
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert not fake.received  # nothing of it went upstream
    assert healthy.status_code == 200


async def test_a_slow_body_that_keeps_arriving_is_served(upstream, make_proxy) -> None:
    async with make_proxy(upstream[1], limits={"body_timeout_seconds": 5.0}) as url:
        payload = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})

        async def trickle() -> Any:
            for piece in (payload[:10], payload[10:30], payload[30:]):
                yield piece.encode()
                await asyncio.sleep(0.3)  # slower than a burst, far faster than the deadline

        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{url}/v1/chat/completions",
                content=trickle(),
                headers={"authorization": "Bearer sk-a", "content-type": "application/json"},
            )
    assert r.status_code == 200


async def _healthz_once_they_are_gone(url: str) -> int:
    """/healthz's status once the worker has seen the held connections close (it may take a
    moment: their close reaches the server after the client's)."""
    for _ in range(200):
        status, _ = await _exchange(
            url, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        if status != 503:
            return status
        await asyncio.sleep(0.05)
    return 503


async def test_one_connection_past_the_cap_is_refused_with_503_at_once(
    upstream, make_proxy
) -> None:
    limits = {"max_connections": 5, "head_timeout_seconds": 30.0}
    async with make_proxy(upstream[1], limits=limits) as url:
        host, port = url.removeprefix("http://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(5)]
        try:
            # Accepted in order: the five are the worker's before this one is.
            status, body = await _exchange(url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        finally:
            for _, writer in held:
                writer.close()
        after = await _healthz_once_they_are_gone(url)
    assert status == 503
    assert body["error"]["code"] == "too_many_connections"
    assert after == 200


async def test_a_late_second_head_on_a_kept_alive_connection_gets_408(upstream, make_proxy) -> None:
    async with make_proxy(upstream[1], **SHORT) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nGET /healthz HTTP/1.1\r\n")
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), WAIT)  # to the close
        finally:
            writer.close()
    assert raw.startswith(b"HTTP/1.1 200")  # the first request's answer, whole
    assert raw.count(b"HTTP/1.1 408") == 1  # then the late head's
    assert b"request_timeout" in raw
