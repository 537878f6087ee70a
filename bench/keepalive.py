"""What the upstream pool's retry and its keep-alive cost, in client CPU and latency per request.

An upstream in another process (a raw asyncio HTTP/1.1 server, keep-alive, fixed 2 KB JSON; with
`--tls` behind a self-signed certificate made here) gets `--requests` sequential POSTs per round
from three transports, in interleaved rounds:

- `before`: the pooled aiohttp transport as compactd built it before the retry (no trace hook);
- `pooled`: `proxy.app.application.build_transport` (the same pool, with the retry's reuse
  trace and wrapper);
- `new connection`: the retry's own transport, a new connection per request: what every request
  after a pause longer than `upstream.keepalive_seconds` pays.

Prints the median over rounds of this process's CPU per request (time.process_time) and of the
latency per request. Run: `flock /work/.bench.lock .venv/bin/python bench/keepalive.py [--tls]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

_SERVER = r"""
import asyncio, ssl, sys
BODY = b'{"x":"' + b"a" * 2040 + b'"}'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
RESP = HEAD % len(BODY) + BODY
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
            await reader.readexactly(n)
            writer.write(RESP)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()
async def main():
    ctx = None
    if len(sys.argv) > 1:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[1], sys.argv[2])
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def _certificate(directory: Path) -> tuple[str, str]:
    cert, key = str(directory / "cert.pem"), str(directory / "key.pem")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec"),
            *("-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", key, "-out", cert),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _before(settings: object) -> httpx.AsyncBaseTransport:
    """The pooled transport without the retry (as before it): same session, no trace hook."""
    # Imported once SSL_CERT_FILE is set: aiohttp builds its default context at import.
    import aiohttp  # noqa: PLC0415
    from httpx_aiohttp import AiohttpTransport  # noqa: PLC0415

    up = settings.upstream  # type: ignore[attr-defined]

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=up.max_connections, keepalive_timeout=up.keepalive_seconds
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            max_line_size=up.max_response_header_bytes,
            max_field_size=up.max_response_header_bytes,
        )

    verified = getattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", None)
    return AiohttpTransport(verify=verified or True, client=session)


async def _round(transport: httpx.AsyncBaseTransport, url: str, n: int) -> tuple[float, float]:
    body = b'{"model":"gpt-4o","messages":[{"role":"user","content":"' + b"b" * 2000 + b'"}]}'
    timeout = {"connect": 10.0, "read": 30.0, "write": 30.0, "pool": 30.0}
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        request = httpx.Request(
            "POST", url, content=body, headers={"content-type": "application/json"},
            extensions={"timeout": timeout},
        )  # fmt: skip
        response = await transport.handle_async_request(request)
        async for _chunk in response.aiter_raw():
            pass
        await response.aclose()
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


async def _run(url: str, requests: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    from proxy.app.application import build_transport  # noqa: PLC0415  (imports aiohttp: see _before)
    from proxy.config import load_settings  # noqa: PLC0415
    from proxy.wire.stale_retry import StaleRetry  # noqa: PLC0415

    settings = load_settings(None, env={}, overrides={"upstream": {"url": url}})
    retrying = build_transport(settings)
    assert isinstance(retrying, StaleRetry)
    transports = {"before": _before(settings), "pooled": retrying, "new connection": retrying.fresh}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in transports}
    for transport in transports.values():
        await _round(transport, url, 50)  # warm up: connection made, code paths imported
    for _ in range(rounds):
        for name, transport in transports.items():
            results[name].append(await _round(transport, url, requests))
    await transports["before"].aclose()
    await retrying.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tls", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra: list[str] = []
        if args.tls:
            cert, key = _certificate(Path(tmp))
            extra = [cert, key]
            os.environ["SSL_CERT_FILE"] = cert  # before aiohttp builds its default context
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, *extra], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            scheme = "https" if args.tls else "http"
            url = f"{scheme}://127.0.0.1:{port}/v1/chat/completions"
            results = asyncio.run(_run(url, args.requests, args.rounds))
        finally:
            server.terminate()
            server.wait()
    print(f"{'http' if not args.tls else 'https'}, {args.requests} requests x {args.rounds} rounds")
    print(f"{'transport':<16} {'CPU/request':>12} {'latency/request':>16}")
    for name, values in results.items():
        cpu = statistics.median(v[0] for v in values) * 1e6
        wall = statistics.median(v[1] for v in values) * 1e6
        print(f"{name:<16} {cpu:>9.1f} us {wall:>13.1f} us")


if __name__ == "__main__":
    main()
