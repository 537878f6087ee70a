"""WebSocket upgrades under /v1 (the Responses API's WebSocket mode), relayed untouched.

The client's handshake headers go upstream as they came (credentials, `openai-beta`, the
subprotocols it offers), minus hop-by-hop, handshake and our own headers, with the gateway's key
in upstream-key mode. Only once the upstream accepted is the client accepted, with the
subprotocol the upstream chose; then every text and binary frame is passed on as it is, both
ways, and a close on either side closes the other with its code. Nothing is parsed or compacted:
a WebSocket session's history lives in the connection, not in a request compactd could rewrite.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.types import Receive, Scope, Send

from proxy.wire.headers import request_headers
from proxy.wire.upstream_keys import Gate

log = logging.getLogger("compactd.websocket")

_HANDSHAKE = frozenset(
    {
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-accept",
        b"sec-websocket-protocol",
    }
)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest frame relayed (a whole conversation's items fit); larger ones close the session."""
_UNAVAILABLE = 1011
POLICY_VIOLATION = 1008
"""Close code of a handshake compactd refuses (a bad path, a key the gateway does not admit)."""


def ws_url(http_url: str) -> str:
    """The ws(s) URL of an http(s) upstream URL."""
    if http_url.startswith("https://"):
        return "wss://" + http_url.removeprefix("https://")
    return "ws://" + http_url.removeprefix("http://")


def _protocols(scope: Scope) -> tuple[str, ...]:
    offered: list[str] = scope.get("subprotocols") or []
    return tuple(offered)


async def relay_websocket(
    scope: Scope, receive: Receive, send: Send, *, url: str, gate: Gate, max_message: int
) -> None:
    """Connect upstream, accept the client, pump frames both ways until either side closes."""
    import aiohttp  # noqa: PLC0415 (installed with httpx-aiohttp; only WebSocket sessions need it)

    connect = await receive()
    if connect["type"] != "websocket.connect":
        return
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in request_headers(gate.authorize(list(scope["headers"])), keep_length=False)
        if k.lower() not in _HANDSHAKE
    ]
    session = aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent",)
    )
    try:
        try:
            upstream = await session.ws_connect(
                url,
                headers=headers,
                protocols=_protocols(scope),
                max_msg_size=max_message,
                autoclose=False,
                autoping=True,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("websocket upstream refused", extra={"error": type(exc).__name__})
            await send({"type": "websocket.close", "code": _UNAVAILABLE})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.protocol})
        await _pump(receive, send, upstream)
    finally:
        await session.close()


async def _pump(receive: Receive, send: Send, upstream: Any) -> None:
    import aiohttp  # noqa: PLC0415

    async def client_to_upstream() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(code=message.get("code", 1000))
                return
            if message.get("text") is not None:
                await upstream.send_str(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send_bytes(message["bytes"])

    async def upstream_to_client() -> None:
        async for frame in upstream:
            if frame.type == aiohttp.WSMsgType.TEXT:
                await send({"type": "websocket.send", "text": frame.data})
            elif frame.type == aiohttp.WSMsgType.BINARY:
                await send({"type": "websocket.send", "bytes": frame.data})
            elif frame.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                break
        code = upstream.close_code or 1000
        with contextlib.suppress(RuntimeError, OSError):
            await send({"type": "websocket.close", "code": code})

    tasks = [
        asyncio.ensure_future(client_to_upstream()),
        asyncio.ensure_future(upstream_to_client()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await upstream.close()
