"""WebSocket upgrades on /v1/responses are relayed untouched, both ways, on real sockets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from tests.upstream import serve


@dataclass
class EchoUpstream:
    """A WebSocket upstream: records the handshake and every frame, answers each with its echo."""

    headers: dict[str, str] = field(default_factory=dict)
    path: str = ""
    frames: list[Any] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        self.headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.path = scope["path"]
        await receive()
        offered = scope.get("subprotocols") or []
        await send({"type": "websocket.accept", "subprotocol": offered[0] if offered else None})
        await send({"type": "websocket.send", "text": '{"type":"session.created"}'})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("text") if message.get("text") is not None else message["bytes"]
            self.frames.append(frame)
            if frame == "bye":
                await send({"type": "websocket.close", "code": 4000})
                return
            await send(
                {
                    "type": "websocket.send",
                    **({"text": frame} if isinstance(frame, str) else {"bytes": frame}),
                }
            )


@pytest.fixture
async def ws_upstream():
    fake = EchoUpstream()
    async with serve(fake) as url:
        yield fake, f"{url}/v1"


async def test_frames_go_both_ways_untouched_with_the_clients_handshake(
    ws_upstream, make_proxy
) -> None:
    fake, base = ws_upstream
    event = '{"type":"response.create","response":{"input":[{"role":"user","content":"hi"}]}}'
    async with make_proxy(base) as url, aiohttp.ClientSession() as http:
        async with http.ws_connect(
            url.replace("http://", "ws://") + "/v1/responses?model=gpt-5",
            headers={"authorization": "Bearer sk-alpha", "openai-beta": "responses=v1"},
            protocols=("realtime",),
        ) as ws:
            assert ws.protocol == "realtime"
            assert (await ws.receive()).data == '{"type":"session.created"}'
            await ws.send_str(event)
            assert (await ws.receive()).data == event
            await ws.send_bytes(b"\x00\x01binary")
            assert (await ws.receive()).data == b"\x00\x01binary"
            await ws.send_str("bye")
            closing = await ws.receive()
            assert closing.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 4000
    assert fake.path == "/v1/responses"
    assert fake.frames == [event, b"\x00\x01binary", "bye"]
    assert fake.headers["authorization"] == "Bearer sk-alpha"
    assert fake.headers["openai-beta"] == "responses=v1"
    assert not any(k.startswith("x-compactd") for k in fake.headers)


async def test_an_upstream_that_refuses_the_upgrade_closes_the_client(make_proxy) -> None:
    async with make_proxy("http://127.0.0.1:9/v1") as url, aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(
                url.replace("http://", "ws://") + "/v1/responses",
                headers={"authorization": "Bearer sk-alpha"},
            )
