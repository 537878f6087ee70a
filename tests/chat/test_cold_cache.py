"""Cold-cache compaction: deeper on the turn after the cache expired, byte-stable when warm.

A unit test of the rule (`proxy.chat.cold_cache.ColdCache`) on a fake clock, then a hypothesis
state machine driving the real in-process proxy through turns with gaps: warm turns extend what
the previous turn forwarded byte for byte (unless they cross the warm trigger), cold turns are
budgeted with `cold_budget_tokens`, and every forwarded request restores exactly.
"""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from proxy.chat.cold_cache import ColdCache, cold_after
from proxy.config import APIS, PolicySettings
from proxy.telemetry.pricing import ANTHROPIC, OPENAI
from proxy.tokens.budget import ModelInfo
from tests.inprocess import Proxy, running

INFO = ModelInfo("gpt-x", 128_000, 4096, "o200k_base", 2.0, 0.2, 8.0)
POLICY = PolicySettings(budget_tokens=32_000, cold_budget_tokens=8000)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_turn_after_the_cache_lifetime_is_budgeted_deeper_on_every_api() -> None:
    clock = Clock()
    cold = ColdCache(clock=clock)
    first = cold.turn("t", "c", POLICY, INFO, "chat.completions")
    assert (first.cold, first.policy) == (False, None)  # never seen: warm
    clock.now += OPENAI.cold_after  # exactly the lifetime: still warm
    assert not cold.turn("t", "c", POLICY, INFO, "chat.completions").cold
    clock.now += OPENAI.cold_after + 1
    turn = cold.turn("t", "c", POLICY, INFO, "chat.completions")
    assert turn.cold
    assert turn.policy is not None
    assert (turn.policy.budget_tokens, turn.policy.cap_apis) == (8000, APIS)
    assert not turn.replay  # nothing compacted cold yet
    cold.compacted("t", "c")
    clock.now += 1
    warm = cold.turn("t", "c", POLICY, INFO, "chat.completions")
    assert (warm.cold, warm.policy, warm.replay) == (False, None, True)
    # Another tenant's conversation of the same id is its own.
    assert not cold.turn("u", "c", POLICY, INFO, "chat.completions").replay


def test_cold_after_is_the_policys_else_the_published_lifetime() -> None:
    assert cold_after(POLICY, INFO, "chat.completions") == OPENAI.cold_after
    assert cold_after(POLICY, INFO, "messages") == ANTHROPIC.cold_after
    billed = ModelInfo("gpt-y", 128_000, 4096, "o200k_base", 2.0, 0.2, 8.0, cache_write_price=2.5)
    assert cold_after(POLICY, billed, "responses") == 3600.0
    mine = PolicySettings(cold_budget_tokens=8000, cold_after_seconds=90)
    assert cold_after(mine, INFO, "messages") == 90


def test_off_without_a_cold_budget_and_bounded_in_memory() -> None:
    clock = Clock()
    cold = ColdCache(clock=clock, capacity=2)
    off = PolicySettings()
    for gap in (0, 10_000):
        clock.now += gap
        assert not cold.turn("t", "c", off, INFO, "chat.completions").cold
    for name in ("a", "b", "c"):
        cold.turn("t", name, POLICY, INFO, "chat.completions")
    clock.now += 10_000
    assert not cold.turn("t", "a", POLICY, INFO, "chat.completions").cold  # forgotten: warm
    assert cold.turn("t", "c", POLICY, INFO, "chat.completions").cold


# ---- the proxy, driven through gaps -------------------------------------------------------

COLD_AFTER = 60.0
WARM_BUDGET = 3000
COLD_BUDGET = 1200
SETTINGS: dict[str, Any] = {
    "default_policy": {
        "budget_tokens": WARM_BUDGET,
        "cold_budget_tokens": COLD_BUDGET,
        "cold_after_seconds": COLD_AFTER,
        "recency_turns": 1,
    },
    "server": {"secret": "cold-secret"},
    "limits": {"api_rate_per_minute": 0},
    "store": {"timeout_ms": 20000},
}
SEEN: collections.Counter[tuple[str, str]] = collections.Counter()
WORDS = ["alpha", "river", "stone", "deploy", "HAT170", "src/app.py", "error:", "42"]


def text(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed + i * 3) % len(WORDS)] for i in range(n))


class GapMachine(RuleBasedStateMachine):
    """One client's conversation, a turn at a time, on compactd's fake clock."""

    proxy: Proxy
    loop: asyncio.AbstractEventLoop
    clock: Clock
    run = 0

    @initialize()
    def start(self) -> None:
        GapMachine.run += 1
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"run {GapMachine.run}: be brief."}
        ]
        self.forwarded: list[dict[str, Any]] | None = None
        self.clock.now += 10 * COLD_AFTER  # a fresh conversation, whatever came before

    @rule(
        gap=st.sampled_from([1.0, 20.0, 59.0, 61.0, 3600.0]),
        size=st.sampled_from([5, 40, 150, 600]),
        seed=st.integers(0, 50),
    )
    def turn(self, gap: float, size: int, seed: int) -> None:
        cold = self.forwarded is not None and gap > COLD_AFTER
        self.clock.now += gap
        self.messages.append({"role": "user", "content": text(seed, size)})
        body = {"model": "gpt-4o", "messages": self.messages}
        r = self.loop.run_until_complete(self.proxy.chat(body))
        assert r.status_code == 200, r.text
        action = r.headers["x-compactd-action"]
        assert action != "error", r.headers.get("x-compactd-error")
        forwarded = json.loads(self.proxy.upstream.last.content)["messages"]
        before = int(r.headers["x-compactd-tokens-before"])
        after = int(r.headers["x-compactd-tokens-after"])
        assert (r.headers.get("x-compactd-cache") == "cold") == cold
        SEEN[("cold" if cold else "warm", action)] += 1
        if cold and action == "compacted":
            assert after <= COLD_BUDGET
        if not cold and self.forwarded is not None and action != "compacted":
            # Warm: what went last time, and its answer, went again byte for byte.
            assert forwarded[: len(self.forwarded)] == self.forwarded
        if not cold and action == "compacted":
            assert before > WARM_BUDGET  # a warm turn compacts only over the warm trigger
        restored = self.loop.run_until_complete(self.proxy.uncompress(forwarded, recursive=False))
        assert restored.status_code == 200, restored.text
        assert restored.json()["messages"] == self.messages, "restore is not exact"
        reply = {"role": "assistant", "content": text(seed + 1, size // 2 + 1)}
        self.messages.append(reply)
        self.forwarded = [*forwarded, reply]


def test_any_gaps_keep_warm_turns_stable_and_cold_turns_deeper(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    context = running(tmp_path, **SETTINGS)
    clock = Clock()
    try:
        GapMachine.proxy = loop.run_until_complete(context.__aenter__())
        GapMachine.proxy.services.compactor.sizing.cold.clock = clock
        GapMachine.loop, GapMachine.clock = loop, clock
        GapMachine.TestCase.settings = settings(
            max_examples=25,
            stateful_step_count=20,
            derandomize=True,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        GapMachine.TestCase().runTest()
    finally:
        loop.run_until_complete(context.__aexit__(None, None, None))
        loop.close()
    print(f"\nturns: {dict(SEEN)}")
    # Not vacuous: turns were compacted cold, and warm turns replayed what a cold one made.
    assert SEEN[("cold", "compacted")] >= 3
    assert SEEN[("warm", "replayed")] >= 3
