"""The engine's rungs: the request a ladder rung stands for, built exactly or estimated.

`Plan.build(s)` writes (or only prices) the messages at rung s: every step up to s applied,
consecutive dropped units folded into one stub, consecutive rewritten same-role messages merged.
`Estimates` prices rungs from the length of what their forms will say, climbing lazily; the
first few forms of each kind are written and counted so the rest are priced with the
conversation's own correction (fact lists are sparse in chat and dense in code).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.providers.base import Message
from proxy.providers.engine_forms import DROPPED, FACTS, Form, Forms
from proxy.providers.ladder import Step
from proxy.providers.units import Unit

# Single-message forms written and counted to calibrate the estimates.
CALIBRATION = 4
# Stubs written and counted to calibrate theirs: one. Every later stub folds more units, so an
# early stub's miss says little about the stubs near the answer (the search's first probe
# corrects for what the estimates miss), and each one written costs the fact scan and packing of
# every message it reads (~5 % of the engine's CPU on the chat corpora with four).
STUB_CALIBRATION = 1


@dataclass
class Plan:
    messages: Sequence[Message]
    units: Sequence[Unit]
    fixed: frozenset[int]
    steps: list[Step]
    forms: Forms
    merge: bool
    base: int
    override: dict[int, Form] = field(default_factory=dict)
    """Forms that replace a message's form at its level (the budget's slack filled)."""

    def build(
        self, s: int, force_cap: int | None, collect: bool = True
    ) -> tuple[list[Message], list[Form], int]:
        """The messages at rung `s`, the forms used, and their estimated request tokens.

        Without `collect` only the tokens are computed (what a search probe needs)."""
        levels = [0] * len(self.messages)
        dropped = [False] * len(self.units)
        touched: set[int] = set()  # the units a step up to s changes (every step names its unit)
        for step in self.steps[:s]:
            touched.add(step.unit)
            if step.level == DROPPED:
                dropped[step.unit] = True
            else:
                levels[step.message] = step.level
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
                span = (run[0].start, run[-1].end)
                stub = self.forms.stub(*span, force_cap)
                if stub is not None:
                    flush_pending()
                    emit(stub, stub.start, stub.end)
                else:
                    for unit in run:
                        emit_unit(unit, FACTS)
                run.clear()

        def emit_unit(unit: Unit, floor: int = 0) -> None:
            for i in unit.indices():
                form = None
                level = floor or levels[i]
                if i not in self.fixed and level:
                    if force_cap is None:
                        form = self.override.get(i) or self.forms.single(i, level)
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
            if u not in touched:
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
            if dropped[u]:
                run.append(unit)
                continue
            flush_run()
            emit_unit(unit)
        flush_gap()
        flush_run()
        flush_pending()
        return out, used, tokens


class Estimates:
    """Estimated request tokens rung by rung, climbed lazily.

    Each step writes its unit's forms once (what the exact search then reuses) and prices them
    from their length, not by counting tokens; merges are not priced."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.now = list(plan.forms.costs)
        self.totals = [plan.base + sum(self.now)]
        self.lowest = list(self.totals)
        """Per rung climbed, the lowest estimate up to it (falling: what `first_within` bisects)."""
        # Dropped units join their dropped neighbours in one stub: each run of them is known by
        # its first and last unit (`ends` maps each to the other), with its fact characters and
        # estimated cost kept under its first unit.
        self.ends: dict[int, int] = {}
        self.run_chars: dict[int, int] = {}
        self.run_cost: dict[int, int] = {}
        # How far off the length-based prices are in this conversation (fact lists are sparse
        # in chat and dense in code): the first few forms of each kind are written and counted,
        # and the rest priced by the mean of exact over estimated.
        self.misses: dict[bool, list[float]] = {False: [], True: []}
        self.miss_sums: dict[bool, float] = {}
        self.changes = [True]
        """Per rung, whether its step is estimated to change anything (a message that has no
        smaller form at a level stays as it was)."""

    def at(self, s: int) -> int | None:
        """Estimated cost of rung s (None above the last step: forced rungs are not estimated)."""
        if s > len(self.plan.steps):
            return None
        while len(self.totals) <= s:
            self._climb()
        return self.totals[s]

    def first_within(self, target: int) -> int:
        """The first rung whose estimated cost is within target (the last step's if none)."""
        lowest = self.lowest
        if lowest[-1] <= target:  # within the rungs climbed: the first whose lowest is within
            return bisect.bisect_left(lowest, -target, key=operator.neg)
        # Every rung climbed is over the target: the answer is the first one climbed next that
        # is not (climbed here directly, not through `at`, one call a rung).
        totals, last = self.totals, len(self.plan.steps)
        while len(totals) <= last:
            self._climb()
            if totals[-1] <= target:
                return len(totals) - 1
        return last

    def _climb(self) -> None:
        # Run once per rung climbed (thousands in a long history): attributes read once.
        plan, forms, totals = self.plan, self.plan.forms, self.totals
        step = plan.steps[len(totals) - 1]
        if step.level == DROPPED:
            new, old = self._drop(step.unit)
            changed = True
        else:
            i = step.message
            new = cost = forms.costs[i]
            if i not in plan.fixed:
                estimate = forms.estimate_single(i, step.level)
                if estimate < cost:
                    form = None
                    if len(self.misses[False]) < CALIBRATION:
                        form = forms.single(i, step.level)
                    new = self._calibrated(False, estimate, form.tokens if form else None)
                    new = min(new, cost)
            old = self.now[i]
            self.now[i] = new
            changed = new != old
        total = totals[-1] + new - old
        totals.append(total)
        lowest = self.lowest
        lowest.append(total if total < lowest[-1] else lowest[-1])
        self.changes.append(changed)

    def same_as(self, s: int) -> int:
        """The lowest rung with the same messages as rung s, as far as the estimates know: steps
        that change nothing are skipped, so the search never builds the same request twice."""
        while 0 < s <= len(self.plan.steps):
            self.at(s)
            if self.changes[s]:
                break
            s -= 1
        return s

    def _calibrated(self, stub: bool, estimate: int, exact: int | None) -> int:
        """The exact price if there is one (remembering how far off the estimate was), else the
        estimate corrected by the mean miss so far."""
        misses = self.misses[stub]
        if exact is not None:
            misses.append(exact / max(estimate, 1))
            self.miss_sums[stub] = sum(misses)  # summed once, not at every rung priced
            return exact
        return round(estimate * self.miss_sums[stub] / len(misses)) if misses else estimate

    def _drop(self, u: int) -> tuple[int, int]:
        """(new, old) estimated cost of dropping unit u into the run of its dropped neighbours."""
        plan, forms = self.plan, self.plan.forms
        unit = plan.units[u]
        old = sum(self.now[i] for i in unit.indices())
        for i in unit.indices():
            self.now[i] = 0
        first, last, chars = u, u, forms.fact_chars_of(unit.start, unit.end)
        if u - 1 in self.ends:
            first = self.ends.pop(u - 1)
            self.ends.pop(first, None)
            chars += self.run_chars.pop(first)
            old += self.run_cost.pop(first)
        if u + 1 in self.ends:
            last = self.ends.pop(u + 1)
            self.ends.pop(last, None)
            chars += self.run_chars.pop(u + 1)
            old += self.run_cost.pop(u + 1)
        self.ends[first], self.ends[last] = last, first
        start, end = plan.units[first].start, plan.units[last].end
        exact = None
        if len(self.misses[True]) < STUB_CALIBRATION:
            stub = forms.stub(start, end)
            exact = stub.tokens if stub is not None else None
        new = self._calibrated(True, forms.estimate_stub(start, end, chars), exact)
        self.run_chars[first], self.run_cost[first] = chars, new
        return new, old


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
