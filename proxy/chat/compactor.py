"""The chat decision: one `ChatRequest` in, one `Outcome` out (replay, trigger, chain, store).

Everything here runs before the request goes upstream, in phases that each have their module:
the request is sized against its model (`proxy.chat.sizing`); under its trigger it is forwarded
as the original bytes after one (cached) count; above it, the plan (`proxy.chat.planner`)
replays the longest stored checkpoint of the conversation that is safe for this request (see
`proxy.chat.checkpoint.replay_problem`), so every later turn sends the same bytes for the same
prefix (prompt caches stay warm), and compacts afresh only when even the replayed form is over
budget; its originals are stored first (`proxy.chat.persist`), and the outcome's bytes are made
(`proxy.chat.outcomes`). Any failure in here, a provider's included, forwards the original bytes
(`x-compactd-action: error`), counts it and logs it; a later provider that reaches the target
makes good an earlier one's failure.

After an upstream context-length error, the chat endpoint's loop (`proxy.chat.handler`) asks
`after_overflow`, which learns the window and decides again from the same request with that
window (never in shadow mode or on bypass).
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
from proxy.chat.outcomes import Outcomes
from proxy.chat.persist import Persister
from proxy.chat.planner import CompleterFactory, Planner
from proxy.chat.policy import PolicyResolver
from proxy.chat.precompute import Precomputer
from proxy.chat.quota import Quota
from proxy.chat.request import (
    MAX_MESSAGES,
    REWRITTEN,
    ChatRequest,
    Outcome,
    cannot_compact,
    read_request,
    with_conversation,
)
from proxy.chat.sizing import Sizing
from proxy.chat.splice import Splicer
from proxy.config import PolicySettings, Settings
from proxy.dialects.adapter import Adapter
from proxy.dialects.anthropic_count import Confirm
from proxy.dialects.chat import CHAT, Dialect
from proxy.errors import QuotaExceededError, StoreError, TooManyMessagesError, WideIntegerError
from proxy.providers.base import ContextProvider
from proxy.providers.chain import LONG_HISTORY
from proxy.runtime.digest import root_length
from proxy.store.base import Store
from proxy.telemetry.metrics import Metrics
from proxy.tokens.budget import ModelTable
from proxy.tokens.calibration import Calibration
from proxy.tokens.counter import Tokenizers
from proxy.tokens.windows import LearnedWindows
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
        self.policies = policies
        self.store = store
        self.metrics = metrics
        self.tenancy = tenancy
        self.windows = windows
        self.calibration = calibration
        self.bodies = BodyCache(settings.tokens.body_cache_mb << 20)
        self.splicer = Splicer(self.bodies, settings.tokens.prefix_cache_mb << 20, metrics)
        self.precompute = Precomputer(metrics.precomputed)
        quota_mb = settings.limits.tenant_quota_mb
        self.quota = Quota(store, quota_mb << 20) if quota_mb else None
        self.sizing = Sizing(
            tokens=settings.tokens,
            tokenizers=tokenizers,
            models=models,
            bodies=self.bodies,
            metrics=metrics,
            windows=windows,
            calibration=calibration,
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
        self.persist = Persister(
            settings=settings.store,
            store=store,
            metrics=metrics,
            bodies=self.bodies,
            quota=self.quota,
        )
        self.outcomes = Outcomes(
            planner=self.planner,
            persist=self.persist,
            bodies=self.bodies,
            splicer=self.splicer,
            precompute=self.precompute,
            tokenizers=tokenizers,
            models=models,
            metrics=metrics,
            request_stream_usage=settings.accounting.request_stream_usage,
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
            return self.outcomes.of(request, "passthrough", no_credential=request.tenant is None)
        policy, bypass = self._policy(request, retry=window is not None)
        if bypass:
            return self.outcomes.of(request, "bypass", policy=policy.name)
        tokens: int | None = None
        try:
            counted = await self.sizing.count(request, policy, window)
            tokens = counted.tokens
            if confirm is not None and window is None:
                counted = await self.sizing.confirmed(request, counted, confirm)
            return await self.outcomes.compact(request, policy, counted, forced=window is not None)
        except Exception as exc:  # noqa: BLE001 - the single fail-open boundary (logged there)
            return self._failed_open(request, policy, tokens, exc)

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

    def _policy(self, request: ChatRequest, *, retry: bool) -> tuple[PolicySettings, bool]:
        """The request's policy, and whether it bypasses compaction. A header asking for what
        the key may not have is counted once (not again when a retry decides anew)."""
        resolved = self.policies.resolve(
            key_fingerprint=request.key_id,
            model=request.model,
            headers=request.headers,
            api=request.dialect.name,
        )
        if not retry:
            if resolved.requested_policy_refused:
                self.metrics.refused("x-compactd-policy")
            if resolved.bypass_refused:
                self.metrics.refused("x-compactd-bypass")
        return resolved.policy, resolved.bypass

    def _failed_open(
        self, request: ChatRequest, policy: PolicySettings, tokens: int | None, exc: Exception
    ) -> Outcome:
        """The original request, forwarded because deciding failed: counted and logged."""
        reason = _reason(exc)
        log.warning(
            "compaction failed open",
            extra={"reason": reason, "tenant": request.key_id, "model": request.model},
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        self.metrics.fail_open(reason)
        return self.outcomes.of(
            request,
            "error",
            policy=policy.name,
            tokens_before=tokens,
            tokens_after=tokens,
            error=reason,
        )

    def cache_entries(self) -> dict[str, int]:
        """Entries each of this compactor's in-memory caches holds (for the metrics)."""
        return {
            "bodies": self.bodies.entries(),
            "lossless_forms": self.outcomes.lossless.entries(),
            "stored_forms": self.persist.stored_forms.entries(),
            "precompute": self.precompute.entries(),
            "replay_checks": self.planner.replay_checks.entries(),
            "native_counts": self.sizing.native_counts(),
            "token_counts": sum(c.entries() for c in self.tokenizers.counters()),
        }

    def close(self) -> None:
        """Let the providers' threads go (one still running a sync provider finishes first)."""
        self.planner.close()


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
