"""A pooled upstream connection the upstream closes just as a request goes out on it.

The upstream here is a raw asyncio server that answers the first request of each connection with
keep-alive and closes the connection on the next request's bytes without answering: exactly the
race of an upstream's idle timeout, made deterministic. compactd sends such a request once more,
on a new connection, when it still holds the body; never a fresh connection's failure, a timeout
or a response that had started (proxy.wire.stale_retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import httpx
import pytest

from proxy.wire.stale_retry import ALREADY_RETRIED_BY_AIOHTTP
from tests.conftest import ProxyFactory
from tests.live.test_access import _metric
from tests.live.test_compaction_e2e import history
from tests.upstream import chat_completion, serve_raw

KEY = {"authorization": "Bearer sk-test-key"}
_ANSWER = json.dumps(chat_completion("from the upstream")).encode()


def _ok(body: bytes = _ANSWER, ctype: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (ctype, len(body))
    return head + body


Later = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close after reading the request: the client reads EOF (aiohttp: ServerDisconnected)."""
    del reader
    writer.close()


async def _reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0): the client reads ECONNRESET (aiohttp: ClientOSError)."""
    del reader
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


@dataclass
class StaleUpstream:
    """Answers each connection's first request; on its next request, runs `later` (by default
    closes the connection without a byte). Records every request body, per connection."""

    later: Later = _close
    bodies: list[bytes] = field(default_factory=list)
    paths: list[bytes] = field(default_factory=list)
    connections: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.paths.append(head.split(b" ", 2)[1])
                self.bodies.append(await reader.readexactly(_length(head)))
                served += 1
                if served > 1:
                    await self.later(reader, writer)
                    return
                writer.write(_ok())
                await writer.drain()
        writer.close()


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@contextlib.asynccontextmanager
async def stale(later: Later = _close) -> AsyncIterator[tuple[StaleUpstream, str]]:
    fake = StaleUpstream(later)
    async with serve_raw(fake.handle) as url:
        yield fake, url


def _chat(n: int = 2) -> bytes:
    return json.dumps({"model": "gpt-4o", "messages": history(n)}).encode()


async def _post(
    http: httpx.AsyncClient, body: bytes, path: str = "/v1/chat/completions"
) -> httpx.Response:
    return await http.post(path, content=body, headers={"content-type": "application/json"})


async def _retries(http: httpx.AsyncClient, outcome: str) -> float:
    return _metric(
        (await http.get("/metrics")).text, "compactd_upstream_retries_total", outcome=outcome
    )


FIRST, SECOND = _chat(2), _chat(4)


async def two_chats(
    make_proxy: ProxyFactory, later: Later = _close, **upstream: object
) -> tuple[StaleUpstream, httpx.Response, float]:
    """Two chat requests in a row on one pooled connection, the second meeting `later`: the
    upstream, the second response and how many retries succeeded."""
    async with (
        stale(later) as (fake, url),
        make_proxy(url, upstream=upstream) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        assert (await _post(http, FIRST)).status_code == 200
        response = await _post(http, SECOND)
        return fake, response, await _retries(http, "ok")


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("later", [_close, _reset], ids=["closed", "reset"])
async def test_a_chat_request_on_a_connection_the_upstream_just_closed_gets_the_answer(
    make_proxy: ProxyFactory, transport: str, later: Later
) -> None:
    fake, two, retried = await two_chats(make_proxy, later, transport=transport)
    assert two.status_code == 200
    assert two.content == _ANSWER  # the upstream's answer, byte for byte
    # Sent on the pooled connection (closed unanswered), then once more on a new one: the same
    # bytes each time, the ones the client sent (this request needs no compaction).
    assert fake.bodies == [FIRST, SECOND, SECOND]
    assert fake.connections == 2
    assert retried == 1


async def test_a_fresh_connection_closed_without_an_answer_is_a_502_sent_once(
    make_proxy: ProxyFactory,
) -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        bodies.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    bodies: list[bytes] = []
    async with (
        serve_raw(close_at_once) as url,
        make_proxy(url) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        response = await _post(http, _chat())
        retried = await _retries(http, "ok") + await _retries(http, "failed")
    assert response.status_code == 502
    assert "closed the connection without answering" in response.json()["error"]["message"]
    assert len(bodies) == 1  # a new connection's failure is the upstream's: never sent again
    assert retried == 0


async def test_a_retry_that_fails_too_is_the_502_and_no_third_try(make_proxy: ProxyFactory) -> None:
    fake = StaleUpstream()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if fake.connections == 0:
            await fake.handle(reader, writer)
            return
        fake.connections += 1  # every later connection: closed on its first request
        fake.bodies.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    async with (
        serve_raw(handle) as url,
        make_proxy(url) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        assert (await _post(http, FIRST)).status_code == 200
        response = await _post(http, SECOND)
        failed = await _retries(http, "failed")
    assert response.status_code == 502
    assert len(fake.bodies) == 3  # first, its stale attempt, the one retry
    assert failed == 1


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_timeout_on_a_reused_connection_is_not_retried(
    make_proxy: ProxyFactory, transport: str
) -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        del writer
        await reader.read()  # until compactd gives the connection up

    fake, response, _ = await two_chats(make_proxy, hang, read_timeout=0.2, transport=transport)
    assert response.status_code == 504
    assert len(fake.bodies) == 2


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_a_stream_that_started_is_never_retried(
    make_proxy: ProxyFactory, transport: str
) -> None:
    async def start_then_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        event = b'data: {"id":"x","choices":[]}\n\n'
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await _reset(reader, writer)

    fake, response, _ = await two_chats(make_proxy, start_then_reset, transport=transport)
    assert response.status_code == 200
    assert response.content.startswith(b'data: {"id":"x","choices":[]}\n\n')
    assert b"The upstream connection failed mid-stream." in response.content
    assert len(fake.bodies) == 2  # the stream had begun: the request is not sent again


async def test_a_head_cut_off_part_way_is_not_retried(make_proxy: ProxyFactory) -> None:
    # aiohttp tells (its ServerDisconnectedError carries the part that came); httpcore says
    # "Server disconnected without sending a response" either way, so its transport retries it.
    async def part_of_a_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        del reader
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-ty")
        await writer.drain()
        writer.close()

    fake, response, _ = await two_chats(make_proxy, part_of_a_head)
    assert response.status_code == 502
    assert len(fake.bodies) == 2  # a response had begun: the upstream read the request


async def test_a_streamed_body_is_not_sent_again(make_proxy: ProxyFactory) -> None:
    body = b'{"model":"text-embedding-3-small","input":"hello"}'
    async with (
        stale() as (fake, url),
        make_proxy(url) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        assert (await _post(http, body, "/v1/embeddings")).status_code == 200
        response = await _post(http, body, "/v1/embeddings")
    # Forwarded as it arrives, the body is not ours to send again: the race stays a 502 here.
    assert response.status_code == 502
    assert fake.bodies == [body, body]


async def test_a_get_on_a_connection_the_upstream_just_closed_is_retried_by_aiohttp_once(
    make_proxy: ProxyFactory,
) -> None:
    async with (
        stale() as (fake, url),
        make_proxy(url) as proxy,
        httpx.AsyncClient(base_url=proxy, headers=KEY) as http,
    ):
        assert (await http.get("/v1/models")).status_code == 200
        response = await http.get("/v1/models")
        retried = await _retries(http, "ok")
    assert response.status_code == 200
    assert fake.paths == [b"/v1/models"] * 3  # aiohttp's own retry; compactd adds none
    assert retried == 0


def test_the_methods_left_to_aiohttp_are_the_ones_it_retries_itself() -> None:
    assert aiohttp.client.IDEMPOTENT_METHODS == ALREADY_RETRIED_BY_AIOHTTP
