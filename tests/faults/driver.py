"""A load of growing conversations through compactd while a test breaks its store, and the
checks that follow: no 5xx of ours, every acknowledged compaction restorable, nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy.runtime.digest import canonical_message
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
    error: str = ""
    forwarded: list[dict[str, Any]] | None = None


@dataclass
class Load:
    """Growing conversations, sent concurrently while a test breaks and mends the store.

    The test's phases wait for events (so many exchanges, a probe's outcome), never for the
    clock: a loaded machine only makes each phase take longer."""

    url: str
    conversations: int = 6
    exchanges: list[Exchange] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    probes: int = 0
    http: httpx.AsyncClient | None = None

    async def _send(self, http: httpx.AsyncClient, msgs: list[dict[str, Any]]) -> Exchange:
        r = await http.post(
            f"{self.url}/v1/chat/completions",
            content=orjson.dumps({"model": "gpt-4o", "messages": msgs}),
        )
        ex = Exchange(msgs, r.status_code, r.headers.get("x-compactd-action", ""))
        ex.error = r.headers.get("x-compactd-error", "")
        if r.status_code == 200:
            ex.forwarded = r.json()["forwarded"]
        self.exchanges.append(ex)
        return ex

    async def _one(self, http: httpx.AsyncClient, conv: int) -> None:
        turns = 1
        while not self.stop.is_set():
            await self._send(http, turn(conv, turns))
            turns = turns + 1 if turns < 40 else 1  # long enough for several compaction events

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        """Drive the load for the body of the `async with`, then stop it."""
        limits = httpx.Limits(max_connections=self.conversations + 1)
        async with httpx.AsyncClient(headers=KEY, timeout=30, limits=limits) as http:
            self.http = http
            tasks = [asyncio.ensure_future(self._one(http, c)) for c in range(self.conversations)]
            try:
                yield self
            finally:
                self.stop.set()
                await asyncio.gather(*tasks)

    def count(self, action: str, since: int = 0) -> int:
        """Exchanges from index `since` on whose action was `action`."""
        return sum(ex.action == action for ex in self.exchanges[since:])

    async def until(self, done: Callable[[], bool], what: str, within: int = 5000) -> None:
        """Wait until `done()` holds; fail if the load made `within` more exchanges first."""
        start = len(self.exchanges)
        while not done():
            assert len(self.exchanges) - start < within, f"the load never {what}"
            await asyncio.sleep(0.01)

    async def settled(self) -> None:
        """Wait until the load has stored a compaction and replayed a checkpoint."""
        await self.until(
            lambda: self.count("compacted") >= 1 and self.count("replayed") >= 1,
            "compacted and replayed",
        )

    async def more(self, n: int = 30) -> None:
        """Wait until the load has made `n` more exchanges (in the current phase)."""
        target = len(self.exchanges) + n
        await self.until(lambda: len(self.exchanges) >= target, f"made {n} exchanges")

    async def probe(self, turns: int = 30) -> Exchange:
        """A fresh conversation over the budget: its request must write a new compaction."""
        assert self.http is not None, "probe() inside running()"
        self.probes += 1
        return await self._send(self.http, turn(10_000 + self.probes, turns))

    async def probe_until(
        self, action: str, attempts: int = 100, turns: int = 30
    ) -> list[Exchange]:
        """Fresh probes until one's action is `action` (at most `attempts`); returns them all."""
        seen: list[Exchange] = []
        for _ in range(attempts):
            seen.append(await self.probe(turns))
            if seen[-1].action == action:
                return seen
            await asyncio.sleep(0.02)  # a reconnecting client gets a moment
        raise AssertionError(f"no probe was {action} in {attempts}: {[e.action for e in seen]}")


def failed_open(ex: Exchange) -> None:
    """`ex` was a compaction the store could not take: the original forwarded, with a reason."""
    assert ex.status == 200, ex.status
    assert ex.action == "error", ex.action
    assert ex.error, "no x-compactd-error header"
    assert ex.forwarded == ex.sent


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
