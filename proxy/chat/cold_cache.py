"""Cold-cache compaction: compact deeper on the turn whose prompt cache has surely expired.

Every compaction event costs one full write of the new prefix to the provider's prompt cache.
A conversation that comes back after the cache's lifetime pays that write anyway: its whole
prefix is read at the input price (or written at the write price). On such a turn a deeper
target costs nothing extra and makes every later turn cheaper, so a policy with
`cold_budget_tokens` budgets that turn with it (on every API: a cold prefix is re-written
whatever the API). Warm turns keep their budget, and their bytes: once a conversation has been
compacted cold, its later turns replay that checkpoint even under the usual trigger (otherwise
the next warm turn would send the original history, which the provider no longer holds).

The conversation's last request time is kept in memory, per process (a bounded LRU): a
conversation this process has not seen is taken as warm, so a restart or another replica only
forgoes a saving. The lifetime is the policy's `cold_after_seconds`, else the published one of
the model's cache rule (`proxy.telemetry.pricing.rule_for`: the surely-gone bound).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.config import APIS, PolicySettings
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.pricing import rule_for
from proxy.tokens.budget import ModelInfo

MAX_CONVERSATIONS = 50_000
"""Conversations whose last request time is remembered, per worker (the least recently seen
forgotten first; ~250 bytes each)."""


@dataclass(frozen=True)
class ColdTurn:
    """What the cold-cache rule says about one request."""

    cold: bool = False
    """The conversation's cache has expired and the policy budgets cold turns deeper."""
    policy: PolicySettings | None = None
    """The policy to budget this turn with (cold: the deeper budget on every API)."""
    replay: bool = False
    """The conversation was compacted cold: replay its checkpoint even under the trigger."""
    mark: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def compacted(self) -> None:
        """This cold turn went out compacted (or replayed): its warm turns replay it."""
        if self.cold and self.mark is not None:
            self.mark()


WARM = ColdTurn()


@dataclass(slots=True)
class _Seen:
    last: float
    compacted_cold: bool = False


def cold_after(policy: PolicySettings, info: ModelInfo, api: str) -> float:
    """Seconds of silence after which this model's prompt cache is surely gone."""
    if policy.cold_after_seconds > 0:
        return policy.cold_after_seconds
    rule = rule_for(api, input_price=info.input_price, cache_write_price=info.cache_write_price)
    return rule.cold_after


class ColdCache:
    """Each conversation's last request time, and which ones were compacted cold."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = MAX_CONVERSATIONS,
    ) -> None:
        self.clock = clock
        self.metrics = metrics
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()

    def turn(
        self,
        tenant: str | None,
        conversation: str,
        policy: PolicySettings,
        info: ModelInfo,
        api: str,
    ) -> ColdTurn:
        """Record this request of the conversation and say how to budget it."""
        if tenant is None or not conversation or policy.cold_budget_tokens <= 0:
            return WARM
        now = self.clock()
        key = (tenant, conversation)
        seen = self._seen.pop(key, None)
        self._seen[key] = _Seen(now, seen.compacted_cold if seen is not None else False)
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        if seen is None:
            return WARM
        if now - seen.last <= cold_after(policy, info, api):
            return ColdTurn(replay=seen.compacted_cold)
        if self.metrics is not None:
            self.metrics.cold_turn(policy.name)
        capped = api in policy.cap_apis and policy.budget_tokens > 0
        cold = policy.cold_budget_tokens
        deeper = dataclasses.replace(
            policy,
            budget_tokens=min(cold, policy.budget_tokens) if capped else cold,
            budget_fraction=policy.budget_fraction if api in policy.cap_apis else 1.0,
            cap_apis=APIS,
        )
        mark = functools.partial(self.compacted, tenant, conversation)
        return ColdTurn(cold=True, policy=deeper, replay=seen.compacted_cold, mark=mark)

    def compacted(self, tenant: str | None, conversation: str) -> None:
        """This conversation went out compacted on a cold turn: its warm turns replay it."""
        seen = self._seen.get((tenant or "", conversation))
        if seen is not None:
            seen.compacted_cold = True
