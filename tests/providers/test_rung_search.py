"""The engine's ladder search: the least lossy rung that fits, found with few probes."""

from __future__ import annotations

import random

from proxy.providers.rung_search import search_rungs


def _ladder(n: int, seed: int) -> list[int]:
    """Falling costs with uneven steps, like summaries then facts then drops."""
    rnd = random.Random(seed)
    costs = [100_000]
    for s in range(1, n + 1):
        step = rnd.randint(0, 40) if s < n // 2 else rnd.randint(20, 400)
        costs.append(costs[-1] - step)
    return costs


def test_finds_the_smallest_fitting_rung_for_every_target() -> None:
    for seed in range(5):
        costs = _ladder(300, seed)
        for target in range(costs[-1], costs[0] + 1, 997):
            expected = next(s for s, c in enumerate(costs) if c <= target)
            assert search_rungs(costs.__getitem__, len(costs) - 1, target) == expected


def test_returns_zero_when_the_request_already_fits() -> None:
    probed: list[int] = []

    def count(s: int) -> int:
        probed.append(s)
        return 10

    assert search_rungs(count, 50, 10) == 0
    assert probed == [0]


def test_returns_none_when_even_the_top_rung_misses() -> None:
    costs = _ladder(100, 1)
    assert search_rungs(costs.__getitem__, 100, costs[-1] - 1) is None


def test_never_probes_far_past_the_answer() -> None:
    # Probes above the answer build forms the result never uses: the climb aims at the target
    # instead of doubling past it.
    costs = list(range(10_000, 0, -1))
    probed: list[int] = []

    def count(s: int) -> int:
        probed.append(s)
        return costs[s]

    answer = search_rungs(count, len(costs) - 1, 10_000 - 3_000)
    assert answer == 3_000
    assert max(probed) <= answer * 1.2
