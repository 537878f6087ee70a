"""The plan for a request over its trigger: the longest safe stored checkpoint replayed, then,
if that is not enough, the policy's provider chain run on it (or on the originals).

The second phase of the decision (`proxy.chat.compactor`). A plan says which messages to send and
why (`Plan.action`); a new compaction comes with the `Compaction` to store (`proxy.chat.persist`)
before anything is forwarded. A provider that fails is counted and logged here; the plan then
carries the reason to forward the original instead (`Plan.failure`), unless a later provider
reached the target anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.chat.bodycache import BodyCache
from proxy.chat.checkpoint import compaction_for, worth_it
from proxy.chat.lossless import Lossless
from proxy.chat.precompute import PRECOMPUTED, Precomputer
from proxy.chat.replay import ReplayChecks
from proxy.chat.request import Action, ChatRequest
from proxy.chat.sizing import Counted
from proxy.config import PolicySettings, Settings
from proxy.dialects.chat import CHAT
from proxy.dialects.projection import Counting, NativeCounter
from proxy.errors import (
    ChainTimeoutError,
    CompactionError,
    StoreError,
    TenantMismatchError,
    UnreadableValueError,
)
from proxy.providers.base import Completer, CompressionConfig, ContextProvider, Message
from proxy.providers.bound import bound_chain
from proxy.providers.chain import LONG_HISTORY, ChainOutcome, run_chain
from proxy.store.base import Checkpoint, Compaction, Store
from proxy.store.summary_cache import TenantSummaryCache
from proxy.telemetry.metrics import Metrics
from proxy.tokens.counter import TokenCounter

log = logging.getLogger("compactd.compaction")

PROVIDER_THREADS = 4
"""Threads sync providers run on: their own, not the default executor's, which counts and
parses long histories; a sync provider's thread cannot be killed, so providers that hang use up
these and only compactions wait (and fail open at their deadline), not every long request."""
REPLAY_ATTEMPTS = 4
"""Stored checkpoints tried, longest first, before the request is compacted afresh."""

CompleterFactory = Callable[[str | None], Completer]
T = TypeVar("T")


def compression_config(
    policy: PolicySettings, *, counter: Counting, fixed: int, limit: int, budget: int
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


@dataclass(frozen=True)
class History:
    """The request's messages with their digests and rolling prefix digests."""

    messages: list[Message]
    digests: list[str]
    prefixes: list[str]


@dataclass(frozen=True)
class Plan:
    """Which messages to send and why; a new compaction with what to store first."""

    messages: Sequence[Message]
    action: Action
    providers: tuple[str, ...] = ()
    compaction: Compaction | None = None
    failure: str = ""
    """Why the original must be forwarded instead (a provider failed, the target unreached)."""
    history: History | None = None
    generation: int = -1
    """The covered_through of the checkpoint it replays (-1: none)."""
    tokens: int | None = None
    """What `messages` count, the request's fixed tokens included, where already counted."""
    checkpoint: Checkpoint | None = None
    """The stored checkpoint it replays, whose messages begin `messages`."""


