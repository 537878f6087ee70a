"""compactd keeps an idle client connection open longer than its clients keep theirs.

An HTTP/1.1 client reuses an idle connection until its own expiry. A server that closes idle
connections at that same age can close one just as a request goes out on it: the request meets
a reset (httpx.ReadError), not an answer. uvicorn's default (5 s) is httpx's expiry (5 s), and
tests/store/test_cluster.py met exactly that in the round after its wait for the restarted
node's sync (which takes Redis's 5 s diskless-sync delay).
"""

from __future__ import annotations

from typing import Any

import httpx
import uvicorn

from proxy.app.application import UPSTREAM_KEEP_ALIVE_SECONDS
from proxy.app.server import KEEP_ALIVE_SECONDS, HeadLimits, protocol_options


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that is never called: only the server's configuration is looked at."""


def test_compactd_keeps_idle_connections_longer_than_httpx_keeps_them() -> None:
    config = uvicorn.Config(app, **protocol_options(HeadLimits()))
    assert config.timeout_keep_alive == KEEP_ALIVE_SECONDS
    assert httpx.Limits().keepalive_expiry < KEEP_ALIVE_SECONDS  # the OpenAI Python SDK's too
    assert uvicorn.Config(app).timeout_keep_alive < KEEP_ALIVE_SECONDS  # not uvicorn's 5 s


def test_the_tests_servers_keep_idle_connections_longer_than_compactd_s_upstream_pool() -> None:
    # tests.upstream.serve runs the fake upstreams with this keep-alive: compactd's pooled
    # upstream connections expire first, so none is reused as the fake upstream closes it.
    assert UPSTREAM_KEEP_ALIVE_SECONDS < KEEP_ALIVE_SECONDS
