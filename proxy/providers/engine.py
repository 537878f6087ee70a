"""The `engine` provider: the context-compression-engine behaviour, done right for OpenAI requests.

Every message that may change climbs one ladder (`ladder.py`), in the order of its keep key:
its place in the conversation, plus, for a tool result, its relevance to the recent turns (BM25
against the last user message and the final units), so a stale observation goes before a file
view the agent is still working on. First every stale tool output is masked (head, tail and the
lines holding the recent turns' terms, or the terms the agent's next message took up from it,
kept); then message by message: summarized (hard content
kept, exact or fuzzy duplicates replaced by a readable reference), reduced to its facts, and
its unit dropped into a stub that keeps the run's facts once its last message is reduced. The
last rungs (`force_converge`) leave short reference markers with fewer and fewer facts, then
the markers alone; a final tool result is cut only when nothing else can fit the request.

The least lossy rung that fits the target is found in two passes (`engine_plan.py`): one climb
prices rungs from the length of what their forms say, calibrated on the first few it writes,
then a few exact probes near the estimate settle it (only the forms of those rungs are counted
with tiktoken). Messages of different roles, `name`s or `tool_call_id`s are never merged;
system/developer messages, the head, the last user message and the final message are never
touched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
)
from proxy.providers.dedup import Duplicate, find_exact, find_fuzzy
from proxy.providers.engine_forms import (
    DROPPED,
    FACTS,
    FORCED,
    MASKED,
    SUMMARY,
    Form,
    Forms,
    FormSettings,
    fact_text,
)
from proxy.providers.engine_plan import Estimates, Plan
from proxy.providers.ladder import keep_keys, ladder, reactions
from proxy.providers.relevance import heaviest
from proxy.providers.rung_search import search_guided
from proxy.providers.units import (
    Unit,
    final_tool_results,
    last_index,
    message_text,
    protection,
    split_units,
)

_LIMITATIONS = {
    MASKED: "stale tool outputs masked (head and tail kept)",
    SUMMARY: "older prose summarized extractively (hard content kept)",
    FACTS: "older messages reduced to their facts",
    DROPPED: "oldest units dropped (their facts kept in a stub)",
    FORCED: "forced convergence: messages reduced to a reference marker and a few facts",
}


# Forced convergence climbs these rungs: every stub and every message still rewritable gets the
# short marker and at most this many characters of facts, the last rung the marker alone.
FORCE_FACT_CHARS = (400, 200, 100, 50, 0)


@dataclass(frozen=True)
class EngineOptions:
    """The engine's `extra_config` keys (unknown keys are rejected)."""

    preserve: tuple[str, ...] = ("system", "developer")
    dedup: bool = True
    fuzzy_dedup: bool = False
    fuzzy_threshold: float = 0.85
    dedup_min_chars: int = 200
    summary_ratio: float = 0.4
    facts_ratio: float = 0.4
    stub_facts_ratio: float = 0.1
    max_facts_chars: int = 1500
    merge_consecutive: bool = True
    force_converge: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> EngineOptions:
        """Validated options from a policy's `extra_config`; raises ValueError on bad input."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - names)
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(unknown)}")
        values = dict(extra)
        if "preserve" in values:
            values["preserve"] = tuple(str(r) for r in values["preserve"])
        options = cls(**values)
        for name in ("fuzzy_threshold", "summary_ratio", "facts_ratio", "stub_facts_ratio"):
            if not 0.0 < float(getattr(options, name)) <= 1.0:
                raise ValueError(f"engine option {name} must be in (0, 1]")
        if options.max_facts_chars < 0 or options.dedup_min_chars < 0:
            raise ValueError("engine character limits must be >= 0")
        return options


# An agent run is one user turn followed by hundreds of tool exchanges: a recency window in turns
# would cover all of it. The window is at most this many units (the latest observations stay
# verbatim longest, as observation masking keeps the last few).
RECENT_UNITS = 6
# A rung that leaves at most 1/CLOSE_ENOUGH of the target unused is taken as the answer.
CLOSE_ENOUGH = 200


def _query(messages: Sequence[Message], units: Sequence[Unit], recent: frozenset[int]) -> list[int]:
    """What the conversation is about now: the last user message and the messages of the
    recency window, narrowed to its last RECENT_UNITS units."""
    inside = [u for u in units if u.kind != "system" and any(i in recent for i in u.indices())]
    query = {i for u in inside[-RECENT_UNITS:] for i in u.indices()}
    query.add(last_index(messages, "user"))
    return sorted(i for i in query if i >= 0)


class EngineProvider(ContextProvider):
    """Deterministic summaries, dedup and dropping, searched to fit the target."""

    option_schema = EngineOptions

    @property
    def name(self) -> str:
        """Registry name."""
        return "engine"

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Reject unknown or bad `extra_config` keys at start-up."""
        EngineOptions.from_extra(options)

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        """Compact `messages` to the least lossy rung of the ladder that fits `config.limit`."""
        return compact(messages, config, EngineOptions.from_extra(config.extra_config))


