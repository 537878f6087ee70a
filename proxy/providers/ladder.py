"""The engine's ladder: in which order messages lose detail, from what they hold and how recent.

Every message that may change gets a keep key: how far along the conversation it is (0 for the
oldest, 1 for the newest) plus, for tool results, how relevant it is per character: BM25 of its
terms against the last user message and the final units, and the weight of the terms the
assistant's next message takes up from it (its uptake), each over its length. An observation
that what the conversation now talks about no longer mentions is stale, whatever its age, and a
file view the agent is still working on is not; an output the agent acted on (quoted, edited,
named) holds what it found, one it passed over (a format error, a listing) does not.
Conversation prose is ordered by age alone: it is a narrative whose specific items (names,
numbers) matter wherever they are, and its fact lists keep them.

The ladder then climbs, lowest key first: every stale tool output is masked (head and tail
kept: the cheapest loss), then each message in turn is summarized and reduced to its facts, and
a unit is dropped into a stub once its last message has been reduced. The units holding the
final tool results come last, level by level (cutting them is the last resort).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import NamedTuple

from proxy.providers.base import Message
from proxy.providers.engine_forms import DROPPED, FACTS, MASKED, SUMMARY
from proxy.providers.relevance import Relevance, add_terms, term_set
from proxy.providers.units import Unit

# What relevance adds to a tool result's key at most (age adds at most 1): a relevant output
# outlives every irrelevant one, however recent.
RELEVANCE_WEIGHT = 6.0
# Characters added to a message's length before dividing its relevance by it, so a two-line
# output sharing one query term does not outrank a file view full of them.
LENGTH_SMOOTHING = 1000
# What a tool result's uptake weighs beside its relevance to the recent turns (each is taken
# over its largest value first).
UPTAKE_WEIGHT = 1.0


def reactions(messages: Sequence[Message]) -> dict[int, int]:
    """Per tool result, the first assistant message after it (what the agent made of it)."""
    out: dict[int, int] = {}
    waiting: list[int] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            waiting.append(i)
        elif role == "assistant" and waiting:
            out.update(dict.fromkeys(waiting, i))
            waiting = []
    return out


class Step(NamedTuple):
    """One climb of the ladder: `message` to `level`, or (DROPPED) unit `unit` dropped.
    (A tuple: a long history has thousands of steps, and frozen dataclasses are slow to make.)"""

    unit: int
    level: int
    message: int = -1


def keep_keys(
    messages: Sequence[Message],
    texts: Sequence[str],
    query: Sequence[int],
    taken: dict[int, set[str]] | None = None,
    reaction: Mapping[int, int] | None = None,
) -> tuple[list[float], dict[str, float]]:
    """Per message, how long it should keep its detail (higher: longer), and the query's terms
    that older tool results share, with their weights (inverse document frequency over the tool
    results). `texts` are the messages' texts (with their tool-call arguments), `query` the
    indices of the recent turns; they must hold the texts of the tool results, the query and
    the `reactions` to the tool results. `taken`, if given, is filled with the terms each
    older tool result's reaction took up from it; `reaction` is `reactions(messages)` where the
    caller has it already.

    A tool result of the query itself is recent already and matches itself: it gets no
    relevance, and its own terms weigh only where an older result shares them. Terms are
    counted only where they are needed: in the tool results and the query."""
    n = len(messages)
    keys = [i / max(n - 1, 1) for i in range(n)]
    recent = set(query)
    older = [i for i, m in enumerate(messages) if m.get("role") == "tool" and i not in recent]
    if not older:
        return keys, {}
    documents = [term_set(texts[i]) for i in older]
    wanted: set[str] = set()
    for i in query:
        add_terms(wanted, texts[i])
    relevance = Relevance(documents, wanted)
    density = [relevance.score(d) / (len(texts[i]) + LENGTH_SMOOTHING) for d, i in enumerate(older)]
    if reaction is None:
        reaction = reactions(messages)
    reacted: dict[int, set[str]] = {}
    uptake = []
    for d, i in enumerate(older):
        j = reaction.get(i)
        if j is not None and j not in reacted:
            reacted[j] = term_set(texts[j])[0]
        shared = documents[d][0] & reacted[j] if j is not None else set()
        if taken is not None:
            taken[i] = shared
        uptake.append(relevance.weight_sum(shared) / (len(texts[i]) + LENGTH_SMOOTHING))
    top_density, top_uptake = max(density), max(uptake)
    if top_uptake > 0:
        density = [
            (x / top_density if top_density > 0 else 0.0) + UPTAKE_WEIGHT * u / top_uptake
            for x, u in zip(density, uptake, strict=True)
        ]
    top = max(density)
    if top > 0:
        for d, i in enumerate(older):
            keys[i] += RELEVANCE_WEIGHT * density[d] / top
    return keys, relevance.idf


def ladder(
    units: Sequence[Unit],
    messages: Sequence[Message],
    keys: Sequence[float],
    *,
    fixed: frozenset[int],
    can_drop: Sequence[bool],
    last: frozenset[int] = frozenset(),
) -> list[Step]:
    """The steps, least lossy first (see the module docstring)."""
    unit_of = {i: u for u, unit in enumerate(units) for i in unit.indices()}
    final = {unit_of[i] for i in last}
    movable = [i for i in range(len(messages)) if i not in fixed and unit_of[i] not in final]
    # By key, ties in message order: the sort is stable and `movable` ascends.
    movable.sort(key=keys.__getitem__)
    is_tool: Callable[[int], bool] = lambda i: messages[i].get("role") == "tool"  # noqa: E731
    steps = [Step(unit_of[i], MASKED, i) for i in movable if is_tool(i)]
    left = Counter(unit_of[i] for i in movable)
    # A long history has thousands of steps: made as tuples of their class directly (what
    # `Step(...)` does through a Python-level `__new__`).
    make = partial(tuple.__new__, Step)
    for i in movable:
        u = unit_of[i]
        steps += (make((u, SUMMARY, i)), make((u, FACTS, i)))
        left[u] -= 1
        if not left[u] and can_drop[u]:
            steps.append(make((u, DROPPED, -1)))
    tail = [i for u in sorted(final) for i in units[u].indices() if i not in fixed]
    for level in (MASKED, SUMMARY, FACTS):
        steps += [Step(unit_of[i], level, i) for i in tail if level != MASKED or is_tool(i)]
    steps += [Step(u, DROPPED) for u in sorted(final) if can_drop[u]]
    return steps
