"""Per-tenant request rates: a token bucket per tenant, in each worker's memory.

One client with one key (or none) could send compactd's own API and the chat APIs as many
requests as it liked. Each tenant gets `per_minute` requests a minute, in bursts of up to that
many; past it the request is refused with a 429 (OpenAI-shaped, Anthropic's on its API) that
says when to retry. Buckets are per worker (N workers allow N times the rate: the limit is a
guard against one client, not billing) and at most `max_tenants` are kept, least recently used
dropped first, so made-up keys cannot grow memory without bound.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.errors import RateLimitedError

MAX_TENANTS = 10_000
"""Buckets kept per limiter: a dropped one starts full again, which only ever allows more."""


class RateLimiter:
    """Token buckets of `per_minute` requests per tenant."""

    def __init__(
        self,
        per_minute: int,
        max_tenants: int = MAX_TENANTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._max_tenants = max_tenants
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def wait(self, tenant: str) -> float:
        """Take one request from the tenant's bucket: 0.0, or the seconds until one is free
        (nothing is taken then)."""
        now = self._clock()
        tokens, last = self._buckets.pop(tenant, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - last) * self._rate)
        if tokens >= 1.0:
            self._buckets[tenant] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[tenant] = (tokens, now)
            wait = (1.0 - tokens) / self._rate
        while len(self._buckets) > self._max_tenants:
            self._buckets.popitem(last=False)
        return wait

    def check(self, tenant: str, where: str) -> None:
        """Raise RateLimitedError (a 429 with retry-after) if the tenant is over its rate."""
        wait = self.wait(tenant)
        if wait > 0:
            raise RateLimitedError(
                f"Rate limit of {self.per_minute} requests per minute reached ({where});"
                f" retry in {math.ceil(wait)} s.",
                retry_after=math.ceil(wait),
            )


def limiter(per_minute: int) -> RateLimiter | None:
    """A limiter of `per_minute`, or None for 0 (no limit)."""
    return RateLimiter(per_minute) if per_minute > 0 else None
