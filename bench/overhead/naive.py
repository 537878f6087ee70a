"""The reference pass-throughs: a naive ~20-line starlette + httpx proxy, with either httpx's own
connection pool or the httpx-aiohttp transport. Run: `python naive.py httpx|aiohttp PORT UPSTREAM
[WORKERS]`; with more than one worker, uvicorn's supervisor spawns them (as `compactd serve
--workers N` does) and each builds the app from `NAIVE_TRANSPORT` and `NAIVE_UPSTREAM`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from httpx_aiohttp import AiohttpTransport
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
       "proxy-authorization", "proxy-authenticate", "content-length"}  # fmt: skip


def build_app(transport: str, upstream: str) -> Starlette:
    """A pass-through that forwards every request to `upstream` and streams the answer back."""
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        tr = AiohttpTransport(limits=limits) if transport == "aiohttp" else None
        async with httpx.AsyncClient(transport=tr, limits=limits, timeout=None) as client:
            state["client"] = client
            yield

    async def proxy(request: Request) -> Response:
        client = state["client"]
        headers = [(k, v) for k, v in request.headers.raw if k.decode().lower() not in HOP]
        url = upstream + request.url.path.removeprefix("/v1")
        req = client.build_request(
            request.method, url, headers=headers, content=await request.body()
        )
        resp = await client.send(req, stream=True)
        out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
        return StreamingResponse(
            resp.aiter_raw(), resp.status_code, out, background=BackgroundTask(resp.aclose)
        )

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [Route("/healthz", healthz), Route("/{path:path}", proxy, methods=["GET", "POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


def app_from_environment() -> Starlette:
    """The app of one of several workers (uvicorn's factory): its settings come from the
    environment the supervisor hands on."""
    return build_app(os.environ["NAIVE_TRANSPORT"], os.environ["NAIVE_UPSTREAM"])


if __name__ == "__main__":
    transport, port, upstream = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    opts = {"host": "127.0.0.1", "port": port, "log_level": "warning", "access_log": False,
            "loop": "uvloop", "http": "httptools"}  # fmt: skip
    if workers > 1:
        os.environ |= {"NAIVE_TRANSPORT": transport, "NAIVE_UPSTREAM": upstream}
        uvicorn.run("naive:app_from_environment", factory=True, workers=workers, **opts)
    else:
        uvicorn.run(build_app(transport, upstream), **opts)
