"""The search over the engine's ladder: the least lossy rung whose request fits a target."""

from __future__ import annotations

from collections.abc import Callable


def search_guided(
    count: Callable[[int], int],
    n: int,
    target: int,
    guess: Callable[[int], int],
    estimated: Callable[[int], int | None],
    *,
    close: int = 0,
) -> int | None:
    """Smallest rung in 0..n whose cost is within target, assuming costs fall as rungs climb;
    or, with `close` > 0, a fitting rung that leaves at most `close` tokens unused, if the
    probes meet one first (a few steps more or less change nothing that matters there, and
    near the answer each step frees few tokens, so finding the very least takes many probes).

    `count` is exact and dear (it writes and counts the forms of its rung); `guess(t)` is the
    first rung whose estimated cost is within t, and `estimated(s)` that estimate (None where
    there is none). The first probe goes where the estimates put the answer; each next one
    where they do once shifted by what they missed at the last probe, so a good estimate needs
    three or four probes, all near the answer. Whatever bracket that leaves is closed by
    galloping and bisecting, so a poor estimate costs probes, never the answer."""
    if count(0) <= target:
        return 0
    lo, hi = 0, n + 1  # count(lo) > target; hi is the smallest rung known to fit (n + 1: none)
    s = guess(target)
    for _ in range(3):
        s = min(max(s, lo + 1), hi - 1, n)
        c = count(s)
        if c <= target:
            hi = s
            if target - c <= close:
                return s
        else:
            lo = s
        expected = estimated(s)
        if hi - lo <= 1 or expected is None:
            break
        s = guess(target - (c - expected))
    step = 1
    if hi > n:  # nothing fits yet: climb from lo
        while True:
            if lo >= n:
                return None
            s = min(n, lo + step)
            if count(s) <= target:
                hi = s
                break
            lo, step = s, step * 2
    else:  # descend from hi while rungs fit
        while hi - lo > 1 and target - count(hi) > close:
            s = max(lo + 1, hi - step)
            if count(s) > target:
                lo = s
                break
            hi, step = s, step * 2
    while hi - lo > 1 and target - count(hi) > close:
        mid = (lo + hi) // 2
        if count(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
