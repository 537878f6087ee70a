"""Issue 11, item 12: chat paths however spelled get the chat route; encoded dot-segments, and
spellings only a lenient upstream would read as a compacted route, are refused; `Expect:
100-continue` never reaches the upstream."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from urllib.parse import urlsplit

import orjson
import pytest

from tests.security.conftest import SMALL, history
from tests.upstream import chat_completion, serve_raw

KEY = b"authorization: Bearer sk-paths\r\n"
HANG_GUARD = 20


async def _raw(url: str, method: str, path: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    ).encode()
    writer.write(head + KEY + extra + b"\r\n" + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def _status(answer: bytes) -> int:
    """The final status (after any `100 Continue` our server sent first)."""
    if answer.startswith(b"HTTP/1.1 100"):
        answer = answer.split(b"\r\n\r\n", 1)[1]
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize(
    "path", ["/v1/chat/%63ompletions", "/v1/chat/completions/", "/v1//chat/completions"]
)
async def test_every_spelling_of_the_chat_path_is_compacted(upstream, make_proxy, path) -> None:
    fake, base = upstream
    body = orjson.dumps({"model": "gpt-4o", "messages": history(6)})
    async with make_proxy(base, **SMALL) as url, asyncio.timeout(HANG_GUARD):
        answer = await _raw(url, "POST", path, body)
    assert _status(answer) == 200
    assert b"x-compactd-action: compacted" in answer
    assert fake.last.path == "/v1/chat/completions"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/files/%2e%2e/admin",
        "/v1/files/%2f..%2fadmin",
        "/v1/files/..%5cadmin",
        "/v1/files/%252e%252e%252fadmin",
        "/v1/chat%2fcompletions",
        # What a lenient server (ASP.NET, servlet containers) would take as the chat route:
        "/v1/chat/COMPLETIONS",
        "/v1/chat/completions;jsessionid=1",
        "/v1/chat/completions%20",
        "/v1/chat/completions%00",
        "/v1/Responses",
    ],
)
async def test_encoded_dot_segments_and_slashes_are_refused(upstream, make_proxy, path) -> None:
    fake, base = upstream
    async with make_proxy(base) as url, asyncio.timeout(HANG_GUARD):
        answer = await _raw(url, "POST", path, b"{}")
    assert _status(answer) == 400
    assert b'"invalid_path"' in answer
    assert fake.received == []


def _no_continue_upstream(seen: list[bytes]) -> AbstractAsyncContextManager[str]:
    """An upstream that never sends `100 Continue`: it waits for the body, then answers."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        body = orjson.dumps(chat_completion())
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    return serve_raw(handle)


async def test_expect_100_continue_is_answered_here_and_not_passed_on(make_proxy) -> None:
    seen: list[bytes] = []
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    async with _no_continue_upstream(seen) as base, make_proxy(base) as url:
        async with asyncio.timeout(HANG_GUARD):
            answer = await _raw(
                url, "POST", "/v1/chat/completions", body, b"expect: 100-continue\r\n"
            )
    assert _status(answer) == 200
    assert b"expect" not in seen[0].lower()
