"""The one place a chat request is rewritten: replay, trigger, provider chain, store, fail-open.

Everything here runs before the request goes upstream. A request under its trigger is forwarded
as the original bytes after one (cached) count. Above the trigger, the longest stored checkpoint
of the conversation is replayed first, so every later turn sends the same bytes for the same
prefix (prompt caches stay warm), and a new compaction happens only when even the replayed form
is over budget. Any failure in here forwards the original request (`x-compactd-action: error`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.budget import Budget, ModelTable, compute_budget, parse_context_window
from proxy.chatstate import ChatState, Decision
from proxy.checkpoint import compaction_for, worth_it
from proxy.config import PolicySettings, Settings
from proxy.digest import canonical_message, conversation_id, message_digest, prefix_digests
from proxy.metrics import Metrics
from proxy.policy import PolicyResolver
from proxy.providers.base import (
    Completer,
    CompressionConfig,
    ContextProvider,
    Message,
)
from proxy.providers.bound import bound_chain
from proxy.providers.chain import run_chain
from proxy.store.base import Compaction, Store, StoreError, valid_id
from proxy.store.summary_cache import TenantSummaryCache
from proxy.tenant import Tenancy
from proxy.tokens import TokenCounter, Tokenizers

log = logging.getLogger("compactd.compaction")

CONVERSATION_HEADER = "x-compactd-conversation-id"
# Counting a large body cold takes tens of milliseconds; tiktoken releases the GIL, so a thread
# keeps the event loop responsive for everyone else.
COUNT_IN_THREAD_BYTES = 128 * 1024
_SAFE_CONV = re.compile(r"[A-Za-z0-9._:-]{1,96}")

CompleterFactory = Callable[[str | None], Completer]


@dataclass(frozen=True)
class _Plan:
    messages: list[Message]
    action: str
    tokens: int
    providers: tuple[str, ...] = ()
    compaction: Compaction | None = None


def compression_config(
    policy: PolicySettings, *, counter: TokenCounter, fixed: int, limit: int, budget: int
) -> CompressionConfig:
    """What a policy tells its providers (the proxy and `compactd compress` share this).

    `fixed` is what the request costs besides its messages (tool schemas, response format).
    """
    return CompressionConfig(
        limit=limit,
        budget=budget,
        count_tokens=lambda msgs: fixed + counter.count_messages(msgs),
        count_message=counter.count_message,
        max_tool_result_tokens=policy.max_tool_result_tokens,
        reasoning_strip_age_threshold=policy.reasoning_strip_age_threshold,
        keep_head=policy.keep_head,
        recency_turns=policy.recency_turns,
    )


def _headers(scope: Mapping[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def serialize(parsed: dict[str, Any], canonical: list[Message]) -> bytes:
    """The request with only `messages` replaced by (already canonical) messages.

    Other keys keep their order; output is compact and UTF-8 (orjson), so the bytes sent for the
    same history are the same on every turn.
    """
    body = dict(parsed)
    body["messages"] = canonical
    return orjson.dumps(body)


class Compactor:
    """Implements the app's chat hook: decides, for each chat request, what to forward."""

    def __init__(
        self,
        *,
        settings: Settings,
        tokenizers: Tokenizers,
        models: ModelTable,
        policies: PolicyResolver,
        providers: Mapping[str, ContextProvider],
        store: Store,
        metrics: Metrics,
        tenancy: Tenancy,
        completer: CompleterFactory | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizers = tokenizers
        self.models = models
        self.policies = policies
        self.store = store
        self.metrics = metrics
        self.tenancy = tenancy
        self.completer = completer
        self._chains = {
            p.name: bound_chain(p.providers, providers, p.options) for p in settings.all_policies()
        }

    async def prepare(self, scope: Mapping[str, Any], body: bytes) -> Decision:
        """What to forward for this chat request. Never raises: failures forward the original."""
        state = ChatState(started=time.perf_counter())
        headers = _headers(scope)
        identity = self.tenancy.identify(headers)
        state.api_key, state.fingerprint = identity.api_key, identity.fingerprint
        state.tenant = identity.tenant
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return Decision(body, state)  # not ours to judge: the upstream answers it
        if not isinstance(parsed, dict) or not isinstance(parsed.get("messages"), list):
            return Decision(body, state)
        state.parsed = parsed
        model = parsed.get("model")
        state.model = model if isinstance(model, str) else ""
        decision = self.policies.resolve(
            key_fingerprint=state.fingerprint, model=state.model, headers=headers
        )
        state.policy = decision.name
        if decision.requested_policy_refused:
            self.metrics.refused("x-compactd-policy")
        if decision.bypass_refused:
            self.metrics.refused("x-compactd-bypass")
        if decision.bypass:
            state.action = "bypass"
            return self._finish(body, state)
        try:
            messages = parsed["messages"]
            if all(isinstance(m, dict) for m in messages):
                state.conversation = _conversation(headers.get(CONVERSATION_HEADER), messages)
            return await self._decide(body, parsed, decision.policy, state)
        except Exception as exc:  # the single fail-open boundary: forward the original request
            reason = _reason(exc)
            log.warning(
                "compaction failed open",
                extra={"reason": reason, "tenant": state.fingerprint, "model": state.model},
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            self.metrics.fail_open(reason)
            state.action, state.error = "error", reason
            state.tokens_after = state.tokens_before
            return self._finish(body, state)

    async def after_overflow(self, state: ChatState, message: str) -> Decision | None:
        """The upstream said the context was too long: learn the window and compact once more.

        Returns None when a retry would not send anything smaller.
        """
        if state.parsed is None or state.retried or not state.model:
            return None
        sent = state.tokens_after or state.tokens_before or 0
        window = parse_context_window(message) or int(sent * 0.7)
        if window <= 0:
            return None
        self.models.learn_window(state.model, window)
        log.info("learned context window", extra={"model": state.model, "window": window})
        retry = await self.prepare_parsed(state)
        if retry is None or retry.state.tokens_after is None or retry.state.tokens_after >= sent:
            return None
        retry.state.retried = True
        return retry

    async def prepare_parsed(self, previous: ChatState) -> Decision | None:
        """Re-run the decision for a request we already parsed (used by the overflow retry)."""
        assert previous.parsed is not None
        parsed = previous.parsed
        state = dataclasses.replace(previous, started=time.perf_counter(), error=None)
        # The request keeps the policy and conversation it was given (header matches, the
        # client's policy choice and conversation id included); only the window changed.
        policy = self.policies.get(state.policy)
        if policy is None:
            return None
        try:
            return await self._decide(b"", parsed, policy, state, force=True)
        except Exception:
            log.warning("overflow retry could not compact", exc_info=True)
            return None

    async def _decide(
        self,
        body: bytes,
        parsed: dict[str, Any],
        policy: PolicySettings,
        state: ChatState,
        *,
        force: bool = False,
    ) -> Decision:
        info = self.models.lookup(state.model)
        budget = compute_budget(info, parsed, policy, self.settings.tokens.safety_margin)
        counter = self.tokenizers.for_model(info)
        messages: list[Message] = parsed["messages"]
        if not all(isinstance(m, dict) for m in messages):
            return self._finish(body, state)  # malformed: the upstream gives its own answer
        fixed = counter.count_tools(parsed) + counter.count_response_format(parsed)
        if len(body) > COUNT_IN_THREAD_BYTES:
            counted = await asyncio.to_thread(counter.count_messages, messages)
        else:
            counted = counter.count_messages(messages)
        state.tokens_before = state.tokens_after = fixed + counted
        if policy.mode == "off" or (state.tokens_before <= budget.trigger and not force):
            return self._finish(body, state)
        if state.tenant is None:
            # No credential, no tenant to keep originals under: never compacted, never stored.
            state.no_credential = True
            return self._finish(body, state)
        plan = await self._plan(
            messages=messages,
            counter=counter,
            fixed=fixed,
            budget=budget,
            policy=policy,
            state=state,
        )
        if plan.compaction is not None:
            plan = await self._store(plan, policy, state)
        state.provider = "+".join(plan.providers)
        if plan.action == "passthrough":
            state.action = "shadow" if policy.mode == "shadow" else "passthrough"
            state.shadow_action = "passthrough" if policy.mode == "shadow" else ""
            return self._finish(body, state)
        # Count what is actually sent: the canonical form, not the provider's dicts.
        canonical = [canonical_message(m) for m in plan.messages]
        state.tokens_after = fixed + counter.count_messages(canonical)
        if policy.mode == "shadow":
            state.action, state.shadow_action = "shadow", plan.action
            return self._finish(body, state)
        state.action = plan.action
        return self._finish(serialize(parsed, canonical), state)

    async def _plan(
        self,
        *,
        messages: list[Message],
        counter: TokenCounter,
        fixed: int,
        budget: Budget,
        policy: PolicySettings,
        state: ChatState,
    ) -> _Plan:
        tenant = state.tenant
        assert tenant is not None  # _decide never plans without one
        digests = [message_digest(m) for m in messages]
        prefixes = prefix_digests(digests)
        t0 = time.perf_counter()
        try:
            checkpoint = await self.store.find_checkpoint(tenant, state.conversation, prefixes)
        except StoreError:
            if self.settings.store.on_store_error != "compact-unstored":
                raise
            checkpoint = None  # availability over reversibility: compact from scratch
        finally:
            self.metrics.observe_store("find_checkpoint", time.perf_counter() - t0)
        candidate = messages
        if checkpoint is not None:
            candidate = [*checkpoint.messages, *messages[checkpoint.covered_through + 1 :]]
        cand_tokens = fixed + counter.count_messages(candidate)
        action = "replayed" if checkpoint is not None else "passthrough"
        providers = tuple(checkpoint.providers) if checkpoint is not None else ()
        if cand_tokens <= budget.trigger:
            return _Plan(candidate, action, cand_tokens, providers)
        config = self._config(
            counter=counter, fixed=fixed, budget=budget, policy=policy, state=state
        )
        t0 = time.perf_counter()
        outcome = await run_chain(candidate, self._chains[policy.name], config)
        self.metrics.observe_compaction(
            policy=policy.name,
            providers="+".join(outcome.providers) or "none",
            seconds=time.perf_counter() - t0,
        )
        for violation in outcome.violations:
            self.metrics.invariant_violation(violation.split(":", 1)[0])
        result = outcome.result
        if result is None or not worth_it(outcome, cand_tokens, budget, policy):
            return _Plan(candidate, action, cand_tokens, providers)
        compaction = compaction_for(
            messages=messages,
            digests=digests,
            prefixes=prefixes,
            checkpoint=checkpoint,
            result=result,
            outcome=outcome,
            tenant=tenant,
            conversation=state.conversation,
        )
        return _Plan(
            result.messages, "compacted", outcome.tokens_after, outcome.providers, compaction
        )

    def _config(
        self,
        *,
        counter: TokenCounter,
        fixed: int,
        budget: Budget,
        policy: PolicySettings,
        state: ChatState,
    ) -> CompressionConfig:
        assert state.tenant is not None  # _decide never plans without one
        ttl = (policy.retention_days or self.settings.store.retention_days) * 86400
        config = compression_config(
            policy, counter=counter, fixed=fixed, limit=budget.target, budget=budget.budget
        )
        return dataclasses.replace(
            config,
            model=state.model,
            complete=self.completer(state.api_key) if self.completer else None,
            summary_cache=TenantSummaryCache(self.store, state.tenant, ttl),
        )

    async def _store(self, plan: _Plan, policy: PolicySettings, state: ChatState) -> _Plan:
        """Originals first: a compacted request is forwarded only once they are durable."""
        assert plan.compaction is not None
        ttl = (policy.retention_days or self.settings.store.retention_days) * 86400
        t0 = time.perf_counter()
        try:
            winner = await self.store.save_compaction(plan.compaction, ttl)
        except StoreError:
            if self.settings.store.on_store_error != "compact-unstored":
                raise
            self.metrics.fail_open("store_unstored")
            log.warning("originals not stored; forwarding compacted (compact-unstored)")
            state.unstored = True
            return plan
        finally:
            self.metrics.observe_store("save_compaction", time.perf_counter() - t0)
        mine = plan.compaction.checkpoint
        if winner.messages == mine.messages:
            return plan
        # Another request of this conversation compacted the same prefix first: use its bytes
        # (the caller counts what is finally sent).
        messages = [*winner.messages, *plan.messages[len(mine.messages) :]]
        return dataclasses.replace(plan, messages=messages, providers=tuple(winner.providers))

    def _finish(self, content: bytes, state: ChatState) -> Decision:
        return Decision(content, state)


def _conversation(header: str | None, messages: list[Message]) -> str:
    if header:
        header = header.strip()
        if _SAFE_CONV.fullmatch(header) and valid_id(header):
            return header
        return "h-" + message_digest({"conversation": header})[:24]
    return conversation_id(messages)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, StoreError):
        return "store"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return type(exc).__name__