class Planner:
    """Plans what to send for requests over their trigger: replay, then the chain."""

    def __init__(
        self,
        *,
        settings: Settings,
        providers: Mapping[str, ContextProvider],
        bodies: BodyCache,
        store: Store,
        metrics: Metrics,
        precompute: Precomputer,
        completer: CompleterFactory | None = None,
    ) -> None:
        self.settings = settings
        self.bodies = bodies
        self.store = store
        self.metrics = metrics
        self.precompute = precompute
        self.completer = completer
        self.replay_checks = ReplayChecks()
        # Threads are started when a sync provider first runs (none at construction).
        self._providers_pool = ThreadPoolExecutor(PROVIDER_THREADS, "compactd-provider")
        self._chains = {
            p.name: bound_chain(p.providers, providers, p.options, self._run_provider)
            for p in settings.all_policies()
        }

    async def plan(
        self,
        request: ChatRequest,
        tenant: str,
        policy: PolicySettings,
        counted: Counted,
        forms: Lossless | None = None,
    ) -> Plan:
        """What to send for `request`, over its trigger under `counted` (or ahead of it, when
        precomputing): a stored checkpoint replayed, then the chain if that is over the trigger."""
        assert request.messages is not None
        if self.bodies.undigested(request.messages) > LONG_HISTORY:
            history = await asyncio.to_thread(self._history, request.messages)
        else:
            history = self._history(request.messages)
        messages, digests = history.messages, history.digests
        base = await self._replayable(request, tenant, history)
        sent = forms.messages if forms is not None else messages
        candidate = sent
        if base is not None:
            candidate = [*base.messages, *sent[base.covered_through + 1 :]]
        cand_tokens = await self._candidate_tokens(request, counted, base, candidate, forms)
        if base is not None and PRECOMPUTED in base.providers:
            # Computed ahead of time: replayed only from the turn the one before no longer fits,
            # so the prefix changes when it would have anyway, not earlier.
            older = await self._replayable(request, tenant, history, base.covered_through)
            previous = sent
            if older is not None:
                previous = [*older.messages, *sent[older.covered_through + 1 :]]
            tokens = counted.fixed + counted.counter.count_messages(previous)
            if tokens <= counted.budget.trigger:
                base, candidate, cand_tokens = older, previous, tokens
        # The turn that first replays a precomputed checkpoint is its compaction event.
        switched = (
            base is not None
            and PRECOMPUTED in base.providers
            and self.precompute.first_use((tenant, request.conversation, base.covered_through))
        )
        replay = Plan(
            candidate,
            "compacted"
            if switched
            else "replayed"
            if base is not None
            else "lossless"
            if forms is not None
            else "passthrough",
            (
                *(p for p in (base.providers if base is not None else ()) if p != PRECOMPUTED),
                *(("lossless",) if forms else ()),
            ),
            generation=base.covered_through if base is not None else -1,
            tokens=cand_tokens,
            checkpoint=base,
        )
        if cand_tokens <= counted.budget.trigger:
            return replay
        # A checkpoint written before checkpoints recorded their structure is replayed but
        # never built upon: the new compaction starts from the originals.
        if base is not None and not base.ends:
            base = None
            cand_tokens = counted.fixed + counted.counter.count_messages(sent)
        chain_input = candidate if base is not None else sent
        # What the dialect sets aside goes upstream as it is; providers see its cost as fixed.
        kept = len(chain_input) - request.dialect.set_aside(chain_input)
        aside = chain_input[kept:]
        config = self._config(request, tenant, counted, policy, aside)
        t0 = time.perf_counter()
        try:
            outcome = await run_chain(
                chain_input[:kept],
                self._chains[policy.name],
                config,
                check=request.dialect.problems if request.dialect is not CHAT else None,
                repair=request.dialect.repair if request.dialect is not CHAT else None,
                deadline=policy.compaction_timeout_ms / 1000,
                run_provider=self._run_provider,
            )
        except ChainTimeoutError as exc:
            # Fails open at the boundary as `timeout`; this line names the provider that hung.
            self._log_provider_failure(request, exc.provider, "timeout", str(exc))
            raise
        self.metrics.observe_compaction(
            policy=policy.name,
            providers="+".join(outcome.providers) or "none",
            seconds=time.perf_counter() - t0,
        )
        failure = self._report_failures(request, outcome)
        if failure:
            return dataclasses.replace(replay, failure=failure)
        result = outcome.result
        if result is None or not worth_it(outcome, cand_tokens, counted.budget, policy):
            return replay
        if aside:
            result = dataclasses.replace(result, messages=[*result.messages, *aside])
        try:
            compaction = await per_message(
                messages,
                compaction_for,
                messages=messages,
                digests=digests,
                prefixes=history.prefixes,
                base=base,
                result=result,
                outcome=outcome,
                tenant=tenant,
                conversation=request.conversation,
                lossless=forms,
            )
        except CompactionError as exc:
            label = "+".join(outcome.providers)
            self.metrics.invariant_violation(label)
            log.warning(
                "compaction result discarded",
                extra={"provider": label, "problem": str(exc), "tenant": request.key_id},
            )
            return dataclasses.replace(replay, failure=f"providers {label}: {exc}"[:200])
        providers = (*(("lossless",) if forms else ()), *outcome.providers)
        return Plan(result.messages, "compacted", providers, compaction, history=history)

    def _history(self, messages: Sequence[Message]) -> History:
        """The messages with their digests and prefix digests (of new messages only, for a
        body the cache knows)."""
        digests = self.bodies.digests(messages)
        return History(list(messages), digests, self.bodies.prefixes(messages, digests))

    async def _replayable(
        self, request: ChatRequest, tenant: str, history: History, below: int | None = None
    ) -> Checkpoint | None:
        """The longest stored checkpoint this request may replay (see `replay_problem`);
        `below`: covering fewer messages than that."""
        limit = len(history.messages) - 1  # a strict prefix at most; replay_problem says the rest
        if below is not None:
            limit = min(limit, below)
        for _ in range(REPLAY_ATTEMPTS):
            if limit <= 0:
                return None
            cp = await self._find(tenant, request.conversation, history.prefixes[:limit])
            if cp is None:
                return None
            if (cp.tenant, cp.conversation) != (tenant, request.conversation) or (
                cp.covered_through >= limit
            ):
                problem = "the store returned a checkpoint it was not asked for"
            else:
                problem = self.replay_checks.problem(
                    cp, history.messages, history.digests, history.prefixes
                )
            if not problem:
                return cp
            log.debug("checkpoint not replayed", extra={"problem": problem})
            if "final unit" not in problem:
                self.metrics.checkpoint_discarded("invalid")
            limit = min(limit, cp.covered_through)
        return None

    async def _find(self, tenant: str, conversation: str, prefixes: list[str]) -> Checkpoint | None:
        """One store lookup; an unreadable or foreign checkpoint counts as none."""
        t0 = time.perf_counter()
        try:
            return await self.store.find_checkpoint(tenant, conversation, prefixes)
        except (UnreadableValueError, TenantMismatchError) as exc:
            reason = unreadable(exc)
            self.metrics.checkpoint_discarded(reason)
            log.warning("stored checkpoint ignored", extra={"reason": reason})
            return None
        except StoreError:
            if self.settings.store.on_store_error != "compact-unstored":
                raise
            return None  # availability over reversibility: compact from scratch
        finally:
            self.metrics.observe_store("find_checkpoint", time.perf_counter() - t0)

    async def _candidate_tokens(
        self,
        request: ChatRequest,
        counted: Counted,
        base: Checkpoint | None,
        candidate: Sequence[Message],
        forms: Lossless | None,
    ) -> int:
        """What `candidate` counts: a replayed checkpoint's messages, plus what the request's
        messages after it cost as the body cache counted them (only new messages were), where
        it did; the whole candidate otherwise (the same figure)."""
        counter = counted.counter
        known = request.messages is not None and forms is None
        if known and base is not None and isinstance(counter, TokenCounter | NativeCounter):
            assert request.messages is not None
            after = self.bodies.tokens_from(
                request.messages, counter.encoding_name, base.covered_through + 1
            )
            if after is not None:
                return counted.fixed + counter.count_messages(base.messages) + after
        return counted.fixed + await per_message(candidate, counter.count_messages, candidate)

    def _report_failures(self, request: ChatRequest, outcome: ChainOutcome) -> str:
        """Count and log every provider that failed; the reason to fail open, unless a later
        provider reached the target anyway ("" then)."""
        for failure in outcome.failures:
            if failure.kind == "raised":
                self.metrics.provider_error(failure.provider)
            else:
                self.metrics.invariant_violation(failure.provider)
            self._log_provider_failure(request, failure.provider, failure.kind, failure.detail)
        if not outcome.failures or outcome.reached_target:
            return ""
        return outcome.failures[0].describe()

    def _log_provider_failure(
        self, request: ChatRequest, provider: str, kind: str, detail: str
    ) -> None:
        log.warning(
            "provider failed",
            extra={
                "provider": provider,
                "failure": kind,
                "detail": detail[:200],
                "tenant": request.key_id,
                "model": request.model,
            },
        )

    def _config(
        self,
        request: ChatRequest,
        tenant: str,
        counted: Counted,
        policy: PolicySettings,
        aside: Sequence[Message] = (),
    ) -> CompressionConfig:
        ttl = (policy.retention_days or self.settings.store.retention_days) * 86400
        config = compression_config(
            policy,
            counter=counted.counter,
            fixed=counted.fixed + sum(counted.counter.count_message(m) for m in aside),
            limit=counted.budget.target,
            budget=counted.budget.budget,
        )
        return dataclasses.replace(
            config,
            model=request.model,
            complete=self.completer(request.identity.api_key) if self.completer else None,
            summary_cache=TenantSummaryCache(self.store, tenant, ttl),
        )

    async def _run_provider(self, fn: Callable[..., T], *args: Any) -> T:
        """`asyncio.to_thread(fn, *args)` on the providers' own threads (`PROVIDER_THREADS`)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._providers_pool, call)

    def close(self) -> None:
        """Let the providers' threads go (one still running a sync provider finishes first)."""
        self._providers_pool.shutdown(wait=False, cancel_futures=True)


async def per_message(
    history: Sequence[Message], fn: Callable[..., T], /, *args: Any, **kw: Any
) -> T:
    """`fn(*args, **kw)`, work that costs per message of `history`: in a thread if it is long."""
    if len(history) > LONG_HISTORY:
        return await asyncio.to_thread(fn, *args, **kw)
    return fn(*args, **kw)


def unreadable(exc: StoreError) -> str:
    """The reason a stored checkpoint that could not be used is counted under."""
    return "other_tenant" if isinstance(exc, TenantMismatchError) else "unreadable"
