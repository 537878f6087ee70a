"""Streaming, disconnects, timeouts and upstream failures, over real sockets."""

from __future__ import annotations

import asyncio
import sys
import zlib

import httpx
import openai
import orjson
import pytest

from tests.upstream import hang, respond, sse_chunks, stream

STREAM_BODY = b'{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}'


# A comment line on its own (a keep-alive while a model thinks) is no part of an event: held
# back, an idle timeout between the client and compactd would cut the stream.
@pytest.mark.parametrize("lead", [b"", b": keep-alive\n"], ids=["event", "comment"])
async def test_sse_is_relayed_as_each_chunk_arrives(upstream, make_proxy, lead) -> None:
    fake, base = upstream
    gate = asyncio.Event()
    # The upstream sends its second event only after the client has received the first:
    # a buffering proxy would deadlock here instead of passing.
    events = sse_chunks(["a", "b", "c"])
    fake.then(stream([lead, *events] if lead else events, gate=gate))
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        async with client.stream("POST", f"{url}/v1/chat/completions", content=STREAM_BODY) as r:
            chunks = r.aiter_raw()
            first = await asyncio.wait_for(anext(chunks), 10)
            assert first.startswith(lead or b"data: ")
            gate.set()
            rest = b"".join([c async for c in chunks])
    assert (first + rest).endswith(b"data: [DONE]\n\n")


async def test_client_disconnect_mid_stream_closes_upstream_within_a_second(
    upstream, make_proxy
) -> None:
    fake, base = upstream
    fake.then(stream(sse_chunks(["x"] * 1000), delay=0.05))
    async with make_proxy(base) as url:
        client = httpx.AsyncClient()
        async with client.stream("POST", f"{url}/v1/chat/completions", content=STREAM_BODY) as r:
            await anext(r.aiter_raw())
        await client.aclose()  # the client goes away without reading on
        # Bound from the issue: the upstream request is closed within 1 s of the disconnect.
        await asyncio.wait_for(fake.disconnected.wait(), 1.0)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models/x"])
async def test_client_disconnect_before_first_byte_closes_upstream(
    upstream, make_proxy, path
) -> None:
    fake, base = upstream
    fake.then(hang())
    async with make_proxy(base) as url:
        async with httpx.AsyncClient() as client:
            task = asyncio.ensure_future(client.post(f"{url}{path}", content=STREAM_BODY))
            await asyncio.wait_for(fake.request_seen.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.wait_for(fake.disconnected.wait(), 1.0)


async def test_upstream_unreachable_is_an_openai_shaped_502(make_proxy) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    async with make_proxy(f"http://127.0.0.1:{port}/v1") as url, httpx.AsyncClient() as client:
        r = await client.post(f"{url}/v1/chat/completions", content=STREAM_BODY)
    assert r.status_code == 502
    assert r.headers["x-compactd-action"] == "passthrough"
    assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert r.json()["error"]["code"] == "upstream_unreachable"


async def test_upstream_read_timeout_is_an_openai_shaped_504(upstream, make_proxy) -> None:
    fake, base = upstream
    fake.then(hang())
    async with (
        make_proxy(base, upstream={"read_timeout": 0.3}) as url,
        httpx.AsyncClient() as client,
    ):
        r = await client.post(f"{url}/v1/chat/completions", content=STREAM_BODY)
    assert r.status_code == 504
    assert "x-compactd-tokens-before" in r.headers
    assert r.json()["error"]["code"] == "upstream_timeout"


async def test_mid_stream_failure_ends_with_error_event_and_no_done(upstream, make_proxy) -> None:
    fake, base = upstream
    fake.then(stream(sse_chunks(["a", "b", "c", "d"]), fail_after=2))
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        r = await client.post(f"{url}/v1/chat/completions", content=STREAM_BODY)
    assert b"[DONE]" not in r.content
    last = r.content.strip().split(b"\n\n")[-1]
    assert last.startswith(b'data: {"error":')


# An upstream can fail part-way through an event (a proxy before it re-chunks the stream): the
# error event was glued to the unfinished one, which the SDK raised as a JSONDecodeError.
@pytest.mark.parametrize("cut", [None, 25], ids=["between-events", "mid-event"])
async def test_openai_sdk_raises_api_error_on_mid_stream_failure(upstream, make_proxy, cut) -> None:
    fake, base = upstream
    events = sse_chunks(["a", "b", "c", "d"])
    if cut is not None:
        events = [*events[:2], events[2][:cut], events[3]]
    fake.then(stream(events, fail_after=3 if cut else 2))
    async with make_proxy(base) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        got: list[str] = []
        with pytest.raises(openai.APIError):
            async for chunk in await sdk.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
            ):
                got.append(chunk.choices[0].delta.content or "")
        await sdk.close()
    assert got == ["a", "b"]


