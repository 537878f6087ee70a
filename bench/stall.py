"""How long one request with a huge history holds the event loop (in-process, a mock upstream).

    python -m bench.stall --items 900000            # 30 MiB of tiny chat messages, no user one
    python -m bench.stall --items 49000 --user      # just under the 50,000-item limit
    python -m bench.stall --items 49000 --api messages

The real app (create_app, its store and providers) behind httpx's ASGI transport, in front of an
upstream that answers at once (tests.inprocess: httpx.MockTransport). A task on the same loop
wakes every 5 ms; the longest gap between its wake-ups is what any other request on that worker
would have waited. Prints the response's x-compactd-* headers and the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from tests.inprocess import running

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def body(api: str, items: int, *, user: bool) -> bytes:
    """`items` one-token messages (alternating user/assistant on the Messages API, which needs
    them so; all assistant otherwise, then one user message if `user`)."""
    if api == "messages":
        history: list[Any] = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(items)
        ]
        return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": history})
    history = [{"role": "assistant", "content": "x"}] * items
    if user:
        history.append({"role": "user", "content": "hi"})
    field = "input" if api == "responses" else "messages"
    return orjson.dumps({"model": "gpt-4o-mini", field: history})


async def run(api: str, items: int, *, user: bool) -> None:
    raw = body(api, items, user=user)
    print(f"{api}: {items} items, {len(raw) / 2**20:.1f} MiB")
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    with tempfile.TemporaryDirectory() as tmp:
        async with running(Path(tmp)) as proxy:
            task = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            t0 = time.perf_counter()
            response = await proxy.client.post(
                PATHS[api],
                content=raw,
                headers={
                    "authorization": "Bearer sk-stall",
                    "x-api-key": "sk-stall",
                    "anthropic-version": "2023-06-01",
                    "content-type": "application/json",
                },
            )
            total = time.perf_counter() - t0
            done.set()
            await task
    ours = {k: v for k, v in response.headers.items() if k.startswith("x-compactd-")}
    print(response.status_code, ours)
    stalled = sum(g for g in gaps if g > 0.1)
    print(
        f"total {total:.2f} s, longest loop gap {max(gaps, default=0):.3f} s, "
        f"in gaps over 100 ms {stalled:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=sorted(PATHS), default="chat")
    parser.add_argument("--items", type=int, default=900_000)
    parser.add_argument("--user", action="store_true", help="end with a user message")
    args = parser.parse_args()
    asyncio.run(run(args.api, args.items, user=args.user))


if __name__ == "__main__":
    main()
