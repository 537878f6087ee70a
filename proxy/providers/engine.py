"""The `engine` provider: the context-compression-engine behaviour, done right for OpenAI requests.

Every unit (a user message, or an assistant message with all its tool results) that may change
climbs one ladder, oldest units first and the recency window last: summarized (hard content kept,
exact or fuzzy duplicates replaced by a readable reference), then reduced to its facts, then
dropped into a stub that keeps the run's facts; the last rungs (`force_converge`) leave short
reference markers with fewer and fewer facts, then the markers alone. The least lossy rung that
fits the target is found in two passes: one climb prices rungs from the length of what their
forms say, then a few exact probes near the estimate settle it (only the forms of those rungs
are counted with tiktoken). Messages of different roles, `name`s or `tool_call_id`s are never
merged; system/developer messages, the head, the last user message and the final message are
never touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
)
from proxy.providers.rung_search import search_guided
from proxy.providers.units import (
    Unit,
    droppable,
    final_tool_results,
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


def _recent(units: Sequence[Unit], recent: frozenset[int]) -> frozenset[int]:
    """The recency window, narrowed to its last RECENT_UNITS units."""
    inside = [u for u in units if any(i in recent for i in u.indices())]
    if len(inside) <= RECENT_UNITS:
        return recent
    start = inside[-RECENT_UNITS].start
    return frozenset(i for i in recent if i >= start)


@dataclass(frozen=True)
class _Step:
    unit: int
    level: int


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


def _ladder(
    units: Sequence[Unit],
    messages: Sequence[Message],
    *,
    fixed: frozenset[int],
    recent: frozenset[int],
    can_drop: Sequence[bool],
    last: frozenset[int] = frozenset(),
) -> list[_Step]:
    """Outside the recency window first, then inside it, then the units holding the `last`
    messages (the final tool results, when only cutting them can fit); each part oldest first,
    level by level: tool results masked, then summaries, facts, drops."""
    movable = [u for u, unit in enumerate(units) if any(i not in fixed for i in unit.indices())]
    final = [u for u in movable if any(i in last for i in units[u].indices())]
    outside = [u for u in movable if not any(i in recent for i in units[u].indices())]
    taken = set(outside) | set(final)
    inside = [u for u in movable if u not in taken]
    steps: list[_Step] = []
    for part in (outside, inside, final):
        for level in (MASKED, SUMMARY, FACTS, DROPPED):
            for u in part:
                if level == DROPPED and not can_drop[u]:
                    continue
                has_tool = any(messages[i].get("role") == "tool" for i in units[u].indices())
                if level != MASKED or has_tool:
                    steps.append(_Step(u, level))
    return steps


@dataclass
class _Plan:
    messages: Sequence[Message]
    units: Sequence[Unit]
    fixed: frozenset[int]
    steps: list[_Step]
    forms: Forms
    merge: bool
    base: int

    def build(
        self, s: int, force_cap: int | None, collect: bool = True
    ) -> tuple[list[Message], list[Form], int]:
        """The messages at rung `s`, the forms used, and their estimated request tokens.

        Without `collect` only the tokens are computed (what a search probe needs)."""
        levels = [0] * len(self.units)
        for step in self.steps[:s]:
            levels[step.unit] = step.level
        out: list[Message] = []
        used: list[Form] = []
        tokens = self.base
        run: list[Unit] = []
        pending: list[Form] = []
        gap: list[int] = []  # start and end of the untouched messages not emitted yet

        def emit(form: Form | None, start: int, end: int) -> None:
            nonlocal tokens
            if form is None:
                if collect:
                    out.extend(self.messages[start:end])
                tokens += self.forms.span_cost(start, end)
            else:
                if collect:
                    out.append(form.message)
                    used.append(form)
                tokens += self.forms.cost(form)

        def flush_gap() -> None:
            if gap:
                emit(None, gap[0], gap[1])
                gap.clear()

        def flush_pending() -> None:
            if len(pending) > 1:
                emit(self.forms.merged(pending), pending[0].start, pending[-1].end)
            elif pending:
                emit(pending[0], pending[0].start, pending[0].end)
            pending.clear()

        def flush_run() -> None:
            if run:
                stub = self.forms.stub(run[0].start, run[-1].end, force_cap)
                if stub is not None:
                    flush_pending()
                    emit(stub, stub.start, stub.end)
                else:
                    for unit in run:
                        emit_unit(unit, FACTS)
                run.clear()

        def emit_unit(unit: Unit, level: int) -> None:
            for i in unit.indices():
                form = None
                if i not in self.fixed and level:
                    if force_cap is None:
                        form = self.forms.single(i, level)
                    else:
                        form = self.forms.forced(i, force_cap)
                if form is not None and self.merge and _mergeable(form, pending):
                    pending.append(form)
                    continue
                flush_pending()
                if form is not None and self.merge and _mergeable(form, []):
                    pending.append(form)
                else:
                    emit(form, i, i + 1)

        for u, unit in enumerate(self.units):
            level = levels[u]
            if not level:
                # Most units of most rungs are untouched: consecutive ones are emitted as one
                # slice with one prefix-sum lookup.
                if gap:
                    gap[1] = unit.end
                else:
                    flush_run()
                    flush_pending()
                    gap.extend((unit.start, unit.end))
                continue
            flush_gap()
            if level == DROPPED:
                run.append(unit)
                continue
            flush_run()
            emit_unit(unit, level)
        flush_gap()
        flush_run()
        flush_pending()
        return out, used, tokens


class _Estimates:
    """Estimated request tokens rung by rung, climbed lazily.

    Each step writes its unit's forms once (what the exact search then reuses) and prices them
    from their length, not by counting tokens; merges are not priced."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.now = [plan.forms.span_cost(unit.start, unit.end) for unit in plan.units]
        self.totals = [plan.base + sum(self.now)]
        self.last_dropped, self.run_chars = -2, 0.0

    def at(self, s: int) -> int | None:
        """Estimated cost of rung s (None above the last step: forced rungs are not estimated)."""
        if s > len(self.plan.steps):
            return None
        while len(self.totals) <= s:
            self._climb()
        return self.totals[s]

    def first_within(self, target: int) -> int:
        """The first rung whose estimated cost is within target (the last step's if none)."""
        s = 0
        while True:
            total = self.at(s)
            if total is None:
                return len(self.plan.steps)
            if total <= target:
                return s
            s += 1

    def _climb(self) -> None:
        plan, forms = self.plan, self.plan.forms
        step = plan.steps[len(self.totals) - 1]
        unit = plan.units[step.unit]
        if step.level == DROPPED:
            continues = step.unit == self.last_dropped + 1
            new, chars = forms.estimate_drop(
                unit.start, unit.end, self.run_chars if continues else None
            )
            self.run_chars = self.run_chars + chars if continues else chars
            self.last_dropped = step.unit
        else:
            new = sum(
                forms.costs[i] if i in plan.fixed else forms.estimate_single(i, step.level)
                for i in unit.indices()
            )
        self.totals.append(self.totals[-1] + new - self.now[step.unit])
        self.now[step.unit] = new


