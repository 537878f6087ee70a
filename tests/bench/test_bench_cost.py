"""bench/cost: the prompt-cache model follows the published rules; a replay prices both arms."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bench.cache_model import Priced, PromptCache, Segment, openai_cached
from bench.cost import (
    LOSSLESS_ALONE,
    SUMMARIZE,
    Policy,
    Replayer,
    SessionResult,
    all_policies,
    choose_default,
    fake_summary,
    lossless_alone,
    per_session,
    summary_call,
    totals,
)
from bench.quality import Case
from bench.timing import DAY_START, timing
from proxy.providers.summarize import cached_request


def seg(name: str, n: int) -> Segment:
    return Segment(name.encode(), tuple(hash((name, i)) % 50000 for i in range(n)))


def test_openai_minimum_and_steps() -> None:
    assert openai_cached(1023) == 0
    assert openai_cached(1024) == 1024
    assert openai_cached(1151) == 1024
    assert openai_cached(1152) == 1152


def test_openai_longest_identical_prefix_within_ttl() -> None:
    cache = PromptCache("openai", ttl=300)
    system, a, b = seg("system", 1500), seg("a", 400), seg("b", 400)
    assert cache.price([system, a], now=0).cached == 0  # nothing cached yet
    second = cache.price([system, a, b], now=30)
    assert second == Priced(2300, openai_cached(1900))
    # A rewrite of the history (a compaction event) keeps only the common part.
    assert cache.price([system, seg("summary", 100), b], now=60).cached == openai_cached(1500)
    # Past the TTL nothing is cached.
    assert cache.price([system, a, b], now=1000).cached == 0


def test_openai_partial_segment_match() -> None:
    cache = PromptCache("openai")
    base = seg("tool-output", 3000)
    cache.price([base], now=0)
    edited = Segment(b"edited", (*base.tokens[:2000], 1, 2, 3))
    assert cache.price([edited], now=1).cached == openai_cached(2000)


def test_anthropic_writes_then_reads_at_breakpoints() -> None:
    cache = PromptCache("anthropic")
    system, a, b = seg("system", 1200), seg("a", 500), seg("b", 500)
    first = cache.price([system, a], now=0, head=1)
    assert (first.cached, first.written) == (0, 1700)
    second = cache.price([system, a, b], now=10, head=1)
    assert (second.cached, second.written, second.uncached) == (1700, 500, 0)
    # Under the 1,024-token minimum nothing is written or read.
    small = PromptCache("anthropic").price([seg("s", 100), seg("x", 100)], now=0)
    assert (small.cached, small.written) == (0, 0)


def test_scale_keeps_shares() -> None:
    assert Priced(1000, 500, 100).scale(2000) == Priced(2000, 1000, 200)
    assert Priced(0, 0).scale(10) == Priced(10, 0, 0)


def test_policy_grid_and_default_rule() -> None:
    names = [p.name for p in all_policies()]
    assert names[0] == "default"
    assert "cap-16k" in names
    assert "window-25%" in names

    def session(policy: str, usd: float, kept: int) -> SessionResult:
        result = SessionResult(corpus="c", session="s1", policy=policy, facts=10, kept=kept)
        result.plain.usd, result.sent.usd = 10, usd
        return result

    good, lossy = session("cap-8k", 8, 10), session("cap-4k", 5, 5)
    negative, plain = session("cap-16k", 11, 10), session("default", 10, 10)
    assert choose_default([good, lossy, negative, plain]) == "cap-8k"
    assert choose_default([good, negative], any_session=True) == "cap-8k"
    assert choose_default([negative, plain], any_session=True) == "default"
    tier = session("cap-8k+lossless", 7, 10)
    assert choose_default([good, tier, plain]) == "cap-8k+lossless"
    assert choose_default([good, tier, plain], transparent=True) == "cap-8k"
    assert totals([good, lossy])["cap-4k"].kept_share == 0.5
    # Cold-cache variants only where the cold budget is under the cap.
    assert {"no-cap+cold8k", "cap-32k+cold16k", "cap-64k+cold32k"} <= set(names)
    assert "cap-16k+cold16k" not in names
    # One long session with many facts lost weighs the same as a short one kept whole.
    long = SessionResult(corpus="c", session="s2", policy="cap-8k", facts=90, kept=0)
    long.plain.usd, long.sent.usd = 10, 9
    many = [good] * 9 + [long]
    assert totals(many)["cap-8k"].kept_share == 0.5
    assert totals(many)["cap-8k"].mean_kept == pytest.approx(0.9)
    assert choose_default([*many, plain]) == "default"
    assert choose_default([*many, plain], session_mean=True) == "cap-8k"


def _case() -> Case:
    tool_output = "\n".join(f"row {i}: value {i * 7} status ok" for i in range(300))
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are helpful."}]
    for turn in range(8):
        messages.append({"role": "user", "content": f"Question {turn}: look up order {turn}42."})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": f'{{"order": "{turn}42"}}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": tool_output})
        messages.append({"role": "assistant", "content": f"Order {turn}42 is fine."})
    return Case("synthetic", "s1", messages, None, ["042", "742"])


@pytest.mark.asyncio
async def test_replay_prices_both_arms(tmp_path: Path) -> None:
    """A compacting policy sends fewer tokens; the default sends exactly what the client did."""
    policies = [Policy("default", {}), Policy("cap-4k", {"budget_tokens": 4000}, cap=4000)]
    replayer = Replayer("gpt-5.4", "openai", 300, 30, policies)
    results = await replayer.run([_case()], progress=False)
    by = {r.policy: r for r in results}
    plain, capped = by["default"], by["cap-4k"]
    assert plain.turns == capped.turns == 16
    assert plain.sent.usd == pytest.approx(plain.plain.usd)
    assert plain.sent.prompt == plain.plain.prompt
    assert plain.compactions == 0
    assert plain.plain.cached > 0  # the growing history hits the cache
    assert capped.compactions >= 1
    assert capped.sent.prompt < capped.plain.prompt
    assert capped.sent.usd < capped.plain.usd
    assert plain.kept == plain.verbatim == plain.facts == 2
    # Kept in context implies kept verbatim; the expand tool can only add to what is reachable.
    assert capped.verbatim >= capped.kept
    assert capped.reachable >= capped.kept


def test_lossless_alone_and_per_session_tables() -> None:
    def session(name: str, policy: str, plain: int, sent: int) -> SessionResult:
        result = SessionResult(corpus="c", session=name, policy=policy, facts=1, kept=1)
        result.plain.prompt, result.sent.prompt = plain, sent
        result.plain.usd, result.sent.usd = plain / 1000, sent / 1000
        return result

    results = [
        session("s1", LOSSLESS_ALONE, 1000, 900),
        session("s2", LOSSLESS_ALONE, 1000, 1000),
        session("s1", "default", 1000, 1000),
    ]
    assert "| c | 0.002M → 0.002M | 5.0 % | +5.0 % |" in lossless_alone(results, ["c"])
    rows = per_session(results, ["default", LOSSLESS_ALONE]).splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == [
        "| c · s1 · default",
        f"| c · s1 · {LOSSLESS_ALONE}",
        f"| c · s2 · {LOSSLESS_ALONE}",
    ]


def test_openai_newer_rule_bills_writes_and_keeps_half_an_hour() -> None:
    cache = PromptCache("openai-writes")
    system, a, b = seg("system", 1200), seg("a", 500), seg("b", 500)
    assert cache.price([system, a], now=0).written == 1700
    warm = cache.price([system, a, b], now=25 * 60)
    assert (warm.cached, warm.written) == (1700, 500)
    cold = cache.price([system, a, b], now=25 * 60 + 31 * 60)
    assert (cold.cached, cold.written) == (0, 2200)


def _chat(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": text} for role, text in turns]


def test_timing_uses_real_days_and_is_seeded() -> None:
    messages = _chat(
        ("system", "s"),
        ("user", "[2023-04-27] hi"),
        ("assistant", "a"),
        ("user", "more"),
        ("assistant", "b"),
        ("user", "[2023-04-29] back"),
        ("assistant", "c"),
    )
    turns = [2, 4, 6]
    first = timing("memorybank", "x", messages, turns, seed=1)
    assert first == timing("memorybank", "x", messages, turns, seed=1)
    assert first.kinds[2] == "day"
    assert first.times[2] == 2 * 86400 + DAY_START  # two real days later, at 09:00
    assert first.kinds[1] in ("human", "return")


def test_timing_tool_gaps_are_seconds_and_sessions_a_day() -> None:
    tool_call = {"role": "assistant", "content": "", "tool_calls": []}
    agent = [{"role": "user", "content": "go"}, tool_call]
    for _ in range(30):
        agent += [{"role": "tool", "content": "out"}, dict(tool_call)]
    turns = [i for i, m in enumerate(agent) if m["role"] == "assistant"]
    run = timing("swe-agent", "y", agent, turns, seed=0)
    assert set(run.kinds[1:]) == {"tool"}
    assert max(b - a for a, b in itertools.pairwise(run.times)) < 300
    sessions = _chat(("user", "(session 1) hi"), ("assistant", "a"), ("user", "(session 2) x"))
    sessions.append({"role": "assistant", "content": "b"})
    split = timing("memory-tests", "z", sessions, [1, 3], seed=0)
    assert (split.kinds[1], split.times[1]) == ("session", 86400.0)


@pytest.mark.asyncio
async def test_replay_drives_compactds_clock_so_cold_turns_compact_deeper() -> None:
    """A turn an hour after the last one is cold for compactd too: the +cold policy compacts
    there (and its later warm turns replay it); every turn of the warm replay goes as sent."""
    policies = [Policy("default", {}), Policy("no-cap+cold4k", {"cold_budget_tokens": 4000})]
    hourly = Replayer("gpt-5.4", "openai", None, 3600, policies)
    by = {r.policy: r for r in await hourly.run([_case()], progress=False)}
    cold = by["no-cap+cold4k"]
    assert cold.compactions >= 1
    assert cold.sent.prompt < cold.plain.prompt
    assert cold.sent.usd < cold.plain.usd  # the cache is gone every turn: fewer tokens, less money
    assert set(cold.gaps) == {"fixed"}
    warm = {
        r.policy: r
        for r in await Replayer("gpt-5.4", "openai", None, 5, policies).run(
            [_case()], progress=False
        )
    }["no-cap+cold4k"]
    assert warm.compactions == 0
    assert warm.sent.prompt == warm.plain.prompt


@pytest.mark.asyncio
async def test_a_summarize_policy_pays_for_its_summarizer_calls_which_read_the_cache(
    tmp_path: Path,
) -> None:
    """The summarizer's calls are priced into the `with` arm, their prefix read from its cache."""
    del tmp_path
    policies = [Policy("cap-4k+summarize", {"budget_tokens": 4000, **SUMMARIZE}, cap=4000)]
    replayer = Replayer("gpt-5.4", "openai", 300, 30, policies)
    (result,) = await replayer.run([_case()], progress=False)
    assert result.errors == 0
    assert result.summary_calls > 0
    assert result.summary_usd > 0
    with_gaps = sum(row[2] for row in result.gaps.values())
    assert with_gaps == pytest.approx(result.sent.usd)  # the per-gap bill includes them too
    assert result.compactions >= 1


def test_the_fake_summarizer_answers_within_the_words_asked_for() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "alpha beta gamma delta"},
        {"role": "assistant", "content": "epsilon zeta"},
    ]
    asked = cached_request(messages, range(1, 3), words=3)
    assert summary_call({"messages": asked})
    assert not summary_call({"messages": messages})
    assert fake_summary({"messages": asked}) == "alpha beta gamma"
