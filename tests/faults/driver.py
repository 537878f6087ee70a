"""A load of growing conversations through compactd while a test breaks its store, and the
checks that follow: no 5xx of ours, every acknowledged compaction restorable, nothing lost."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy.digest import canonical_message
from tests.security.conftest import history
from tests.upstream import Ctx, chat_completion

KEY = {"authorization": "Bearer sk-faults"}
BUDGET = {"default_policy": {"budget_tokens": 600}}


async def echo(ctx: Ctx) -> None:
    """An upstream answering with the messages it received, so each response names its request."""
    body = chat_completion()
    body["forwarded"] = json.loads(ctx.request.body).get("messages")
    raw = orjson.dumps(body)
    await ctx.send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(raw)),
            ],
        }
    )
    await ctx.send({"type": "http.response.body", "body": raw})


def turn(conv: int, turns: int) -> list[dict[str, Any]]:
    """Conversation `conv` after `turns` turns: over a 600-token budget from the third turn."""
    return history(turns, f" c{conv}")


@dataclass
class Exchange:
    """One request of the load and what came back."""

    sent: list[dict[str, Any]]
    status: int
    action: str = ""
    forwarded: list[dict[str, Any]] | None = None


@dataclass
class Load:
    """Growing conversations, sent concurrently until stopped."""

    url: str
    conversations: int = 6
    exchanges: list[Exchange] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _one(self, http: httpx.AsyncClient, conv: int) -> None:
        turns = 1
        while not self.stop.is_set():
            msgs = turn(conv, turns)
            r = await http.post(
                f"{self.url}/v1/chat/completions",
                content=orjson.dumps({"model": "gpt-4o", "messages": msgs}),
            )
            ex = Exchange(msgs, r.status_code, r.headers.get("x-compactd-action", ""))
            if r.status_code == 200:
                ex.forwarded = r.json()["forwarded"]
            self.exchanges.append(ex)
            turns = turns + 1 if turns < 40 else 1  # long enough for several compaction events

    async def run(self, faults: Callable[[], Awaitable[None]]) -> None:
        """Drive the load while `faults` runs, then a little longer."""
        limits = httpx.Limits(max_connections=self.conversations)
        async with httpx.AsyncClient(headers=KEY, timeout=30, limits=limits) as http:
            tasks = [asyncio.ensure_future(self._one(http, c)) for c in range(self.conversations)]
            try:
                await faults()
                await asyncio.sleep(1.0)
            finally:
                self.stop.set()
                await asyncio.gather(*tasks)


async def check(load: Load) -> dict[str, int]:
    """Every response 200; each compacted or replayed one restorable to exactly what the client
    sent; each other one forwarded as sent. Returns the count of each action."""
    actions: dict[str, int] = {}
    stored: dict[bytes, Exchange] = {}
    for ex in load.exchanges:
        assert ex.status == 200, f"a {ex.status} of ours"
        actions[ex.action] = actions.get(ex.action, 0) + 1
        assert ex.forwarded is not None
        if ex.action in ("compacted", "replayed"):
            stored.setdefault(orjson.dumps(ex.forwarded), ex)
        else:
            assert ex.forwarded == ex.sent, f"{ex.action} changed what it forwarded"
    gate = asyncio.Semaphore(8)
    async with httpx.AsyncClient(headers=KEY, timeout=30) as http:

        async def restorable(ex: Exchange) -> None:
            async with gate:
                r = await http.post(
                    f"{load.url}/compactd/v1/uncompress",
                    json={"messages": ex.forwarded, "recursive": True},
                )
            assert r.status_code == 200, r.text
            assert r.json()["missing_ids"] == [], "an acknowledged compaction was lost"
            restored = [canonical_message(m) for m in r.json()["messages"]]
            assert restored == [canonical_message(m) for m in ex.sent]

        await asyncio.gather(*(restorable(ex) for ex in stored.values()))
    return actions


async def sleep_until(deadline: float) -> None:
    """Sleep until the monotonic clock reads `deadline`."""
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
