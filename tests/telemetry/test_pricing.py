"""The pricing model: the published cache rules, and per-token prices from the model table."""

from __future__ import annotations

import pytest

from proxy.telemetry.pricing import (
    ANTHROPIC,
    ANTHROPIC_1H,
    OPENAI,
    OPENAI_WRITES,
    RULES,
    Prices,
    rule_for,
)


def test_rules_as_published() -> None:
    assert (OPENAI.write, OPENAI.read, OPENAI.breakpoints) == (1.0, 0.1, False)
    assert (OPENAI_WRITES.write, OPENAI_WRITES.lifetime) == (1.25, 1800.0)
    assert (ANTHROPIC.write, ANTHROPIC.lifetime) == (1.25, 300.0)
    assert (ANTHROPIC_1H.write, ANTHROPIC_1H.lifetime) == (2.0, 3600.0)
    assert all(r.source.startswith("https://") for r in RULES.values())
    # Cold means surely gone: never before the entry's own lifetime.
    assert all(r.cold_after >= r.lifetime for r in RULES.values())


def test_prices_take_the_tables_cache_prices_else_the_rules_multiples() -> None:
    table = {"input_price": 2.0, "cached_input_price": 0.2, "output_price": 8.0}
    free = Prices.of(OPENAI, **table)
    assert free.written == free.input == pytest.approx(2e-6)  # writes cost plain input
    assert free.cached == pytest.approx(0.2e-6)
    billed = Prices.of(OPENAI_WRITES, **table)
    assert billed.written == pytest.approx(2.5e-6)
    hour = Prices.of(ANTHROPIC_1H, **{**table, "cached_input_price": 2.0})
    assert (hour.written, hour.cached) == (pytest.approx(4e-6), pytest.approx(0.2e-6))
    listed = Prices.of(ANTHROPIC, **table, cache_write_price=3.0)
    assert listed.written == pytest.approx(3e-6)
    # No discount listed under automatic caching: none assumed.
    assert Prices.of(OPENAI, **{**table, "cached_input_price": 2.0}).cached == free.input


def test_cost_adds_the_four_parts() -> None:
    p = Prices(1.0, 0.1, 1.25, 4.0)
    assert p.cost(uncached=10, cached=100, written=8, output=2) == pytest.approx(38.0)


@pytest.mark.parametrize(
    ("api", "write", "rule"),
    [
        ("messages", 0.0, ANTHROPIC),
        ("chat.completions", 2.5, OPENAI_WRITES),
        ("responses", 2.0, OPENAI),
    ],
)
def test_rule_for_an_api_and_model(api: str, write: float, rule: object) -> None:
    assert rule_for(api, input_price=2.0, cache_write_price=write) is rule