def _responses_events(words: list[str]) -> list[bytes]:
    """A Responses stream's typed events, numbered from 0 as the API numbers them."""
    created = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}
    deltas = [{"type": "response.output_text.delta", "delta": w} for w in words]
    return [
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps({**e, "sequence_number": i}))
        for i, e in enumerate([created, *deltas])
    ]


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/responses/resp_1?stream=true"])
async def test_a_responses_stream_failing_mid_way_ends_with_the_apis_error_event(
    upstream, make_proxy, path
) -> None:
    fake, base = upstream
    fake.then(stream(_responses_events(["a", "b", "c"]), fail_after=3))
    body = b'{"model":"gpt-5","stream":true,"input":"hi"}'
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        if path == "/v1/responses":
            r = await client.post(f"{url}{path}", content=body)
        else:  # a background response's stream, resumed: forwarded as it is
            r = await client.get(f"{url}{path}")
    last = r.content.strip().split(b"\n\n")[-1]
    assert last.startswith(b"event: error\ndata: ")
    error = orjson.loads(last.partition(b"data: ")[2])
    message = "The upstream connection failed mid-stream."
    assert error == {
        "type": "error",
        "code": "upstream_error",
        "message": message,
        "param": None,
        "sequence_number": 3,  # the next after the last event relayed
        "error": {
            "type": "server_error",
            "code": "upstream_error",
            "message": message,
            "param": None,
        },
    }


async def test_openai_sdk_raises_on_a_responses_stream_failing_mid_way(
    upstream, make_proxy
) -> None:
    fake, base = upstream
    fake.then(stream(_responses_events(["a", "b", "c"]), fail_after=3))
    async with make_proxy(base) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)
        got: list[str] = []
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            async for event in await sdk.responses.create(model="gpt-5", input="hi", stream=True):
                got.append(event.type)
        await sdk.close()
    assert got == ["response.created", "response.output_text.delta", "response.output_text.delta"]


@pytest.mark.parametrize("declared", [True, False])
async def test_body_over_limit_is_413(upstream, make_proxy, declared) -> None:
    fake, base = upstream
    big = b'{"messages":[],"pad":"' + b"x" * 5000 + b'"}'

    async def chunked():
        yield big[:100]
        yield big[100:]

    async with (
        make_proxy(base, server={"max_body_bytes": 1000}) as url,
        httpx.AsyncClient() as client,
    ):
        r = await client.post(f"{url}/v1/chat/completions", content=big if declared else chunked())
        r2 = await client.post(f"{url}/v1/files", content=big if declared else chunked())
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert r2.status_code == 413
    assert fake.received == []


async def test_file_upload_is_streamed_not_buffered(upstream, make_proxy) -> None:
    fake, base = upstream
    fake.then(respond(200, {"id": "file-1", "object": "file"}))
    release = asyncio.Event()
    part1 = b"--b\r\ncontent-disposition: form-data; name=file\r\n\r\n" + b"a" * 70000
    part2 = b"b" * 70000 + b"\r\n--b--\r\n"
    total = len(part1) + len(part2)

    async def body():
        yield part1
        # The rest is sent only once the upstream has seen the first part: a proxy that
        # buffered the whole upload would wait forever here.
        await asyncio.wait_for(release.wait(), 10)
        yield part2

    async def open_gate():
        await asyncio.wait_for(fake.first_body_chunk.wait(), 10)
        release.set()

    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        gate = asyncio.ensure_future(open_gate())
        r = await client.post(
            f"{url}/v1/files",
            content=body(),
            headers={
                "content-type": "multipart/form-data; boundary=b",
                "content-length": str(total),
            },
        )
        await gate
    assert r.status_code == 200
    assert fake.last.body == part1 + part2
    assert fake.last.header("content-length") == str(total)


async def test_start_up_shortens_the_thread_switch_interval(upstream, make_proxy) -> None:
    # Providers run in worker threads: the event loop must get the GIL back within ~2 ms, not
    # Python's default 5 ms, or every compaction stretches other requests' latency.
    from proxy.app.application import SWITCH_INTERVAL

    _fake, base = upstream
    sys.setswitchinterval(0.005)
    async with make_proxy(base):
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL, abs=1e-6)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_stream_failing_mid_way_ends_as_a_broken_connection(
    upstream, make_proxy, encoding
) -> None:
    # Each event is flushed so what arrived decodes; an error event appended in plain text would
    # sit inside the compressed body and break the client's decompression of everything after.
    packer = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
    events = [
        packer.compress(e) + packer.flush(zlib.Z_SYNC_FLUSH) for e in sse_chunks(list("abcd"))
    ]
    fake, base = upstream
    fake.then(stream(events, fail_after=2, headers=[(b"content-encoding", encoding.encode())]))
    got = b""
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        async with client.stream("POST", f"{url}/v1/chat/completions", content=STREAM_BODY) as r:
            with pytest.raises(httpx.RemoteProtocolError):
                async for chunk in r.aiter_raw():
                    got += chunk
    assert got == b"".join(events[:2])
    text = zlib.decompressobj(wbits=47).decompress(got)
    assert text == b"".join(sse_chunks(list("abcd"))[:2])
