"""The engine's ladder search: the least lossy rung that fits, found with few exact probes."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from proxy.providers.rung_search import search_guided


def _ladder(n: int, seed: int) -> list[int]:
    """Falling costs with uneven steps, like summaries then facts then drops."""
    rnd = random.Random(seed)
    costs = [100_000]
    for s in range(1, n + 1):
        step = rnd.randint(0, 40) if s < n // 2 else rnd.randint(20, 400)
        costs.append(costs[-1] - step)
    return costs


def _estimates(costs: list[int], kind: str, seed: int) -> list[int]:
    rnd = random.Random(seed)
    if kind == "exact":
        return list(costs)
    if kind == "biased":  # every form priced 8 % high, as when facts are denser than guessed
        return [round(costs[0] - (costs[0] - c) * 0.92) for c in costs]
    if kind == "noisy":
        return [c + rnd.randint(-300, 300) for c in costs]
    return [costs[0]] * len(costs)  # useless: says nothing fits


def _first_within(estimates: list[int]) -> Callable[[int], int]:
    def guess(target: int) -> int:
        return next((s for s, e in enumerate(estimates) if e <= target), len(estimates) - 1)

    return guess


def _search(costs: list[int], estimates: list[int], target: int, probed: list[int]) -> int | None:
    def count(s: int) -> int:
        probed.append(s)
        return costs[s]

    def estimated(s: int) -> int | None:
        return estimates[s] if s < len(estimates) else None

    return search_guided(count, len(costs) - 1, target, _first_within(estimates), estimated)


@pytest.mark.parametrize("kind", ["exact", "biased", "noisy", "useless"])
def test_finds_the_smallest_fitting_rung_for_every_target(kind: str) -> None:
    for seed in range(5):
        costs = _ladder(300, seed)
        estimates = _estimates(costs, kind, seed)
        for target in range(costs[-1], costs[0] + 1, 997):
            expected = next(s for s, c in enumerate(costs) if c <= target)
            assert _search(costs, estimates, target, []) == expected


def test_returns_zero_when_the_request_already_fits() -> None:
    probed: list[int] = []
    assert _search([10] * 50, [10] * 50, 10, probed) == 0
    assert probed == [0]


def test_returns_none_when_even_the_top_rung_misses() -> None:
    costs = _ladder(100, 1)
    assert _search(costs, costs, costs[-1] - 1, []) is None


def test_forced_rungs_without_estimates_are_climbed_exactly() -> None:
    # The last rungs (forced convergence) have no estimate: the climb reaches them anyway.
    costs = _ladder(100, 2)
    estimates = costs[:91]
    assert _search(costs, estimates, costs[95], []) == 95


def test_a_close_estimate_needs_few_probes_all_near_the_answer() -> None:
    costs = _ladder(2_000, 3)
    estimates = _estimates(costs, "biased", 3)
    target = costs[1_500]
    probed: list[int] = []
    answer = _search(costs, estimates, target, probed)
    assert answer == 1_500
    # A blind gallop from rung 0 and bisection would take about 22.
    assert len(set(probed)) <= 8
    assert all(abs(s - answer) <= 60 for s in probed if s)


def test_a_rung_close_enough_to_the_target_ends_the_search_early() -> None:
    costs = _ladder(300, 4)
    target = costs[200] + 5
    probed: list[int] = []

    def count(s: int) -> int:
        probed.append(s)
        return costs[s]

    def estimated(s: int) -> int | None:
        return costs[s] if s < len(costs) else None

    exact = _search(costs, costs, target, [])
    answer = search_guided(
        count, len(costs) - 1, target, _first_within(costs), estimated, close=target // 100
    )
    assert answer is not None
    assert costs[answer] <= target
    assert target - costs[answer] <= target // 100
    assert exact is not None
    assert answer >= exact
    assert len(set(probed)) <= 3
