"""A chat request's size against its model: the model's entry and window, the budget, the count.

The first phase of the decision (`proxy.chat.compactor`): the request's model is looked up (with
the window its headers opt into, and a window learned from the upstream's refusals), its policy's
budget computed, its messages counted (new messages only, for a history the body cache knows),
and near the trigger the upstream's own count asked for. After a context overflow, `learn_window`
is the one place a window is learned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass

from proxy.chat.bodycache import BodyCache
from proxy.chat.cold_cache import WARM, ColdCache, ColdTurn
from proxy.chat.request import ChatRequest
from proxy.config import PolicySettings, TokenSettings
from proxy.dialects.anthropic_count import Confirm, near
from proxy.dialects.chat import CHAT, Dialect
from proxy.dialects.projection import Counting, NativeCounter
from proxy.errors import TooManyMessagesError
from proxy.telemetry.metrics import Metrics
from proxy.tokens.budget import (
    Budget,
    ModelInfo,
    ModelTable,
    compute_budget,
    requested_output,
    requested_window,
)
from proxy.tokens.calibration import HIGH, LOW, Calibration, scaled
from proxy.tokens.counter import TokenCounter, Tokenizers
from proxy.tokens.windows import LearnedWindows, counted_prompt, retry_window, validated_window

log = logging.getLogger("compactd.compaction")

# Counting a large body cold takes tens of milliseconds; tiktoken releases the GIL, so a thread
# keeps the event loop responsive for everyone else.
COUNT_IN_THREAD_BYTES = 128 * 1024


@dataclass(frozen=True)
class Counted:
    """The request's figures under its policy (and the learned window, on a retry)."""

    budget: Budget
    counter: Counting
    fixed: int
    """What the request costs besides its messages (tool schemas, response format)."""
    tokens: int
    raw: Budget
    """The budget in the upstream's units (before calibration)."""
    cold: ColdTurn = WARM
    """Whether the conversation's prompt cache had expired (`proxy.chat.cold_cache`)."""


