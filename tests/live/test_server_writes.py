"""A response's head goes out with its body's first bytes, in one send (`proxy.app.server`).

uvicorn writes the status line and headers, then the body, as two sends: two TCP segments for
every small answer, and the client woken twice to read one. `HeadWithBody` holds the head until
the next write or the event loop's next turn, whichever comes first; the bytes on the wire and
their order are the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proxy.app.server import HeadLimits, HeadWithBody, protocol_options
from tests.upstream import serve


class FakeHandle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """call_soon's callbacks run only when the test turns the loop."""

    def __init__(self) -> None:
        self.ready: list[FakeHandle] = []

    def call_soon(self, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle(callback)
        self.ready.append(handle)
        return handle

    def turn(self) -> None:
        ready, self.ready = self.ready, []
        for handle in ready:
            if not handle.cancelled:
                handle.callback()


class RecordingTransport:
    """Every send as one entry (a writelines is one send, as uvloop makes it one writev)."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False
        self.extra = {"peername": ("127.0.0.1", 1)}

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.sends.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        assert not self.closed
        self.sends.append(b"".join(chunks))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return self.extra.get(name)


def holder() -> tuple[HeadWithBody, RecordingTransport, FakeLoop]:
    transport, loop = RecordingTransport(), FakeLoop()
    return HeadWithBody(transport, loop), transport, loop  # type: ignore[arg-type]


def test_the_head_and_the_body_written_at_once_are_one_send() -> None:
    out, transport, loop = holder()
    out.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert transport.sends == []
    out.write(b"{}")
    assert transport.sends == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    loop.turn()  # the held head's flush was cancelled: nothing is sent twice
    assert transport.sends == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


def test_a_head_with_no_body_yet_goes_out_on_the_loop_s_next_turn() -> None:
    out, transport, loop = holder()
    out.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    loop.turn()
    assert transport.sends == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    out.write(b"3\r\nabc\r\n")
    out.write(b"0\r\n\r\n")
    assert transport.sends[1:] == [b"3\r\nabc\r\n", b"0\r\n\r\n"]


def test_closing_sends_the_held_head_first() -> None:
    out, transport, _ = holder()
    out.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    out.close()
    assert transport.sends == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"]
    assert transport.closed


def test_a_head_held_while_the_connection_closed_is_dropped_not_written() -> None:
    out, transport, loop = holder()
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.closed = True  # the client went away
    loop.turn()
    assert transport.sends == []


def test_everything_else_is_the_connection_s() -> None:
    out, transport, _ = holder()
    assert out.get_extra_info("peername") == ("127.0.0.1", 1)
    assert not out.is_closing()
    transport.closed = True
    assert out.is_closing()


class HeadWithBodyMachine(RuleBasedStateMachine):
    """Any writes, loop turns and a close: the bytes sent are the bytes written, in order, and
    none is held past the loop's next turn."""

    def __init__(self) -> None:
        super().__init__()
        self.out, self.transport, self.loop = holder()
        self.written: list[bytes] = []
        self.closed = False

    def sent(self) -> bytes:
        return b"".join(self.transport.sends)

    @precondition(lambda self: not self.closed)
    @rule(data=st.binary(min_size=1, max_size=20))
    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.written.append(data)

    @rule()
    def turn(self) -> None:
        self.loop.turn()
        assert self.sent() == b"".join(self.written)

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.out.close()
        self.closed = True
        assert self.sent() == b"".join(self.written)

    @invariant()
    def sent_is_a_prefix_of_written(self) -> None:
        written = b"".join(self.written)
        assert written.startswith(self.sent())
        # Only the first write is ever held, and only until the next one.
        held = len(written) - len(self.sent())
        assert held in (0, len(self.written[0]) if len(self.written) == 1 else 0)

    @invariant()
    def the_first_two_writes_are_one_send(self) -> None:
        if len(self.written) >= 2 and self.transport.sends:
            first = self.transport.sends[0]
            assert first in (self.written[0], self.written[0] + self.written[1])


TestHeadWithBodyMachine = HeadWithBodyMachine.TestCase


def streaming_app(gate: asyncio.Event) -> Any:
    """/wait: a chunked answer whose first chunk waits for `gate` (the client has read the
    head); /json: a Content-Length answer; /boom: fails after its head."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await answer(scope, send, gate)

    return app


async def answer(scope: dict[str, Any], send: Any, gate: asyncio.Event) -> None:
    path = scope["path"]
    if path == "/json":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"{}"})
        return
    if path == "/boom":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("after the head")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await gate.wait()
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _open(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = urlsplit(base)
    assert url.hostname is not None
    assert url.port is not None
    return await asyncio.open_connection(url.hostname, url.port)


async def test_on_the_wire_a_stream_s_head_does_not_wait_for_its_first_event() -> None:
    gate = asyncio.Event()
    async with serve(streaming_app(gate), **protocol_options(HeadLimits())) as base:
        reader, writer = await _open(base)
        writer.write(b"GET /wait HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked" in head
        gate.set()  # only now may the first event be written
        assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10) == (
            b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
        )
        # Keep-alive: the next answers on the same connection come whole and in order.
        writer.write(b"GET /json HTTP/1.1\r\nhost: x\r\n\r\nGET /json HTTP/1.1\r\nhost: x\r\n\r\n")
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"content-length: 2" in head
            assert await asyncio.wait_for(reader.readexactly(2), 10) == b"{}"
        writer.close()


async def test_an_app_failing_after_its_head_still_closes_the_connection_after_the_head() -> None:
    async with serve(streaming_app(asyncio.Event()), **protocol_options(HeadLimits())) as base:
        reader, writer = await _open(base)
        writer.write(b"GET /boom HTTP/1.1\r\nhost: x\r\n\r\n")
        got = await asyncio.wait_for(reader.read(), 10)  # read to EOF: the server closed
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()


class LoopbackTransport(RecordingTransport):
    """What uvicorn's protocol asks of a connection's transport, sends recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.extra = {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def test_compactd_s_protocol_sends_a_small_answer_s_head_and_body_at_once() -> None:
    import uvicorn
    from uvicorn.server import ServerState

    from proxy.app.server import BoundedHttpToolsProtocol

    config = uvicorn.Config(streaming_app(asyncio.Event()), access_log=False)
    config.load()
    protocol = BoundedHttpToolsProtocol(
        config=config, server_state=ServerState(), app_state={}, limits=HeadLimits()
    )
    transport = LoopbackTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(b"GET /json HTTP/1.1\r\nhost: x\r\n\r\n")
    for _ in range(100):
        await asyncio.sleep(0)
        if transport.sends:
            break
    assert len(transport.sends) == 1
    assert transport.sends[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.sends[0].endswith(b"content-length: 2\r\n\r\n{}")
    protocol.connection_lost(None)
