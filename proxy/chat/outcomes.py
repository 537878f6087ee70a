"""A counted request's outcome: the action taken and the exact bytes that go upstream.

The decision's last phase (`proxy.chat.compactor`). Under its trigger a request goes out as the
client sent it, or in its lossless forms; over it, the plan (`proxy.chat.planner`) is stored
(`proxy.chat.persist`) and its messages spliced into the client's body (`proxy.chat.splice`),
with the expand tool offered where the policy asks. Near the trigger, the next checkpoint is
scheduled off the request path (`proxy.chat.precompute`). The usage splice is the only other
change ever made to the bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.chat.bodycache import BodyCache
from proxy.chat.expand import ExpandPlan, with_tool
from proxy.chat.lossless import Lossless, LosslessTier
from proxy.chat.persist import Persister
from proxy.chat.planner import Planner, per_message
from proxy.chat.precompute import PRECOMPUTED, Precomputer
from proxy.chat.request import REWRITTEN, Action, ChatRequest, Outcome
from proxy.chat.sizing import Counted
from proxy.chat.splice import Splicer
from proxy.config import PolicySettings
from proxy.dialects.adapter import Adapter
from proxy.dialects.chat import CHAT
from proxy.errors import WideIntegerError
from proxy.providers.base import Message
from proxy.runtime.exactjson import holds_wide_int
from proxy.telemetry.metrics import Metrics
from proxy.tokens.budget import ModelTable
from proxy.tokens.counter import Tokenizers
from proxy.wire import rewrite


class Outcomes:
    """Turns counted requests into outcomes: the action, the bytes, the figures."""

    def __init__(
        self,
        *,
        planner: Planner,
        persist: Persister,
        bodies: BodyCache,
        splicer: Splicer,
        precompute: Precomputer,
        tokenizers: Tokenizers,
        models: ModelTable,
        metrics: Metrics,
        request_stream_usage: bool,
    ) -> None:
        self.planner = planner
        self.persist = persist
        self.bodies = bodies
        self.splicer = splicer
        self.precompute = precompute
        self.tokenizers = tokenizers
        self.models = models
        self.metrics = metrics
        self.request_stream_usage = request_stream_usage
        self.lossless = LosslessTier()

    async def compact(
        self, request: ChatRequest, policy: PolicySettings, counted: Counted, *, forced: bool
    ) -> Outcome:
        assert request.body is not None
        shadow = policy.mode == "shadow"
        figures: dict[str, Any] = {
            "policy": policy.name,
            "tokens_before": counted.tokens,
            "tokens_after": counted.tokens,
            "cold": counted.cold.cold,
            "answered": counted.cold.answered if counted.cold.learn is not None else None,
        }
        if policy.mode == "off":
            return self.of(request, "passthrough", **figures)
        if request.dialect.history_elsewhere(request.body):
            # The history is on the server: only what is sent can be counted, none compacted.
            return self.of(request, "server-history", **figures)
        forms = self._lossless(request, policy)
        if forms is not None:
            figures["tokens_after"] = counted.fixed + counted.counter.count_messages(forms.messages)
        under = figures["tokens_after"] <= counted.budget.trigger
        if under and not forced and not counted.cold.replay:
            tokens = figures["tokens_after"]
            self._maybe_precompute(request, policy, counted, forms, tokens=tokens, generation=-1)
            if forms is None:
                return self.of(request, "passthrough", **figures)
            figures["providers"] = ("lossless",)
            if shadow:
                return self.of(request, "shadow", shadow_action="lossless", **figures)
            content = request.dialect.with_messages(request.body, forms.messages)
            exact(request, self.bodies, content)
            unstored = await self.persist.forms(request, policy, forms, after=-1)
            return self.of(request, "lossless", content, unstored=unstored, **figures)
        if request.tenant is None:
            # No credential, no tenant to keep originals under: never compacted, never stored.
            figures["tokens_after"] = counted.tokens
            return self.of(request, "passthrough", no_credential=True, **figures)
        plan = await self.planner.plan(request, request.tenant, policy, counted, forms)
        if plan.failure:
            self.metrics.fail_open("provider")
            return self.of(request, "error", error=plan.failure, **figures)
        figures["providers"] = plan.providers
        if plan.action == "passthrough":
            if shadow:
                return self.of(request, "shadow", shadow_action="passthrough", **figures)
            return self.of(request, "passthrough", **figures)
        unstored = False
        if plan.compaction is not None:
            exact(request, self.bodies)  # before its originals are stored
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
            return self.of(request, "shadow", shadow_action=plan.action, **figures)
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
        exact(request, self.bodies, content)
        if forms is not None:
            # The forms past the checkpoint (or all of them, without one) go out as they are.
            cp = plan.compaction.checkpoint if plan.compaction is not None else None
            after = cp.covered_through if cp is not None else plan.generation
            unstored = await self.persist.forms(request, policy, forms, after=after) or unstored
        if plan.action in ("compacted", "replayed"):
            counted.cold.compacted()
        return self.of(request, plan.action, content, unstored=unstored, expand=expand, **figures)

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
        if wide(request, self.bodies):
            return  # never compacted (`exact`): nothing to prepare
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

    def of(
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


def exact(request: ChatRequest, bodies: BodyCache, sent: bytes | None = None) -> None:
    """Raise WideIntegerError (fail open, before anything is stored) if the request holds an
    integer beyond 64 bits: orjson read it as a float, so every rewrite of the body, and every
    original stored from it, would carry another number than the client sent."""
    if wide(request, bodies, sent):
        raise WideIntegerError


def wide(request: ChatRequest, bodies: BodyCache, sent: bytes | None = None) -> bool:
    """Whether the request holds an integer beyond 64 bits (see `exact`).

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