def _duplicates(
    texts: Sequence[str], candidates: list[int], opts: EngineOptions
) -> dict[int, Duplicate]:
    if not opts.dedup:
        return {}
    found = {d.index: d for d in find_exact(texts, candidates, opts.dedup_min_chars)}
    if opts.fuzzy_dedup:
        fuzzy = find_fuzzy(
            texts, candidates, opts.dedup_min_chars, opts.fuzzy_threshold, frozenset(found)
        )
        found.update((d.index, d) for d in fuzzy)
    return found


# Room under the target worth filling. A stub lists more facts in FILL_MIN tokens, whatever the
# target: they hold a name or number a later question may ask about (a share of the target, 5 %
# before, left a long request's 20-200 tokens unused). A message its last step reduced to its
# facts is cut to the room only when the room is a share of the target (CUT_SHARE, and CUT_MIN
# tokens): a cut into a few spare tokens keeps less than its fact list did, and costs more.
FILL_MIN = 5
CUT_SHARE = 0.05
CUT_MIN = 20
# In a room smaller than that a stub is grown only if it used FULL_STUB of its own room: one that
# did not has listed what it read, and writing it again to find that out is most of a fill's
# cost (on the chat corpora ~8x the stubs written, for nothing).
FULL_STUB = 0.8
# Shares of the room a filling cut is sized to (its exact count is known once it is written).
FILL_TRIES = (0.97, 0.9, 0.7, 0.5)


def _fill(
    plan: Plan, chosen: int, config: CompressionConfig, out: list[Message], used: list[Form]
) -> tuple[list[Message], list[Form]]:
    """When the rung that fits leaves room under the target (its last step freed more than was
    needed), the room is filled: a large message its last step reduced to its facts is cut head
    and tail to the room instead (when the room is a share of the target), then a stub lists
    more of its facts."""
    slack = config.limit - config.count_tokens(out)
    if slack < FILL_MIN:
        return out, used
    step = plan.steps[chosen - 1]
    worth_cutting = slack >= max(CUT_MIN, int(config.limit * CUT_SHARE))
    if worth_cutting and step.level != DROPPED and step.message not in plan.fixed:
        # A long answer that has no summary smaller than itself goes straight to its fact list:
        # cut head and tail, it holds its own text as well as its facts (listed first).
        now = plan.forms.single(step.message, step.level)
        if now is not None and now.body.startswith("facts: "):  # not a reference or summary
            cuts = _message_cuts(plan, step.message, now.tokens + slack)
            found = _first_fit(plan, chosen, config, cuts)
            if found is not None:
                out, used = found
                slack = config.limit - config.count_tokens(out)
                if slack < FILL_MIN:
                    return out, used
    # The stub the last step dropped a unit into, or else the newest stub (the last to go).
    stubs = [f for f in used if plan.forms.is_stub(f)]
    if step.level == DROPPED:
        start = plan.units[step.unit].start
        stubs = [f for f in stubs if f.start <= start < f.end]
    if stubs and not worth_cutting:
        stub = stubs[-1]
        if len(stub.body) < FULL_STUB * plan.forms.stub_cap(stub.start, stub.end):
            stubs = []
    if stubs:
        found = _grown(plan, stubs[-1], slack, config, (out, used))
        if found is not None:
            return found
    return out, used


def _first_fit(
    plan: Plan, chosen: int, config: CompressionConfig, tries: Iterator[None]
) -> tuple[list[Message], list[Form]] | None:
    """Rung `chosen` rebuilt after each override `tries` sets: the first that fits, if any (an
    override that does not fit is undone by `tries`)."""
    for _ in tries:
        filled, filled_used, _ = plan.build(chosen, None)
        if config.count_tokens(filled) <= config.limit:
            return filled, filled_used
    return None


def _message_cuts(plan: Plan, i: int, room: int) -> Iterator[None]:
    """Message i cut head and tail to shares of `room` tokens, largest first."""
    forms = plan.forms
    chars = len(message_text(plan.messages[i]))
    for share in FILL_TRIES:
        draft = forms.fill_draft(i, int(room * share * chars / max(forms.costs[i], 1)))
        if draft is None:
            break
        plan.override[i] = forms.materialize(draft)
        yield None
    plan.override.pop(i, None)


