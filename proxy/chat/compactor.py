"""The chat decision: one `ChatRequest` in, one `Outcome` out (replay, trigger, chain, store).

Everything here runs before the request goes upstream. A request under its trigger is forwarded
as the original bytes after one (cached) count. Above the trigger, the longest stored checkpoint
of the conversation that is safe for this request (see `proxy.chat.checkpoint.replay_problem`) is
replayed first, so every later turn sends the same bytes for the same prefix (prompt caches stay
warm), and a new compaction happens only when even the replayed form is over budget. Any failure
in here, a provider's included, forwards the original bytes (`x-compactd-action: error`), counts
it and logs it; a later provider that reaches the target makes good an earlier one's failure.

After an upstream context-length error, `after_overflow` learns the window and decides again from
the same request with that window (never in shadow mode or on bypass).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.chat.bodycache import BodyCache
from proxy.chat.expand import ExpandPlan, with_tool
from proxy.chat.lossless import Lossless, LosslessTier
from proxy.chat.persist import Persister
from proxy.chat.planner import CompleterFactory, Planner, per_message
from proxy.chat.policy import PolicyResolver
from proxy.chat.precompute import PRECOMPUTED, Precomputer
from proxy.chat.quota import Quota, QuotaExceededError
from proxy.chat.request import (
    MAX_MESSAGES,
    REWRITTEN,
    Action,
    ChatRequest,
    Outcome,
    TooManyMessagesError,
    cannot_compact,
    read_request,
    with_conversation,
)
from proxy.chat.sizing import Counted, Sizing
from proxy.chat.splice import Splicer
from proxy.config import PolicySettings, Settings
from proxy.dialects.adapter import Adapter
from proxy.dialects.anthropic_count import Confirm
from proxy.dialects.chat import CHAT, Dialect
from proxy.providers.base import ContextProvider, Message
from proxy.providers.chain import LONG_HISTORY
from proxy.runtime.digest import root_length
from proxy.runtime.exactjson import WideIntegerError, holds_wide_int
from proxy.store.base import (
    Store,
    StoreError,
)
from proxy.telemetry.metrics import Metrics
from proxy.tokens.budget import (
    ModelTable,
)
from proxy.tokens.calibration import Calibration
from proxy.tokens.counter import Tokenizers
from proxy.tokens.windows import LearnedWindows
from proxy.wire import rewrite
from proxy.wire.tenant import Tenancy

log = logging.getLogger("compactd.compaction")


class Compactor:
    """Decides, for each chat request, exactly what to forward."""

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
        windows: LearnedWindows | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizers = tokenizers
        self.models = models
        self.policies = policies
        self.store = store
        self.metrics = metrics
        self.tenancy = tenancy
        self.completer = completer
        self.windows = windows
        self.request_stream_usage = settings.accounting.request_stream_usage
        self.bodies = BodyCache(settings.tokens.body_cache_mb << 20)
        self.splicer = Splicer(self.bodies, settings.tokens.prefix_cache_mb << 20, metrics)
        self.calibration = calibration
        self.sizing = Sizing(
            tokens=settings.tokens,
            tokenizers=tokenizers,
            models=models,
            bodies=self.bodies,
            metrics=metrics,
            windows=windows,
            calibration=calibration,
        )
        self.lossless = LosslessTier()
        self.precompute = Precomputer(metrics.precomputed)
        quota_mb = settings.limits.tenant_quota_mb
        self.quota = Quota(store, quota_mb << 20) if quota_mb else None
        self.persist = Persister(
            settings=settings.store,
            store=store,
            metrics=metrics,
            bodies=self.bodies,
            quota=self.quota,
        )
        self.planner = Planner(
            settings=settings,
            providers=providers,
            bodies=self.bodies,
            store=store,
            metrics=metrics,
            precompute=self.precompute,
            completer=completer,
        )

    async def read(
        self, raw: bytes, headers: Sequence[tuple[bytes, bytes]], dialect: Dialect = CHAT
    ) -> ChatRequest:
        """The request value for these bytes and the client's headers (tenant from their key)."""
        # Parsed here (the body cache is the event loop's), the rest in a thread if long.
        started = time.perf_counter()
        anonymous = self.settings.limits.unparsed_anonymous_bytes
        unparsed = cannot_compact(raw, headers, self.tenancy, started, anonymous)
        if unparsed is not None:
            return dataclasses.replace(unparsed, dialect=dialect)
        try:
            body = self.bodies.parse(raw)
        except orjson.JSONDecodeError:
            body = None
        parse = functools.partial(_given, body)
        items = body.get(dialect.field) if isinstance(body, dict) else None
        project = None
        if isinstance(dialect, Adapter) and isinstance(items, list) and len(items) <= MAX_MESSAGES:
            # Only the items new since the last turn, long ones in a thread (`Incremental`).
            projected = await dialect.reader.read(body, self.bodies)
            project = None if projected is None else functools.partial(_given, projected.messages)
        elif dialect is not CHAT and isinstance(items, list) and len(items) > LONG_HISTORY:
            # Projected onto chat messages item by item, in Python: all of it in a thread.
            return await asyncio.to_thread(
                read_request, raw, headers, self.tenancy, dialect, parse=parse, started=started
            )
        request = read_request(
            raw, headers, self.tenancy, dialect, parse=parse, identify=False, started=started,
            project=project,
        )  # fmt: skip
        messages = request.messages
        if messages is not None and isinstance(items, list) and self.bodies.narrow(items, raw):
            request = dataclasses.replace(request, narrow=True)
        if messages is not None and root_length(messages) > LONG_HISTORY:
            return await asyncio.to_thread(with_conversation, request, self.tenancy.secret)
        return with_conversation(request, self.tenancy.secret)

    async def decide(
        self, request: ChatRequest, *, window: int | None = None, confirm: Confirm | None = None
    ) -> Outcome:
        """What to forward. Never raises: a failure forwards the original bytes.

        `window`: the context window the upstream reported (a retry); the request is then
        compacted under it even below the trigger, since the upstream refused it as it was.
        `confirm`: the upstream's own count of the request, asked for near the trigger
        (`proxy.dialects.anthropic_count`).
        """
        if request.body is None or (request.messages is None and not request.oversized):
            # Not ours to judge: the upstream is. Without a credential it was not even parsed.
            return self._outcome(request, "passthrough", no_credential=request.tenant is None)
        resolved = self.policies.resolve(
            key_fingerprint=request.key_id,
            model=request.model,
            headers=request.headers,
            api=request.dialect.name,
        )
        if window is None:
            if resolved.requested_policy_refused:
                self.metrics.refused("x-compactd-policy")
            if resolved.bypass_refused:
                self.metrics.refused("x-compactd-bypass")
        policy = resolved.policy
        if resolved.bypass:
            return self._outcome(request, "bypass", policy=policy.name)
        tokens: int | None = None
        try:
            counted = await self.sizing.count(request, policy, window)
            tokens = counted.tokens
            if confirm is not None and window is None:
                counted = await self.sizing.confirmed(request, counted, confirm)
            return await self._compact(request, policy, counted, forced=window is not None)
        except Exception as exc:  # the single fail-open boundary: forward the original request
            reason = _reason(exc)
            log.warning(
                "compaction failed open",
                extra={"reason": reason, "tenant": request.key_id, "model": request.model},
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            self.metrics.fail_open(reason)
            return self._outcome(
                request,
                "error",
                policy=policy.name,
                tokens_before=tokens,
                tokens_after=tokens,
                error=reason,
            )

    async def after_overflow(
        self, request: ChatRequest, first: Outcome, upstream_message: str
    ) -> Outcome | None:
        """The upstream said the context was too long: learn the window and decide once more.

        None when no retry is due: shadow mode and bypass relay the upstream's answer as it is,
        and a retry that would not send anything smaller is not made.
        """
        if first.retried or request.body is None or not request.model:
            return None
        sent = first.tokens_sent  # what went upstream
        window = self.sizing.overflowed(request, upstream_message, sent)
        if window is None or first.action in ("bypass", "shadow"):
            return None
        retry = await self.decide(request, window=window)
        if (
            retry.action not in REWRITTEN
            or retry.tokens_after is None
            or retry.tokens_after >= sent
        ):
            return None
        return dataclasses.replace(retry, retried=True)

    def cache_entries(self) -> dict[str, int]:
        """Entries each of this compactor's in-memory caches holds (for the metrics)."""
        return {
            "bodies": self.bodies.entries(),
            "lossless_forms": self.lossless.entries(),
            "stored_forms": self.persist.stored_forms.entries(),
            "precompute": self.precompute.entries(),
            "replay_checks": self.planner.replay_checks.entries(),
            "native_counts": self.sizing.native_counts(),
            "token_counts": sum(c.entries() for c in self.tokenizers.counters()),
        }

    def close(self) -> None:
        """Let the providers' threads go (one still running a sync provider finishes first)."""
        self.planner.close()

    async def _compact(
        self, request: ChatRequest, policy: PolicySettings, counted: Counted, *, forced: bool
    ) -> Outcome:
        assert request.body is not None
        shadow = policy.mode == "shadow"
        figures: dict[str, Any] = {
            "policy": policy.name,
            "tokens_before": counted.tokens,
            "tokens_after": counted.tokens,
        }
        if policy.mode == "off":
            return self._outcome(request, "passthrough", **figures)
        if request.dialect.history_elsewhere(request.body):
            # The history is on the server: only what is sent can be counted, none compacted.
            return self._outcome(request, "server-history", **figures)
        forms = self._lossless(request, policy)
        if forms is not None:
            figures["tokens_after"] = counted.fixed + counted.counter.count_messages(forms.messages)
        if figures["tokens_after"] <= counted.budget.trigger and not forced:
            tokens = figures["tokens_after"]
            self._maybe_precompute(request, policy, counted, forms, tokens=tokens, generation=-1)
            if forms is None:
                return self._outcome(request, "passthrough", **figures)
            figures["providers"] = ("lossless",)
            if shadow:
                return self._outcome(request, "shadow", shadow_action="lossless", **figures)
            content = request.dialect.with_messages(request.body, forms.messages)
            _exact(request, self.bodies, content)
            unstored = await self.persist.forms(request, policy, forms, after=-1)
            return self._outcome(request, "lossless", content, unstored=unstored, **figures)
        if request.tenant is None:
            # No credential, no tenant to keep originals under: never compacted, never stored.
            figures["tokens_after"] = counted.tokens
            return self._outcome(request, "passthrough", no_credential=True, **figures)
        plan = await self.planner.plan(request, request.tenant, policy, counted, forms)
        if plan.failure:
            self.metrics.fail_open("provider")
            return self._outcome(request, "error", error=plan.failure, **figures)
        figures["providers"] = plan.providers
        if plan.action == "passthrough":
            if shadow:
                return self._outcome(request, "shadow", shadow_action="passthrough", **figures)
            return self._outcome(request, "passthrough", **figures)
        unstored = False
        if plan.compaction is not None:
            _exact(request, self.bodies)  # before its originals are stored
            plan, unstored = await self.persist.compaction(plan, policy)
            figures["providers"] = plan.providers
        sent = list(plan.messages)
        figures["tokens_after"] = (
            plan.tokens
            if plan.tokens is not None
            else counted.fixed + counted.counter.count_messages(sent)
        )
        if plan.action == "replayed" and not forced:
            tokens, generation = figures["tokens_after"], plan.generation
            self._maybe_precompute(
                request, policy, counted, forms, tokens=tokens, generation=generation
            )
        if shadow:
            return self._outcome(request, "shadow", shadow_action=plan.action, **figures)
        if request.dialect is CHAT:  # orjson's: it holds the GIL in a thread too
            content = self.splicer.chat_body(request.body, request.messages, sent, plan.checkpoint)
        elif isinstance(request.dialect, Adapter):  # spliced, or rebuilt message by message
            content = await self.splicer.native_body(
                request.dialect, request.body, sent, plan.checkpoint
            )
        else:  # matched to the request's items and rebuilt in Python, message by message
            history = request.messages or sent
            content = await per_message(history, request.dialect.with_messages, request.body, sent)
        expand = self._expand_plan(request, policy, sent, forms)
        if expand is not None:
            content = rewrite.with_messages(expand.body, sent)
            figures["tokens_after"] += expand.tool_tokens
        _exact(request, self.bodies, content)
        if forms is not None:
            # The forms past the checkpoint (or all of them, without one) go out as they are.
            cp = plan.compaction.checkpoint if plan.compaction is not None else None
            after = cp.covered_through if cp is not None else plan.generation
            unstored = await self.persist.forms(request, policy, forms, after=after) or unstored
        return self._outcome(
            request, plan.action, content, unstored=unstored, expand=expand, **figures
        )

    def _maybe_precompute(
        self,
        request: ChatRequest,
        policy: PolicySettings,
        counted: Counted,
        forms: Lossless | None,
        *,
        tokens: int,
        generation: int,
    ) -> None:
        """Schedule the next checkpoint of a conversation near its trigger
        (`proxy.chat.precompute`): the plan the request would get over its trigger, stored, off
        the request path."""
        tenant = request.tenant
        if policy.mode != "enforce" or tenant is None:
            return
        if not self.precompute.due(tokens, counted.budget.trigger, policy.precompute_ratio):
            return
        if _wide(request, self.bodies):
            return  # never compacted (`_exact`): nothing to prepare
        # Aim lower by what the conversation may still grow before it crosses the trigger, so the
        # turn that replays this checkpoint has the headroom a compaction made then would leave.
        budget = counted.budget
        target = max(1, budget.target - (budget.trigger - tokens))
        early = dataclasses.replace(
            counted, budget=dataclasses.replace(budget, trigger=0, target=target)
        )

        async def work() -> str:
            plan = await self.planner.plan(request, tenant, policy, early, forms)
            if plan.failure:
                return "failed"
            if plan.compaction is None:
                return "not_worth_it"
            cp = plan.compaction.checkpoint
            marked = dataclasses.replace(cp, providers=[*cp.providers, PRECOMPUTED])
            compaction = dataclasses.replace(plan.compaction, checkpoint=marked)
            await self.persist.compaction(dataclasses.replace(plan, compaction=compaction), policy)
            return "stored"

        self.precompute.schedule((tenant, request.conversation, generation), work)

    def _expand_plan(
        self,
        request: ChatRequest,
        policy: PolicySettings,
        sent: list[Message],
        forms: Lossless | None,
    ) -> ExpandPlan | None:
        """How a rewritten request offers the expand tool (None: its policy does not)."""
        if not policy.expand_tool or request.dialect is not CHAT or request.tenant is None:
            return None
        assert request.body is not None
        offered = with_tool(request.body)
        if offered is None:
            return None
        counter = self.tokenizers.for_model(self.models.lookup(request.model))
        return ExpandPlan(
            tenant=request.tenant,
            body={**offered, "messages": sent},
            conversation=request.conversation,
            count=counter.count_text,
            tool_tokens=counter.count_tools(offered) - counter.count_tools(request.body),
            local={ref: [m] for ref, m in forms.originals.items()} if forms else {},
            max_calls=policy.expand_max_calls,
            max_tokens=policy.expand_max_tokens,
        )

    def _lossless(self, request: ChatRequest, policy: PolicySettings) -> Lossless | None:
        """The request's lossless forms when its policy has the tier and a tenant to keep the
        originals under; None when nothing changes. Chat Completions only for now: other APIs'
        projections carry items the forms would have to map back one for one."""
        if not policy.lossless or request.tenant is None or request.messages is None:
            return None
        if request.dialect is not CHAT:
            return None
        forms = self.lossless.apply(request.messages, self.bodies.digests(request.messages))
        return forms if forms.changed else None

    def _outcome(
        self, request: ChatRequest, action: Action, content: bytes | None = None, **kw: Any
    ) -> Outcome:
        """The outcome, with the usage splice applied (the only other change to the bytes)."""
        if content is None:
            content = request.raw
        elif action not in REWRITTEN:
            # Must stay 0: anything we did not deliberately rewrite goes as the client sent it.
            self.metrics.passthrough_bytes_changed(max(1, abs(len(content) - len(request.raw))))
            content = request.raw
        injected = False
        if (
            self.request_stream_usage
            and request.dialect.stream_usage_option
            and action != "bypass"
            and request.body is not None
        ):
            spliced = rewrite.with_include_usage(content, request.body)
            if spliced is not None:
                content, injected = spliced, True
        return Outcome(
            action=action,
            content=content,
            conversation=request.conversation,
            injected_usage=injected,
            **kw,
        )


def _exact(request: ChatRequest, bodies: BodyCache, sent: bytes | None = None) -> None:
    """Raise WideIntegerError (fail open, before anything is stored) if the request holds an
    integer beyond 64 bits: orjson read it as a float, so every rewrite of the body, and every
    original stored from it, would carry another number than the client sent."""
    if _wide(request, bodies, sent):
        raise WideIntegerError


def _wide(request: ChatRequest, bodies: BodyCache, sent: bytes | None = None) -> bool:
    """Whether the request holds an integer beyond 64 bits (see `_exact`).

    Every turn of a long conversation is rewritten (replayed), so this must cost the turn's new
    bytes, not the body's: a chat body the body cache extended was looked at past the bytes of
    the body it extends when it was read (`request.narrow`), or is now if its entry is still
    there (`BodyCache.holds_wide_int`); another API's only when `sent` (the bytes a rewrite would
    send) holds a float written with an exponent, as orjson writes every integer it could not
    keep (`1.8446744073709552e+19`)."""
    if request.narrow:
        return False
    if request.dialect is CHAT and request.messages is not None:
        return bodies.holds_wide_int(request.messages, request.raw)
    items = None if request.body is None else request.body.get(request.dialect.field)
    if not isinstance(items, list):
        return (sent is None or b"e+" in sent) and holds_wide_int(request.raw)
    # The body cache's look first: it costs the bytes new since the last turn, and marks
    # the body narrow for the next one (`ChatRequest.narrow`).
    return bodies.holds_wide_int(items, request.raw) and (sent is None or b"e+" in sent)


def _given(body: Any, raw: bytes) -> Any:
    """`parse` for `read_request` when the body was parsed already."""
    del raw
    return body


def _reason(exc: BaseException) -> str:
    if isinstance(exc, QuotaExceededError):
        return "quota"
    if isinstance(exc, StoreError):
        return "store"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, TooManyMessagesError):
        return "too_many_messages"
    if isinstance(exc, WideIntegerError):
        return "wide_integer"
    return type(exc).__name__
