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
the model's cache rule (`proxy.telemetry.pricing.rule_for`: the surely-gone bound), raised by
what the upstream's own usage shows.

Learning the lifetime, upward only: a turn that comes after a gap longer than the bound and
whose answer reports a cache hit covering most of its prompt (`cached_tokens` at least half of
`prompt_tokens`) shows the cache lived at least that long, so the bound of that (API, model) is
raised to the gap (at most `MAX_LIFETIME`), and later turns after such gaps stay warm instead of
paying a needless rewrite of a deeper prefix. The majority rule keeps a prefix that other
conversations keep warm (a system prompt every user shares) from passing for this one's cache.
A miss never lowers the bound: a miss has many causes besides expiry (a changed prefix, a
compacted turn, routing to another cache machine), so it says nothing about the lifetime.
Learned per process, one float per (API, model), at most `MAX_MODELS` of them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.config import APIS, PolicySettings
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.pricing import rule_for
from proxy.tokens.budget import ModelInfo

log = logging.getLogger("compactd.compaction")

MAX_CONVERSATIONS = 50_000
"""Conversations whose last request time is remembered, per worker (the least recently seen
forgotten first; ~250 bytes each)."""
MAX_MODELS = 1000
"""(API, model) pairs whose learned cache lifetime is remembered, per worker (the least recently
learned forgotten first)."""
MAX_LIFETIME = 24 * 3600.0
"""The longest cache lifetime learned from hits (no provider publishes a longer one)."""
HIT_SHARE = 0.5
"""A hit teaches the lifetime only if it covers at least this share of the prompt."""


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
    gap: float | None = None
    """A cold turn's seconds since the conversation's previous request."""
    learn: Callable[[float], None] | None = field(default=None, compare=False, repr=False)

    def compacted(self) -> None:
        """This cold turn went out compacted (or replayed): its warm turns replay it."""
        if self.cold and self.mark is not None:
            self.mark()

    def answered(self, prompt_tokens: int, cached_tokens: int) -> None:
        """The upstream's usage for this turn: a hit after its gap may raise the lifetime."""
        if self.gap is None or self.learn is None or cached_tokens <= 0:
            return
        if cached_tokens >= HIT_SHARE * prompt_tokens:
            self.learn(self.gap)


WARM = ColdTurn()


@dataclass(slots=True)
class _Seen:
    last: float
    compacted_cold: bool = False


def cold_after(policy: PolicySettings, info: ModelInfo, api: str, learned: float = 0.0) -> float:
    """Seconds of silence after which this model's prompt cache is surely gone: the policy's,
    else the published bound or the `learned` one, whichever is longer."""
    if policy.cold_after_seconds > 0:
        return policy.cold_after_seconds
    rule = rule_for(api, input_price=info.input_price, cache_write_price=info.cache_write_price)
    return max(rule.cold_after, learned)


class ColdCache:
    """Each conversation's last request time, which ones were compacted cold, and each model's
    cache lifetime as learned from the upstream's hits."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = MAX_CONVERSATIONS,
        models: int = MAX_MODELS,
    ) -> None:
        self.clock = clock
        self.metrics = metrics
        self.capacity = capacity
        self.models = models
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._learned: OrderedDict[tuple[str, str], float] = OrderedDict()

    def turn(
        self,
        tenant: str | None,
        conversation: str,
        policy: PolicySettings,
        info: ModelInfo,
        api: str,
        *,
        model: str = "",
    ) -> ColdTurn:
        """Record this request of the conversation and say how to budget it (`model`: the
        name the request asks for, whose lifetime is learned; the table entry's by default)."""
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
        gap, learned = now - seen.last, (api, model or info.pattern)
        if gap <= cold_after(policy, info, api, self._learned.get(learned, 0.0)):
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
        learn = functools.partial(self.learn, *learned)  # only a gap past the bound is news
        return ColdTurn(
            cold=True, policy=deeper, replay=seen.compacted_cold, mark=mark, gap=gap, learn=learn
        )

    def learn(self, api: str, model: str, lifetime: float) -> None:
        """The model's cache served a hit `lifetime` seconds after the conversation's previous
        request: it lives at least that long (raised only, at most `MAX_LIFETIME`)."""
        key = (api, model)
        known = self._learned.pop(key, 0.0)
        self._learned[key] = max(known, min(lifetime, MAX_LIFETIME))
        if self._learned[key] > known:
            extra = {"api": api, "model": model, "lifetime_s": round(self._learned[key])}
            log.info("learned prompt cache lifetime", extra=extra)
        if len(self._learned) > self.models:
            self._learned.popitem(last=False)

    def lifetime(self, api: str, model: str) -> float:
        """The lifetime learned for the model (0: none learned)."""
        return self._learned.get((api, model), 0.0)

    def compacted(self, tenant: str | None, conversation: str) -> None:
        """This conversation went out compacted on a cold turn: its warm turns replay it."""
        seen = self._seen.get((tenant or "", conversation))
        if seen is not None:
            seen.compacted_cold = True