def _grown(
    plan: Plan,
    stub: Form,
    slack: int,
    config: CompressionConfig,
    current: tuple[list[Message], list[Form]],
) -> tuple[list[Message], list[Form]] | None:
    """The `current` messages and forms with `stub` listing more facts, sized to shares of
    `slack` tokens, largest first: the first that fits, if any. A stub is a message of its own
    (never merged), so the grown one takes its place without building the rung again, and one
    that grows by more than the slack by its own count is not counted: the request counts each
    message apart."""
    forms = plan.forms
    out, used = current
    span = (stub.start, stub.end)
    per_token = forms.stub_chars_per_token(*span)
    cap = forms.stub_cap(*span)
    for share in FILL_TRIES:
        form = forms.stub_sized(*span, cap + int(slack * share * per_token))
        if form is None or form.tokens <= stub.tokens:
            break
        if form.tokens - stub.tokens > slack:
            continue
        grown = [form.message if m is stub.message else m for m in out]
        if config.count_tokens(grown) <= config.limit:
            return grown, [form if f is stub else f for f in used]
    return None


# A forced rung's fact cap is refined between the one that fits and the one before it (that
# did not) until they are this close, in characters.
FORCE_CAP_STEP = 10


def _finer_cap(
    plan: Plan, fits: int, over: int, out: list[Message], config: CompressionConfig
) -> int:
    """The largest fact cap between `fits` (a forced rung's, whose messages `out` are within the
    target) and `over` (the rung's before it, over the target) that still fits: the caps halve
    from rung to rung, so the one that fits may leave much of the target unused."""
    # Any room that holds a few facts is worth it, not only a share of the target: nothing
    # else is left to fill it, and the caps halve, so the gap is often a few dozen tokens.
    if config.limit - config.count_tokens(out) < FILL_MIN:
        return fits
    top = len(plan.steps)
    while over - fits > FORCE_CAP_STEP:
        mid = (fits + over) // 2
        if plan.build(top, mid, collect=False)[2] <= config.limit:
            fits = mid
        else:
            over = mid
    return fits


def compact(
    messages: list[Message], config: CompressionConfig, opts: EngineOptions
) -> CompactionResult:
    """The engine algorithm with explicit options (what `EngineProvider.compress` runs)."""
    result, cuttable = _compact(messages, config, opts, cut_final=False)
    if cuttable and config.count_tokens(result.messages) > config.budget:
        # The protected messages alone fit, so the final tool results were kept whole; but what
        # the rest can shrink to does not count in that floor (the final assistant message keeps
        # its tool calls, and on the Responses and Messages APIs its reasoning or thinking too;
        # the stand-in for what was dropped). Cutting the final tool results is the last resort:
        # taken only when it makes the request fit.
        retry, _ = _compact(messages, config, opts, cut_final=True)
        if config.count_tokens(retry.messages) <= config.budget:
            return retry
    return result


