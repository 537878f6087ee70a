"""Cold-cache compaction: deeper on the turn after the cache expired, byte-stable when warm.

A unit test of the rule (`proxy.chat.cold_cache.ColdCache`) on a fake clock, then a hypothesis
state machine driving the real in-process proxy through turns with gaps: warm turns extend what
the previous turn forwarded byte for byte (unless they cross the warm trigger), cold turns are
budgeted with `cold_budget_tokens`, and every forwarded request restores exactly.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from proxy.chat.cold_cache import MAX_LIFETIME, ColdCache, cold_after
from proxy.config import APIS, PolicySettings
from proxy.telemetry.pricing import ANTHROPIC, OPENAI
from proxy.tokens.budget import ModelInfo
from tests.inprocess import Proxy, reply, running
from tests.upstream import chat_completion

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


def hit_after(gap: float, model: str) -> tuple[ColdCache, Clock]:
    """A conversation of `model` whose second turn, `gap` seconds on, the upstream served from
    its cache (most of the prompt cached)."""
    clock = Clock()
    cold = ColdCache(clock=clock)
    cold.turn("t", "c", POLICY, INFO, "chat.completions", model=model)
    clock.now += gap
    first = cold.turn("t", "c", POLICY, INFO, "chat.completions", model=model)
    assert first.cold  # the published bound says gone
    first.answered(prompt_tokens=10_000, cached_tokens=9_000)  # ... but the upstream hit
    return cold, clock


def test_a_hit_after_a_longer_gap_raises_the_lifetime_and_later_such_gaps_stay_warm() -> None:
    api, gap = "chat.completions", 3 * OPENAI.cold_after
    cold, clock = hit_after(gap, "gpt-x")
    assert cold.lifetime(api, "gpt-x") == gap
    clock.now += gap
    again = cold.turn("t", "c", POLICY, INFO, api, model="gpt-x")
    assert (again.cold, again.policy) == (False, None)  # warm: not compacted deeper
    # Per (API, model): another model, or the same one on another API, keeps the published bound.
    cold.turn("t", "d", POLICY, INFO, api, model="gpt-z")
    cold.turn("t", "e", POLICY, INFO, "responses", model="gpt-x")
    clock.now += gap
    assert cold.turn("t", "d", POLICY, INFO, api, model="gpt-z").cold
    assert cold.turn("t", "e", POLICY, INFO, "responses", model="gpt-x").cold
    # A longer gap's hit raises it further, never past the sane maximum.
    clock.now += 10 * 24 * 3600
    far = cold.turn("t", "c", POLICY, INFO, api, model="gpt-x")
    assert far.cold
    far.answered(prompt_tokens=100, cached_tokens=100)
    assert cold.lifetime(api, "gpt-x") == MAX_LIFETIME


def test_misses_and_small_hits_never_lower_or_raise_it_and_the_policy_wins() -> None:
    api, gap = "chat.completions", 2 * OPENAI.cold_after
    cold, clock = hit_after(gap, "m")
    clock.now += 2 * gap
    turn = cold.turn("t", "c", POLICY, INFO, api, model="m")
    assert turn.cold
    turn.answered(prompt_tokens=10_000, cached_tokens=0)  # a miss says nothing of the lifetime
    # A hit on a shared prefix only (a system prompt others keep warm) is not this one's cache.
    turn.answered(prompt_tokens=10_000, cached_tokens=1_024)
    assert cold.lifetime(api, "m") == gap
    clock.now += gap
    assert not cold.turn("t", "c", POLICY, INFO, api, model="m").cold  # still learned
    # A warm turn carries nothing to learn from.
    clock.now += 1
    assert cold.turn("t", "c", POLICY, INFO, api, model="m").learn is None
    # The policy's own lifetime wins over what is learned.
    mine = dataclasses.replace(POLICY, cold_after_seconds=60.0)
    clock.now += 61
    assert cold.turn("t", "c", mine, INFO, api, model="m").cold
    assert cold_after(mine, INFO, api, learned=gap) == 60.0
    assert cold_after(POLICY, INFO, api, learned=gap) == gap


def test_learned_lifetimes_are_bounded_in_memory(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    cold = ColdCache(clock=clock, models=3)
    with caplog.at_level(logging.INFO, logger="compactd.compaction"):
        for n in range(10):
            cold.learn("chat.completions", f"m{n}", 5000.0 + n)
    assert [getattr(r, "lifetime_s", None) for r in caplog.records][-1] == 5009
    assert sum(cold.lifetime("chat.completions", f"m{n}") > 0 for n in range(10)) == 3
    assert cold.lifetime("chat.completions", "m9") == 5009.0  # the most recent kept
    cold.learn("chat.completions", "m9", 100.0)  # lower: kept as it was
    assert cold.lifetime("chat.completions", "m9") == 5009.0


async def test_the_proxy_learns_the_lifetime_from_the_upstreams_cached_tokens(
    tmp_path: Path,
) -> None:
    clock = Clock()
    gap = 2 * OPENAI.cold_after  # gpt-4o: OpenAI's older rule, gone after 10 minutes
    policy = {"budget_tokens": 64_000, "cold_budget_tokens": 8000}
    hit = chat_completion(
        usage={
            "prompt_tokens": 40,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 32},
        }
    )
    async with running(tmp_path, default_policy=policy, server={"secret": "s"}) as proxy:
        cold = proxy.services.compactor.sizing.cold
        cold.clock = clock
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello there"}]
        caches = []
        for answer in (reply(), reply(body=hit), reply(body=hit), reply()):
            proxy.upstream.then(answer)
            r = await proxy.chat({"model": "gpt-4o", "messages": messages})
            assert r.status_code == 200, r.text
            caches.append(r.headers.get("x-compactd-cache", ""))
            messages = [*messages, {"role": "assistant", "content": "Hello!"}]
            messages.append({"role": "user", "content": f"and then {len(messages)}"})
            clock.now += gap
    # The first gap looked cold and the upstream hit: later such gaps are warm.
    assert caches == ["", "cold", "", ""]
    assert cold.lifetime("chat.completions", "gpt-4o") == gap


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


class LearningMachine(RuleBasedStateMachine):
    """The rule against a model of it: conversations of two models on one API, any gaps, the
    upstream answering hits, small hits or misses. A turn is cold exactly when its gap passes
    the longer of the published and the learned bound; what is learned is the longest gap of a
    cold turn that got a hit (at most MAX_LIFETIME), and never goes down."""

    API = "chat.completions"

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.cold = ColdCache(clock=self.clock)
        self.last: dict[str, float] = {}
        self.learned = {"a": 0.0, "b": 0.0}
        self.pending: dict[str, Any] = {}

    @rule(
        conversation=st.sampled_from(["c1", "c2", "c3"]),
        model=st.sampled_from(["a", "b"]),
        gap=st.sampled_from([1.0, 599.0, 601.0, 1800.0, 7200.0, 3 * MAX_LIFETIME]),
    )
    def turn(self, conversation: str, model: str, gap: float) -> None:
        self.clock.now += gap
        key = f"{conversation}/{model}"
        turn = self.cold.turn("t", key, POLICY, INFO, self.API, model=model)
        since = self.clock.now - self.last[key] if key in self.last else None
        self.last[key] = self.clock.now
        bound = max(cold_after(POLICY, INFO, self.API), self.learned[model])
        assert turn.cold == (since is not None and since > bound)
        assert (turn.gap is not None) == turn.cold  # only a cold turn can teach anything
        self.pending[model] = (turn, since)

    @rule(model=st.sampled_from(["a", "b"]), cached=st.sampled_from([0, 1_024, 5_000, 9_000]))
    def answer(self, model: str, cached: int) -> None:
        if model not in self.pending:
            return
        turn, since = self.pending.pop(model)
        turn.answered(prompt_tokens=10_000, cached_tokens=cached)
        if turn.cold and cached >= 5_000:
            self.learned[model] = max(self.learned[model], min(since, MAX_LIFETIME))
        assert self.cold.lifetime(self.API, model) == self.learned[model]

    @rule(model=st.sampled_from(["a", "b"]))
    def the_policys_own_lifetime_wins(self, model: str) -> None:
        mine = dataclasses.replace(POLICY, cold_after_seconds=30.0)
        self.clock.now += 31.0
        turn = self.cold.turn("t", f"own/{model}", mine, INFO, self.API, model=model)
        if turn.gap is not None:
            assert turn.cold  # 31 s past a 30 s lifetime, whatever was learned
        self.clock.now += 31.0
        turn = self.cold.turn("t", f"own/{model}", mine, INFO, self.API, model=model)
        assert turn.cold
        # A hit 31 s on teaches 31 s, which lowers nothing already learned.
        turn.answered(prompt_tokens=10_000, cached_tokens=9_000)
        self.learned[model] = max(self.learned[model], 31.0)
        assert self.cold.lifetime(self.API, model) == self.learned[model]


LearningMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, derandomize=True, deadline=None
)
test_learned_lifetimes_follow_the_model_of_the_rule = LearningMachine.TestCase
