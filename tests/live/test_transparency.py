"""Promise 1: what needs no change passes byte-for-byte, both ways."""

from __future__ import annotations

import asyncio
import hashlib
from urllib.parse import urlsplit

import httpx
import pytest

from tests.upstream import respond, sse_chunks, stream

# Odd spacing, key order and non-ASCII: any re-serialization would change these bytes.
CHAT_BODY = (
    b'{ "model":"gpt-4o",  "messages": [{"content": "h\\u00e9llo \xc3\xa9 \xf0\x9f\x98\x80",'
    b' "role":"user"}], "temperature": 1.0e0, "extra_field": {"z": 1, "a": [ ]} }'
)


async def test_unchanged_chat_request_reaches_upstream_byte_identical(upstream, make_proxy) -> None:
    fake, base = upstream
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        r = await client.post(
            f"{url}/v1/chat/completions",
            content=CHAT_BODY,
            headers={"content-type": "application/json", "authorization": "Bearer sk-test"},
        )
    assert r.status_code == 200
    assert fake.last.sha256 == hashlib.sha256(CHAT_BODY).hexdigest()
    assert fake.last.path == "/v1/chat/completions"
    assert fake.last.header("authorization") == "Bearer sk-test"


async def test_json_response_relayed_byte_identical_with_status_and_end_to_end_headers(
    upstream, make_proxy
) -> None:
    fake, base = upstream
    body = (
        b'{"error": {"message": "Rate limit", "type": "requests", "code": "rate_limit_exceeded"}}'
    )
    fake.then(
        respond(
            429,
            body,
            headers=[
                (b"x-request-id", b"req_123"),
                (b"retry-after", b"2"),
                (b"keep-alive", b"timeout=5"),
                (b"x-ratelimit-remaining-requests", b"0"),
            ],
        )
    )
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        r = await client.post(f"{url}/v1/chat/completions", content=CHAT_BODY)
    assert r.status_code == 429
    assert r.content == body
    assert r.headers["x-request-id"] == "req_123"
    assert r.headers["retry-after"] == "2"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert "keep-alive" not in r.headers  # hop-by-hop
    assert r.headers["x-compactd-action"] == "passthrough"


async def test_our_request_headers_are_stripped_before_forwarding(upstream, make_proxy) -> None:
    fake, base = upstream
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        await client.post(
            f"{url}/v1/chat/completions",
            content=CHAT_BODY,
            headers={
                "x-compactd-bypass": "1",
                "x-compactd-conversation-id": "abc",
                "x-compactd-policy": "p",
                "x-team": "blue",
                "connection": "keep-alive, x-drop-me",
                "x-drop-me": "1",
            },
        )
    names = {k.decode().lower() for k, _ in fake.last.headers}
    assert not {n for n in names if n.startswith("x-compactd-")}
    assert "x-team" in names
    assert "x-drop-me" not in names  # named in Connection: hop-by-hop for this hop only


async def test_binary_and_other_paths_pass_through_unchanged(upstream, make_proxy) -> None:
    fake, base = upstream
    audio = bytes(range(256)) * 64
    fake.then(respond(200, audio, content_type=b"audio/mpeg"))
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        r = await client.post(f"{url}/v1/audio/speech?x=1&y=%20z", content=b'{"input":"hi"}')
        r2 = await client.delete(f"{url}/v1/files/file-abc")
    assert r.content == audio
    assert r.headers["content-type"] == "audio/mpeg"
    assert fake.received[0].path == "/v1/audio/speech?x=1&y=%20z"
    assert fake.received[0].body == b'{"input":"hi"}'
    assert fake.received[1].method == "DELETE"
    assert r2.status_code == 200
    assert "x-compactd-action" not in r.headers  # only chat responses carry our headers


async def test_sse_events_relayed_byte_identical(upstream, make_proxy) -> None:
    fake, base = upstream
    events = sse_chunks(["Hel", "lo", " wörld"], usage=True)
    fake.then(stream(events))
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        r = await client.post(
            f"{url}/v1/chat/completions", content=b'{"model":"gpt-4o","stream":true,"messages":[]}'
        )
    assert r.content == b"".join(events)
    assert r.headers["x-accel-buffering"] == "no"
    assert r.headers["content-type"].startswith("text/event-stream")


async def test_request_cannot_redirect_the_upstream(upstream, make_proxy) -> None:
    fake, base = upstream
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        await client.post(
            f"{url}/v1/chat/completions",
            content=b'{"model":"gpt-4o","messages":[],"api_base":"http://169.254.169.254/","base_url":"http://127.0.0.1:1/"}',
            headers={"host": "evil.example", "x-forwarded-host": "169.254.169.254"},
        )
        r = await client.get(f"{url}/v1/%2e%2e/%2e%2e/etc/passwd")
    assert len(fake.received) == 1  # the traversal never reached any upstream
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_path"


# `curl --http2` on http:// asks to upgrade to h2c; a server that does not upgrade answers the
# request as HTTP/1.1 (RFC 9110 §7.8). httptools skipped such a request's body: the upstream got
# an empty one, and the body's bytes were then read as the next request (a stray 400).
@pytest.mark.parametrize("later", [False, True], ids=["one-write", "body-after-100-continue"])
async def test_a_request_asking_to_upgrade_to_h2c_is_served_with_its_body(
    upstream, make_proxy, later
) -> None:
    fake, base = upstream
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\n"
        b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n%s"
        b"content-length: %d\r\n\r\n"
        % (b"expect: 100-continue\r\n" if later else b"", len(CHAT_BODY))
    )
    after = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    async with make_proxy(base) as url, asyncio.timeout(30):
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        if later:  # the body arrives in a read of its own
            writer.write(head)
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(CHAT_BODY + after)
        else:
            writer.write(head + CHAT_BODY + after)
        answer = await reader.read()
        writer.close()
    assert [r.body for r in fake.received] == [CHAT_BODY, b""]
    assert fake.received[0].header("upgrade") is None
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    assert b"HTTP/1.1 400" not in answer


async def test_health_endpoints_answer(upstream, make_proxy) -> None:
    _, base = upstream
    async with make_proxy(base) as url, httpx.AsyncClient() as client:
        assert (await client.get(f"{url}/healthz")).json() == {"status": "ok"}
        ready = await client.get(f"{url}/readyz")
        unknown = await client.get(f"{url}/nope")
    assert ready.status_code == 200
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "invalid_request_error"
