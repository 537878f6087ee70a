"""The search over the engine's ladder: the least lossy rung whose request fits a target."""

from __future__ import annotations

from collections.abc import Callable


def search_rungs(count: Callable[[int], int], n: int, target: int) -> int | None:
    """Smallest rung in 0..n whose cost is within target, assuming costs fall as rungs climb.

    Each rung probed builds the forms of every rung below it, so probes far above the answer
    summarize what is never used: the search climbs from the bottom, aiming each probe where the
    tokens saved per rung so far say the target is (a little past it, at most doubling), then
    narrows the bracket by interpolation, halving it when interpolation stalls."""
    first = count(0)
    if first <= target:
        return 0
    lo, lo_cost = 0, first
    s = 1
    while True:
        c = count(s)
        if c <= target:
            hi, hi_cost = s, c
            break
        if s >= n:
            return None
        saved = (lo_cost - c) / (s - lo)  # per rung, over the last stretch climbed
        lo, lo_cost = s, c
        ahead = int((c - target) / saved * 1.1) + 1 if saved > 0 else s
        s = min(n, s + max(1, min(ahead, s)))
    bisect = False
    while hi - lo > 1:
        if bisect or lo_cost <= hi_cost:
            mid = (lo + hi) // 2
        else:
            # Just past where the line between the bracket's ends meets the target.
            mid = lo + int((lo_cost - target) * (hi - lo) / (lo_cost - hi_cost)) + 1
            mid = min(hi - 1, max(lo + 1, mid))
        c = count(mid)
        fits = c <= target
        # Interpolation that lands on the same side twice is slow: halve next time instead.
        bisect = not bisect and fits == (mid - lo > hi - mid)
        if fits:
            hi, hi_cost = mid, c
        else:
            lo, lo_cost = mid, c
    return hi


def search_from(count: Callable[[int], int], n: int, target: int, start: int) -> int | None:
    """Smallest rung in 0..n whose cost is within target, assuming costs fall as rungs climb,
    probing outward from `start` (where an estimate puts the answer): galloping down while rungs
    fit or up while they do not, then bisecting the bracket. Few probes when the estimate is
    close, each of them near the answer."""
    if count(0) <= target:
        return 0
    start = min(max(start, 1), n)
    step = 1
    if count(start) <= target:
        hi = start
        while True:
            lo = max(0, hi - step)
            if lo == 0 or count(lo) > target:
                break
            hi, step = lo, step * 2
    else:
        lo = start
        while True:
            if lo >= n:
                return None
            hi = min(n, lo + step)
            if count(hi) <= target:
                break
            lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