class Sizing:
    """Counts requests against their models' windows, and learns the windows the upstream
    reports."""

    def __init__(
        self,
        *,
        tokens: TokenSettings,
        tokenizers: Tokenizers,
        models: ModelTable,
        bodies: BodyCache,
        metrics: Metrics,
        windows: LearnedWindows | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.settings = tokens
        self.tokenizers = tokenizers
        self.models = models
        self.bodies = bodies
        self.metrics = metrics
        self.windows = windows
        self.calibration = calibration
        self._counters: dict[tuple[str, TokenCounter], Counting] = {}
        self.cold = ColdCache(metrics)

    async def count(
        self, request: ChatRequest, policy: PolicySettings, window: int | None
    ) -> Counted:
        """The request's budget and count; `window`: the one the upstream reported (a retry)."""
        if request.oversized:
            raise TooManyMessagesError  # every step from here on costs per message
        assert request.body is not None
        assert request.messages is not None
        info = self.model(request)
        if window is not None:
            info = info.with_window(window)
        elif self.windows is not None:
            info = self.windows.apply(request.model, info)
        margin = self.settings.safety_margin
        api, tenant = request.dialect.name, request.tenant
        cold = (
            self.cold.turn(tenant, request.conversation, policy, info, api, model=request.model)
            if not window
            else WARM
        )
        budget = compute_budget(info, request.body, cold.policy or policy, margin, api)
        base = self.tokenizers.for_model(info)
        counter = self._counter(request.dialect, base)
        body, dialect = request.body, request.dialect
        # The tools' count, once per session: the fields around the messages rarely change.
        key = ("fixed", dialect.name, base)
        fixed = self.bodies.memo(request.messages, key, lambda: dialect.fixed_tokens(base, body))
        in_thread = len(request.raw) > COUNT_IN_THREAD_BYTES
        raw = budget
        if self.calibration is not None:
            # An API whose tokenizer is not public: the budget in our estimate's units.
            budget = self.calibration.budget(request.dialect.name, request.model, budget)
        known = base if dialect is CHAT else counter
        if isinstance(known, TokenCounter | NativeCounter):  # a known history: its new messages
            counted = await self.bodies.count(request.messages, known, in_thread=in_thread)
        elif in_thread:
            counted = await asyncio.to_thread(counter.count_messages, request.messages)
        else:
            counted = counter.count_messages(request.messages)
        return Counted(budget, counter, fixed, fixed + counted, raw, cold)

    async def confirmed(self, request: ChatRequest, counted: Counted, confirm: Confirm) -> Counted:
        """The figures with the upstream's own count, if the estimate is near the trigger and
        the upstream answers; as they were otherwise."""
        band = self.settings.count_tokens_band
        if counted.tokens <= 0 or not near(counted.tokens, counted.budget.trigger, band):
            return counted
        actual = await confirm()
        self.metrics.count_confirmed("failed" if actual is None else "confirmed")
        if actual is None:
            return counted
        if self.calibration is not None:
            api, model = request.dialect.name, request.model
            self.calibration.observe(api, model, counted.tokens, actual, request.body)
        ratio = min(HIGH, max(LOW, actual / counted.tokens))
        return dataclasses.replace(counted, budget=scaled(counted.raw, ratio))

    def input_window(self, request: ChatRequest) -> int:
        """The most input tokens the request's model takes, as far as compactd knows (a window
        learned from the upstream's refusals included)."""
        info = self.model(request)
        if self.windows is not None:
            info = self.windows.apply(request.model, info)
        if info.max_input:
            return min(info.context_window, info.max_input)
        return info.context_window

    def overflowed(self, request: ChatRequest, upstream_message: str, sent: int) -> int | None:
        """The upstream refused `sent` tokens as too long, saying `upstream_message`: its count
        calibrates ours, and the window to retry under is learned (None: none to retry under)."""
        counted = counted_prompt(upstream_message)
        if self.calibration is not None and counted is not None:
            # The upstream's own count of what we sent: the best calibration sample there is.
            self.calibration.observe(
                request.dialect.name, request.model, sent, counted, request.body
            )
        return self.learn_window(request, upstream_message, sent)

    def learn_window(self, request: ChatRequest, upstream_message: str, sent: int) -> int | None:
        """The window to retry this request under. When the upstream's answer is trustworthy
        (`proxy.tokens.windows.validated_window`) it is also learned for every later request of the
        model on this upstream; otherwise it serves this retry only. The one place this is
        learned."""
        if sent <= 0:
            return None
        info = self.model(request)
        minimum = self.settings.min_learned_window
        learned = validated_window(
            upstream_message,
            sent=sent,
            requested_output=requested_output(request.body or {}) or 0,
            info=info,
            minimum=minimum,
        )
        retry = retry_window(upstream_message, sent=sent, info=info, minimum=minimum)
        if learned is None:
            return retry
        if self.windows is not None:
            self.windows.learn(request.model, learned)
        log.info("learned context window", extra={"model": request.model, "window": learned})
        return min(learned, retry)  # the retry in our units, the window learned as stated

    def model(self, request: ChatRequest) -> ModelInfo:
        """The model's table entry, with the window the request opts into (on the Messages
        API, Anthropic's 1M-context beta)."""
        info = self.models.lookup(request.model)
        if request.dialect.name != "messages":
            return info
        return requested_window(info, request.headers.get("anthropic-beta", ""))

    def native_counts(self) -> int:
        """Entries the per-API native counters' caches hold (for the metrics)."""
        natives = [c for c in self._counters.values() if isinstance(c, NativeCounter)]
        return sum(c.entries() for c in natives)

    def _counter(self, dialect: Dialect, base: TokenCounter) -> Counting:
        """One counter per API and base counter (encoding and image rule) for the process (each
        keeps its own cache)."""
        key = (dialect.name, base)
        found = self._counters.get(key)
        if found is None:
            found = self._counters[key] = dialect.counter(base)
        return found
