"""Resident memory of compactd workers: idle, after one request per model family, after a
100k-token request.

    .venv/bin/python bench/rss.py [--workers 1,4] [--store redis://127.0.0.1:6379/0]
                                  [--allocator auto|jemalloc|system] [--decimals 1]

For each worker count: start `compactd serve --workers N` against a local fake upstream (an
aiohttp app answering a fixed completion), read every worker's RSS from /proc once it is ready,
send one chat request per model family (an o200k model, a cl100k model, a Claude model) to
every worker (each on a new connection, repeated until every worker has read one, judged by its
/proc/<pid>/io), read RSS again, then send a ~100k-token request and read it once more.
Prints a markdown table (MB = 2^20 bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("gpt-4o", "gpt-4", "claude-sonnet-4-5")
COMPLETION = {
    "id": "chatcmpl-rss",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bytes_read(pid: int) -> int:
    """Bytes the process has read from sockets and files so far (/proc/<pid>/io rchar)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def workers(pid: int, expected: int) -> list[int]:
    """uvicorn's worker processes (the server itself when it runs one worker)."""
    if expected == 1:
        return [pid]
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    # Not multiprocessing's resource tracker: only the processes that spawn_main runs.
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def chat(model: str, words: int = 12_000) -> bytes:
    text = " ".join(f"word{i % 997}" for i in range(words))
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    ).encode()


async def upstream(port: int) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(COMPLETION)

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def each_worker(url: str, pids: list[int], body: bytes) -> None:
    """Send `body` (each on a new connection) until every worker has read one (bounded)."""
    pending = set(pids)
    limits = httpx.Limits(max_keepalive_connections=0)
    headers = {"authorization": "Bearer sk-rss", "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as http:
        for _ in range(40 * len(pids)):
            before = {p: bytes_read(p) for p in pending}
            await http.post(url, content=body)
            pending = {p for p in pending if bytes_read(p) - before[p] < len(body)}
            if not pending:
                return
    raise RuntimeError(f"workers {sorted(pending)} never served a request")


async def settled(pids: list[int]) -> list[float]:
    """Every worker's RSS once it has stopped moving for a second (a worker at rest: the
    allocator may hand freed pages back a few seconds after the work that freed them)."""
    while True:
        before = [rss_mb(p) for p in pids]
        await asyncio.sleep(1.0)
        after = [rss_mb(p) for p in pids]
        if after == before:
            return after


async def measure(n: int, store: str, allocator: str) -> dict[str, list[float]]:
    up_port, port = free_port(), free_port()
    runner = await upstream(up_port)
    data = tempfile.mkdtemp(prefix="compactd-rss-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env |= {
        "COMPACTD_UPSTREAM_URL": f"http://127.0.0.1:{up_port}/v1",
        "COMPACTD_DATA_DIR": data,
        "COMPACTD_SECRET": "rss-bench",
        "COMPACTD_STORE_URL": store,
        "COMPACTD_SERVER_ALLOCATOR": allocator,
    }
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--workers", str(n)]
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    out: dict[str, list[float]] = {}
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await http.get(f"{base}/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("compactd did not start")
                await asyncio.sleep(0.2)
            pids = workers(proc.pid, n)
            out["idle"] = await settled(pids)  # every worker has finished starting
            url = f"{base}/v1/chat/completions"
            for model in FAMILIES:
                await each_worker(url, pids, chat(model))
            out["one request per model family"] = await settled(pids)
            await each_worker(url, pids, chat("gpt-4.1", words=100_000))
            out["after a 100k-token request"] = await settled(pids)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        await runner.cleanup()
    return out


async def main_async(counts: list[int], store: str, allocator: str, decimals: int = 0) -> None:
    rows = []
    for n in counts:
        res = await measure(n, store, allocator)
        for stage, values in res.items():
            each = " / ".join(f"{v:.{decimals}f}" for v in values)
            rows.append(f"| {n} | {stage} | {each} | {max(values):.{decimals}f} |")
    print("| workers | after | RSS per worker (MB) | max (MB) |\n|---:|---|---|---:|")
    print("\n".join(rows))
    print(f"\nLoad average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,4", help="comma-separated worker counts")
    parser.add_argument("--store", default="", help="store.url (default: the embedded SQLite)")
    parser.add_argument("--allocator", default="auto", help="server.allocator of compactd")
    parser.add_argument(
        "--decimals", type=int, default=0, help="decimals of the MB figures (1: 0.1 MB steps)"
    )
    args = parser.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    asyncio.run(main_async(counts, args.store, args.allocator, args.decimals))


if __name__ == "__main__":
    main()