def _compact(
    messages: list[Message], config: CompressionConfig, opts: EngineOptions, *, cut_final: bool
) -> tuple[CompactionResult, bool]:
    """One compaction; `cut_final`: the final tool results may be cut even though the protected
    messages alone fit the budget. Also says whether they were kept whole only for that reason."""
    units = split_units(messages)
    prot = protection(messages, units, config.keep_head, config.recency_turns)
    fixed = (
        prot.hard
        | prot.head
        | {i for i, m in enumerate(messages) if m.get("role") in opts.preserve}
    )
    # What `droppable(u, prot, relaxed=True)` and no fixed message say, one set test a unit.
    blocked = fixed | prot.hard | prot.head
    can_drop = [u.kind != "system" and blocked.isdisjoint(u.indices()) for u in units]
    # The last resort: when the final tool results alone keep the request over budget, they may
    # be cut head and tail (never dropped), after everything else has given what it can.
    last = final_tool_results(messages) - (prot.head | {i for i in fixed if i not in prot.hard})
    costs = [config.count_message(m) for m in messages]
    base = config.count_tokens([])  # reply priming and tool schemas: a request adds its messages
    floor = base + sum(costs[i] for i in fixed)
    cuttable = bool(last) and not cut_final and floor <= config.budget
    if not last or (floor <= config.budget and not cut_final):
        last = frozenset()
    fixed = fixed - last
    texts = [message_text(m) for m in messages]
    query = _query(messages, units, prot.hard | prot.recent)
    # Relevance reads the tool results, the query and the assistant messages that react to the
    # tool results only: their fact texts, shared with forms.
    reacting = reactions(messages)
    needed = set(query) | set(reacting) | set(reacting.values())
    needed |= {i for i, m in enumerate(messages) if m.get("role") == "tool"}
    fact_texts = {i: fact_text(messages[i]) for i in needed}
    taken: dict[int, set[str]] = {}
    keys, weights = keep_keys(
        messages, [fact_texts.get(i, "") for i in range(len(messages))], query, taken, reacting
    )
    steps = ladder(units, messages, keys, fixed=fixed, can_drop=can_drop, last=last)
    candidates = [i for i in range(len(messages)) if i not in fixed]
    settings = FormSettings(
        opts.summary_ratio, opts.facts_ratio, opts.stub_facts_ratio, opts.max_facts_chars
    )
    forms = Forms(messages, config, settings, _duplicates(texts, candidates, opts), costs)
    forms.keys = keys
    forms.query_terms = heaviest(weights)
    forms.taken = taken
    forms.shown = frozenset(fixed)
    forms.seed_fact_texts(fact_texts)
    plan = Plan(messages, units, fixed, steps, forms, opts.merge_consecutive, base)
    caps = FORCE_FACT_CHARS if opts.force_converge else ()
    rungs = len(steps) + len(caps)

    def force_cap(s: int) -> int | None:
        return caps[s - len(steps) - 1] if s > len(steps) else None

    cache: dict[int, int] = {}
    # The messages and forms of each rung priced: the answer is one of them, and building it
    # again walks every unit of a long history for what the probe had (a build that collects
    # them costs about what one that only prices does).
    built: dict[int, tuple[list[Message], list[Form]]] = {}
    # The estimates say where the answer is; exact prices near there decide it.
    estimates = Estimates(plan)

    def cost(s: int) -> int:
        s = estimates.same_as(s)
        if s not in cache:
            out, used, cache[s] = plan.build(min(s, len(steps)), force_cap(s))
            built[s] = (out, used)
        return cache[s]

    # If even the top rung (markers only) misses the budget, nothing fits, and forcing would
    # lose facts without making the request acceptable upstream: stop at the last rung that
    # keeps them (the chain may still escalate). System/developer messages, the head and the
    # last messages are never rewritten, so when they alone miss the budget no rung is priced;
    # when they nearly do, the top rung is priced first (a climb would likely be wasted).
    floor = base + sum(forms.costs[i] for i in fixed)
    hopeless = floor > config.budget or (
        floor * 5 >= config.budget * 4 and cost(rungs) > config.budget
    )

    def search(target: int) -> int | None:
        close = target // CLOSE_ENOUGH
        return search_guided(cost, rungs, target, estimates.first_within, estimates.at, close=close)

    chosen = None if hopeless else search(config.limit)
    if chosen is None and not hopeless:
        # The target is out of reach. The rung that keeps the most under the budget would be
        # over it again after the next turn or two, and every compaction event breaks the
        # prompt cache: go as far as the ladder goes with facts kept (what later turns grow
        # from, replaying it), and force only what the budget needs.
        if cost(len(steps)) <= config.budget:
            chosen = len(steps)
        elif cost(rungs) <= config.budget:
            chosen = search(config.budget)
    chosen = len(steps) if chosen is None else estimates.same_as(chosen)
    cap = force_cap(chosen)
    out, used = built[chosen] if chosen in built else plan.build(min(chosen, len(steps)), cap)[:2]
    if cap is not None and chosen > len(steps) + 1:
        finer = _finer_cap(plan, cap, caps[chosen - len(steps) - 2], out, config)
        if finer != cap:
            filled, filled_used, _ = plan.build(len(steps), finer)
            if config.count_tokens(filled) <= config.limit:
                out, used = filled, filled_used
    if 0 < chosen <= len(steps):
        out, used = _fill(plan, chosen, config, out, used)
    digest = forms.source_digest()
    if not used:
        return CompactionResult(messages=list(messages), source_digest=digest), cuttable
    levels = {step.level for step in steps[:chosen]} | ({FORCED} if chosen > len(steps) else set())
    return CompactionResult(
        messages=out,
        source_digest=digest,
        covered_through=max(f.end for f in used) - 1,
        verbatim={f.ref: list(messages[f.start : f.end]) for f in used},
        limitations=[_LIMITATIONS[lv] for lv in sorted(levels)],
    ), cuttable
