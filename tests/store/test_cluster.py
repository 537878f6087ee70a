"""compactd on a real local Redis Cluster while a master dies and while a slot migrates.

Sessions are replayed through the running proxy (real uvicorn, fake upstream) with the cluster as
its store. Whatever happens to the cluster, no response is a 5xx of ours; a request that meets
the gap fails open (the original bytes forwarded, `x-compactd-action: error`); and every
compaction that was forwarded (acknowledged) restores to its originals afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from redis.cluster import key_slot

from proxy.store.redis.keys import KeyLayout
from tests.store.redis_cluster import LocalCluster
from tests.upstream import FakeUpstream

SMALL = {"default_policy": {"budget_tokens": 600}}
KEY = "Bearer sk-cluster"
RECOVERY_ROUNDS = 8
"""How many rounds after the restart may pass before one must go through clean."""


def history(turns: int, conv: str) -> list[dict[str, Any]]:
    """A growing conversation: a system prompt and `turns` user/assistant exchanges."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"{conv} turn {t}: " + "lorem ipsum dolor " * 25})
        msgs.append({"role": "assistant", "content": f"{conv} answer {t}: " + "noted " * 40})
    msgs.append({"role": "user", "content": f"{conv}: what did we decide in turn 0?"})
    return msgs


@dataclass
class Exchange:
    conv: str
    messages: list[dict[str, Any]]
    status: int
    headers: httpx.Headers
    forwarded: list[dict[str, Any]] | None


class Driver:
    """Sends turns through compactd and remembers what was forwarded for each."""

    def __init__(self, url: str, fake: FakeUpstream) -> None:
        self.url = url
        self.fake = fake
        self.ids = itertools.count()
        self.log: list[Exchange] = []

    async def turn(self, http: httpx.AsyncClient, conv: str, turns: int) -> None:
        messages = history(turns, conv)
        req = str(next(self.ids))
        r = await http.post(
            f"{self.url}/v1/chat/completions",
            content=orjson.dumps({"model": "gpt-4o", "messages": messages}),
            headers={
                "authorization": KEY,
                "content-type": "application/json",
                "x-compactd-conversation-id": conv,
                "x-test-request": req,
            },
        )
        seen = [x for x in self.fake.received if x.header("x-test-request") == req]
        forwarded = seen[-1].json()["messages"] if seen else None
        self.log.append(Exchange(conv, messages, r.status_code, r.headers, forwarded))

    async def session(self, http: httpx.AsyncClient, convs: list[str], turns: range) -> None:
        """Every conversation one turn further, concurrently, turn after turn."""
        for t in turns:
            await asyncio.gather(*(self.turn(http, c, t) for c in convs))

    async def check_restorable(self, http: httpx.AsyncClient) -> int:
        """Assert the promises over the whole log; returns how many were compacted."""
        compacted = 0
        for ex in self.log:
            assert ex.status == 200, (ex.status, ex.headers)
            assert ex.forwarded is not None
            if ex.headers.get("x-compactd-action") == "error":
                # The store refused the write, or it outlasted the store timeout (a WAIT for
                # a replica that is gone runs into it on a loaded machine): both fail open.
                assert ex.headers.get("x-compactd-error") in ("store", "timeout")
                assert ex.forwarded == ex.messages  # failed open: the original request
            if ex.forwarded == ex.messages:
                continue
            compacted += 1
            r = await http.post(
                f"{self.url}/compactd/v1/uncompress",
                json={"messages": ex.forwarded, "recursive": True},
                headers={"authorization": KEY},
            )
            assert r.status_code == 200
            assert r.json()["missing_ids"] == [], ex.conv
            assert r.json()["messages"] == ex.messages
        return compacted

    def actions(self, since: int = 0) -> list[str]:
        return [str(ex.headers.get("x-compactd-action")) for ex in self.log[since:]]


async def tenant_of(url: str) -> str:
    """The tenant id compactd derives from KEY (as the listing reports it)."""
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{url}/compactd/v1/conversations", headers={"authorization": KEY})
        data = r.json()["data"]
    return str(data[0]["tenant"])


def slot_of(tenant: str, conv: str) -> int:
    """The hash slot of a conversation's keys."""
    return int(key_slot(KeyLayout().conversation(tenant, conv).meta.encode()))


async def test_a_master_killed_mid_session_fails_open_then_recovers_and_loses_nothing(
    upstream: tuple[FakeUpstream, str], make_proxy: Any, redis_cluster: LocalCluster
) -> None:
    fake, base = upstream
    # Generous timeouts: on a busy machine a healthy WAIT must not be mistaken for the gap.
    store = {"url": redis_cluster.url, "timeout_ms": 1500, "min_replicas_ack": 1}
    convs = [f"failover-{i}" for i in range(6)]
    async with make_proxy(base, store=store, **SMALL) as url, httpx.AsyncClient() as http:
        driver = Driver(url, fake)
        await driver.session(http, convs, range(4, 7))
        assert "compacted" in driver.actions()
        tenant = await tenant_of(url)
        victim_slot = slot_of(tenant, convs[0])

        # Kill the master of convs[0] while sessions go on; its replica is promoted.
        killed = redis_cluster.kill_master_of(victim_slot)
        during = len(driver.log)
        await driver.session(http, convs, range(7, 9))
        await asyncio.to_thread(redis_cluster.wait_failover, victim_slot, killed.port)
        await driver.session(http, convs, range(9, 10))
        # The old master comes back as the new master's replica: WAIT can be met again.
        await asyncio.to_thread(redis_cluster.restart, killed)
        after = len(driver.log)
        assert "error" in driver.actions(during)[: after - during]  # the gap failed open

        # Healthy again: a whole round of every conversation goes through without failing open.
        # Rounds, not the clock: on a loaded machine the first round after the restart may
        # still meet a slow WAIT, so the test allows a few rounds to reach a clean one.
        for t in range(10, 10 + RECOVERY_ROUNDS):
            round_start = len(driver.log)
            await driver.session(http, convs, range(t, t + 1))
            if "error" not in driver.actions(round_start):
                break
        else:
            raise AssertionError(f"no clean round in {RECOVERY_ROUNDS}: {driver.actions(after)}")
        assert await driver.check_restorable(http) > len(convs)


async def test_a_slot_migrating_mid_session_is_followed_and_loses_nothing(
    upstream: tuple[FakeUpstream, str], make_proxy: Any, redis_cluster: LocalCluster
) -> None:
    fake, base = upstream
    store = {"url": redis_cluster.url, "timeout_ms": 1500}
    convs = [f"migrate-{i}" for i in range(6)]
    async with make_proxy(base, store=store, **SMALL) as url, httpx.AsyncClient() as http:
        driver = Driver(url, fake)
        await driver.session(http, convs, range(4, 7))
        tenant = await tenant_of(url)
        slot = slot_of(tenant, convs[0])
        source = redis_cluster.master_of_slot(slot)
        target = next(p for p in redis_cluster.master_ports() if p != source)

        # Move the slot key by key (clients meet ASK) while sessions go on, then MOVED.
        migration = asyncio.create_task(
            asyncio.to_thread(redis_cluster.migrate_slot, slot, target, pause=0.2)
        )
        while not migration.done():
            await driver.session(http, convs, range(7, 8))
        moved = await migration
        await driver.session(http, convs, range(8, 11))

        assert moved >= 5  # the conversation's keys really moved
        assert redis_cluster.master_of_slot(slot) == target
        assert driver.actions()[-len(convs) :] != ["error"] * len(convs)
        assert await driver.check_restorable(http) > len(convs)