def _mergeable(form: Form, pending: Sequence[Form]) -> bool:
    m = form.message
    if m.get("role") not in ("user", "assistant") or m.get("tool_calls") or m.get("tool_call_id"):
        return False
    if not isinstance(m.get("content"), str) or form.end - form.start != 1:
        return False
    if not pending:
        return True
    last = pending[-1].message
    return (
        last.get("role") == m.get("role")
        and last.get("name") == m.get("name")
        and pending[-1].end == form.start
    )


def compact(
    messages: list[Message], config: CompressionConfig, opts: EngineOptions
) -> CompactionResult:
    """The engine algorithm with explicit options (what `EngineProvider.compress` runs)."""
    units = split_units(messages)
    prot = protection(messages, units, config.keep_head, config.recency_turns)
    fixed = (
        prot.hard
        | prot.head
        | {i for i, m in enumerate(messages) if m.get("role") in opts.preserve}
    )
    can_drop = [
        droppable(u, prot, relaxed=True) and not any(i in fixed for i in u.indices()) for u in units
    ]
    # The last resort: when the final tool results alone keep the request over budget, they may
    # be cut head and tail (never dropped), after everything else has given what it can.
    last = final_tool_results(messages) - (prot.head | {i for i in fixed if i not in prot.hard})
    costs = [config.count_message(m) for m in messages]
    floor = config.count_tokens(messages) - sum(costs) + sum(costs[i] for i in fixed)
    if not last or floor <= config.budget:
        last = frozenset()
    fixed = fixed - last
    steps = _ladder(
        units,
        messages,
        fixed=fixed,
        recent=_recent(units, prot.recent),
        can_drop=can_drop,
        last=last,
    )
    texts = [message_text(m) for m in messages]
    candidates = [i for i in range(len(messages)) if i not in fixed]
    settings = FormSettings(
        opts.summary_ratio, opts.facts_ratio, opts.stub_facts_ratio, opts.max_facts_chars
    )
    forms = Forms(messages, config, settings, _duplicates(texts, candidates, opts))
    base = config.count_tokens(messages) - sum(forms.costs)
    plan = _Plan(messages, units, fixed, steps, forms, opts.merge_consecutive, base)
    caps = FORCE_FACT_CHARS if opts.force_converge else ()
    rungs = len(steps) + len(caps)

    def force_cap(s: int) -> int | None:
        return caps[s - len(steps) - 1] if s > len(steps) else None

    cache: dict[int, int] = {}

    def cost(s: int) -> int:
        if s not in cache:
            cache[s] = plan.build(min(s, len(steps)), force_cap(s), collect=False)[2]
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

    # The estimates say where the answer is; exact prices near there decide it.
    estimates = _Estimates(plan)

    def search(target: int) -> int | None:
        return search_guided(cost, rungs, target, estimates.first_within, estimates.at)

    chosen = None if hopeless else search(config.limit)
    if chosen is None and not hopeless and cost(rungs) <= config.budget:
        chosen = search(config.budget)
    if chosen is None:
        chosen = len(steps)
    out, used, _ = plan.build(min(chosen, len(steps)), force_cap(chosen))
    digest = forms.source_digest()
    if not used:
        return CompactionResult(messages=list(messages), source_digest=digest)
    levels = {step.level for step in steps[:chosen]} | ({FORCED} if chosen > len(steps) else set())
    return CompactionResult(
        messages=out,
        source_digest=digest,
        covered_through=max(f.end for f in used) - 1,
        verbatim={f.ref: list(messages[f.start : f.end]) for f in used},
        limitations=[_LIMITATIONS[lv] for lv in sorted(levels)],
    )
