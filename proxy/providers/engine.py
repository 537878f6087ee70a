"""The `engine` provider: keep what a model can use, with its context, cheapest loss first.

Five principles, each a stage a reviewer can read on its own:

1. **Lines and sentences are the unit of keeping** (`pieces.py`). A rewritten message keeps
   whole lines of code and output, whole sentences of prose, whole JSON members, joined where
   they were adjacent; an ellipsis marks each gap, and a marker heads the message naming its
   reference and how much it stood for (the original comes back through restore and the
   expand tool). Runs of whole units that keep nothing become one stand-in. Nothing is ever
   re-worded into a list of terms.
2. **Recency gradient** (`_weights`, `_working_set`). Every piece's value is multiplied by how
   new its unit is; the newest pieces of the last `recency_turns` user turns, up to a fifth of
   the room (the target less what must stay: the working set; whole pieces, none said again
   later), count many times more, so they are the last to lose anything. Sized by the room,
   not the target: where what must stay takes most of a small target, a fifth of the target
   was all the room, and the engine kept only the newest lines, like dropping the oldest
   messages.
3. **Redundancy and supersession** (`salience.said_later`, `_superseded`). A line said again
   later (a newer view of the same file, a repeated error template) is worth nothing where it
   stands first, and the output of a call that is made again later is worth a tenth. An id,
   number or path that what stays already holds (the user's and the model's messages that are
   never rewritten, and the working set) adds nothing to a piece elsewhere: what stays carries
   it. Names are not discounted so:
   a name recurs as the topic of what is said about it, an id is the same fact wherever it
   stands.
4. **Salience** (`salience.Scorer`). Pieces are worth their specificity (rare ids, numbers,
   dates, paths, URLs, names, quoted titles), plus a little for being there at all;
   relevance to the tail (BM25 against the last user message and the newest exchanges) is an
   option, off by default: the tail itself is kept whole and the working set holds what it
   works on, and on every corpus, dev and held-out, weighing relevance kept no more facts in
   context (up to 5 points fewer). A tool's output counts a quarter (`RAW`): it is what the
   user and the model read, and their own turns after it say what mattered in it.
5. **Fill the budget** (`selection.py`). Pieces are kept best value per token first until the
   target is reached, counted exactly and adjusted; then the later pieces that still fit in
   the room left (`_fill`: the piece that stopped the ranking may be one long line while short
   ones fit beside it). A request that can fit does. The final tool results are cut (head and
   tail) only when nothing else makes it fit.

System and developer messages, the head (`keep_head`), the last user message and the final
message are never touched; roles, tool-call ids, names and content types never change. Same
input, same output bytes.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.providers import pieces
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
    option,
    parse_options,
)
from proxy.providers.rendering import LABEL_TOKENS, Layout, Rendered, render
from proxy.providers.salience import Scorer, exact_terms, said_later
from proxy.providers.selection import NEAR, Pick, Text, apply, rank
from proxy.providers.units import (
    Unit,
    common_suffix,
    last_index,
    message_text,
    protection,
    recency_start,
    split_units,
)


@dataclass(frozen=True)
class EngineOptions:
    """The engine's `extra_config` keys (unknown keys are rejected)."""

    preserve: tuple[str, ...] = option(
        ("system", "developer"), doc="roles whose messages are never rewritten"
    )
    working_set: float = option(
        0.2,
        above=0.0,
        maximum=1.0,
        doc="share of the room (the target less what must stay) the newest pieces of the last "
        "recency_turns turns may fill first",
    )
    relevance: float = option(
        0.0, minimum=0.0, doc="weight of relevance to the tail beside specificity (0: off)"
    )


# Value of a piece for being there at all, per token: with nothing specific in it, age decides.
PRESENCE = 0.1
# The working set counts this many times more than the newest piece outside it.
WORKING_SET_WEIGHT = 10.0
# Outside the working set, the newest unit counts this many times more than the oldest.
AGE_SPAN = 1.0
# The output of a call made again later (same tool, same arguments) keeps this share of its
# value: the later output says what it says now.
SUPERSEDED = 0.1
# A line of a tool's output counts this share of a line the user or the model wrote: the output
# is raw material the turns after it read, and they say in their own words what mattered in it
# (on coding-agent runs, what later tool calls pass is 2-7 times denser in the model's own
# messages than in the outputs they read).
RAW = 0.25
# A piece repeated later keeps this share of its value (it may still serve as context).
REPEATED = 0.02
# Pieces shorter than this (non-space characters) are never counted as repeated: a brace, a
# blank line, `else:` are the context of their neighbours, not content said twice.
REPEAT_MIN_CHARS = 12
# How many exact counts the fit may take, and how many of them follow the estimates before
# it bisects.
FIT_ROUNDS = 12
GUESSES = 4
# How many exact counts filling the room after the ranking's prefix may take.
FILL_ROUNDS = 3
# How many times the last resort may cut the final tool results again.
CUT_ROUNDS = 4
# A result at least this share of the target is close enough.
CLOSE = 0.97
# How many newest units and tail messages form the query for relevance.
TAIL_UNITS = 3


class EngineProvider(ContextProvider):
    """Keeps the most valuable lines and sentences, whole, newest and rarest first."""

    option_schema = EngineOptions

    @property
    def name(self) -> str:
        """Registry name."""
        return "engine"

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Reject unknown or bad `extra_config` keys at start-up."""
        parse_options(EngineOptions, options)

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        """Compact `messages` to about `config.limit` tokens."""
        return compact(messages, config, parse_options(EngineOptions, config.extra_config))


def compact(
    messages: list[Message], config: CompressionConfig, opts: EngineOptions
) -> CompactionResult:
    """The engine algorithm with explicit options (what `EngineProvider.compress` runs)."""
    units = split_units(messages)
    prot = protection(messages, units, config.keep_head, 0)
    fixed = set(prot.hard | prot.head)
    fixed |= {i for i, m in enumerate(messages) if m.get("role") in opts.preserve}
    layout = Layout(messages, units, frozenset(fixed), config)
    digest = layout.source_digest()
    # A request adds its messages' costs to its priming and tool schemas: the layout has them.
    if layout.base + sum(layout.costs) <= config.limit:
        return CompactionResult(messages=list(messages), source_digest=digest)
    texts = _texts(messages, units, layout, opts, config)
    picks = rank(texts, LABEL_TOKENS)
    rendered = _fit(layout, texts, picks, config)
    if rendered is None:
        apply(texts, picks, 0)
        rendered = render(layout, texts, short=True)
        rendered.messages, rendered.verbatim = _cut_final(
            layout, rendered.messages, rendered.verbatim, config
        )
    out, verbatim = rendered.messages, rendered.verbatim
    unchanged = common_suffix(messages, out)
    if unchanged == len(messages):
        return CompactionResult(messages=list(messages), source_digest=digest)
    return CompactionResult(
        messages=out,
        source_digest=digest,
        covered_through=len(messages) - unchanged - 1,
        verbatim=verbatim,
        limitations=["older lines and sentences cut, the rest kept verbatim"],
    )


def _cut_final(
    layout: Layout,
    out: list[Message],
    verbatim: dict[str, list[Message]],
    config: CompressionConfig,
) -> tuple[list[Message], dict[str, list[Message]]]:
    """The last resort: the final tool results cut head and tail (never dropped) until the
    request is within the budget, asking for more each time a cut's own count falls short."""
    ask = config.count_tokens(out) - config.budget
    cut, cut_verbatim = out, verbatim
    for _ in range(CUT_ROUNDS):
        if ask <= 0:
            break
        cut, cut_verbatim = layout.cut_final(list(out), dict(verbatim), ask)
        left = config.count_tokens(cut) - config.budget
        if left <= 0:
            break
        ask += left + 1
    return cut, cut_verbatim


def _fit(
    layout: Layout, texts: list[Text], picks: list[Pick], config: CompressionConfig
) -> Rendered | None:
    """The rendering of the longest prefix of the ranking within the target: found on the
    renderings' own prices (exact but for stand-ins, whose lines are priced apart, an upper
    bound), guessed from the estimates, corrected by how far off they were, then bisected;
    checked by one exact count, and walked back if that is over. None when not even the floor
    is within the target."""
    base = layout.base  # priming and tool schemas: a request adds its messages
    renderings: dict[int, Rendered] = {}  # the latest one within the target, to check exactly

    def tokens(n: int) -> int:
        apply(texts, picks, n)
        rendered = render(layout, texts, short=False)
        got = base + sum(rendered.costs)
        if got <= config.limit:
            renderings.clear()
            renderings[n] = rendered
        return got

    floor = tokens(0)
    if floor > config.limit:
        return None
    room = config.limit - floor
    spent = [p[2] for p in picks]
    fits, over = 0, len(picks) + 1  # a prefix known to fit, one known not to
    scale = 1.0
    for step in range(FIT_ROUNDS):
        if step < GUESSES:
            # Where the estimates, corrected by how far off they were so far, put the target.
            guess = bisect.bisect_right(spent, room / scale)
            guess = min(max(guess, fits + 1), over - 1)
        else:
            guess = (fits + over) // 2
        if guess <= fits:
            break
        got = tokens(guess)
        if got <= config.limit:
            fits = guess
            if got >= CLOSE * config.limit:
                break
        else:
            over = guess
        if spent[guess - 1] > 0 and got > floor:
            scale = (got - floor) / spent[guess - 1]
    while True:
        rendered = renderings.pop(fits, None)
        if rendered is None:
            apply(texts, picks, fits)
            rendered = render(layout, texts, short=False)
        got = config.count_tokens(rendered.messages)
        if got <= config.limit:
            return _fill(
                layout, texts, picks, fits, rendered, room=config.limit - got, config=config
            )
        if fits == 0:
            return None
        fits -= max(fits // 100, 1)  # the stand-ins' lines priced apart fell short


def _fill(
    layout: Layout,
    texts: list[Text],
    picks: list[Pick],
    fits: int,
    rendered: Rendered,
    *,
    room: int,
    config: CompressionConfig,
) -> Rendered:
    """Fill the room the ranking's prefix leaves short of CLOSE to the target: the later
    picks that still fit, best first (the pick that stopped the prefix may be one long line
    while a dozen short ones fit beside it). Checked by one exact count; when that is over,
    the estimates are scaled by how far they fell short (they leave out the ellipses of the
    gaps a pick opens) and the picks chosen again; the prefix alone when none fits."""
    if room <= (1 - CLOSE) * config.limit:
        return rendered  # close enough: filling the last few tokens costs a recount
    used = config.limit - room  # what the prefix's rendering counts
    scale = 1.0  # how far the estimates fell short of the count
    for _ in range(FILL_ROUNDS):
        extra: list[int] = []
        estimate = 0.0
        left = room * CLOSE / scale
        for j in range(fits, len(picks)):
            cost = picks[j][2] - (picks[j - 1][2] if j else 0.0)
            if cost <= left:
                extra.append(j)
                left -= cost
                estimate += cost
        if not extra:
            break
        apply(texts, [picks[j] for j in [*range(fits), *extra]], fits + len(extra))
        candidate = render(layout, texts, short=False)
        got = config.count_tokens(candidate.messages)
        if got <= config.limit:
            return candidate
        scale = (got - used) / max(estimate, 1.0)
    return rendered


def _texts(
    messages: list[Message],
    units: list[Unit],
    layout: Layout,
    opts: EngineOptions,
    config: CompressionConfig,
) -> list[Text]:
    """Every rewritable message's pieces, priced and valued."""
    unit_of = {i: u for u, unit in enumerate(units) for i in unit.indices()}
    bodies = {
        i: _body(messages[i], foldable=not layout.stays(unit_of[i])) for i in layout.rewritable()
    }
    rewritable = [i for i, body in bodies.items() if body.strip()]
    # Bodies repeat (the same error, the same file view): each distinct one is cut once.
    cut: dict[str, tuple[list[tuple[int, int]], list[str]]] = {}
    for i in rewritable:
        if bodies[i] not in cut:
            body_spans = pieces.split(bodies[i])
            cut[bodies[i]] = (body_spans, [bodies[i][s:e] for s, e in body_spans])
    spans = {i: cut[bodies[i]][0] for i in rewritable}
    piece_texts = {i: cut[bodies[i]][1] for i in rewritable}
    seen = {
        " ".join(line.split())
        for i in layout.fixed
        for line in message_text(messages[i]).splitlines()
    }
    flags = said_later((piece_texts[i] for i in rewritable), seen, REPEAT_MIN_CHARS)
    repeated = dict(zip(rewritable, flags, strict=True))
    flat = [p for i in rewritable for p in piece_texts[i]]
    # Per piece, in arrays (the garbage collector does not walk them): its estimated tokens and
    # the message it is cut from.
    per_char = {i: layout.costs[i] / max(len(bodies[i]), 1) for i in rewritable}
    costs = array("d", (len(p) * per_char[i] for i in rewritable for p in piece_texts[i]))
    owners = array("q", (i for i in rewritable for _ in piece_texts[i]))
    # The room: what the target leaves once the request's priming and what must stay are paid.
    room = config.limit - layout.base - sum(layout.costs[i] for i in layout.fixed)
    recent = recency_start(messages, config.recency_turns)
    said = bytearray(f for i in rewritable for f in repeated[i])
    working = _working_set(owners, costs, said, recent, opts.working_set * max(room, 0))
    # What stays holds its ids, numbers and paths: a piece elsewhere gains nothing by them.
    # (Not a tool's output that stays: it may be megabytes of log, and scanning it cost a
    # quarter more CPU on such a request for no fact more on any corpus.)
    carried = exact_terms(
        _body(messages[i], foldable=True)
        for i in layout.fixed
        if messages[i].get("role") not in ("system", "developer", "tool")
    )
    carried |= exact_terms(flat[n] for n in working)
    tail = _tail(messages, units, layout)
    query = "\n".join(_body(messages[i], foldable=True) for i in tail)
    focus = message_text(messages[last_index(messages, "user")])
    # What the user and the model wrote: their messages' text, not a tool's output and not the
    # arguments of their tool calls (JSON, scripts).
    text_end = {
        i: len(message_text(messages[i])) for i in rewritable if messages[i].get("role") != "tool"
    }
    written = bytearray(s < text_end.get(i, -1) for i in rewritable for s, _ in spans[i])
    salient = Scorer(flat, query, focus, written).scores(opts.relevance, carried, working)
    weights = _weights(units)
    superseded = _superseded(messages, units)
    texts = []
    n = 0
    for i in rewritable:
        weight = weights[unit_of[i]] * (SUPERSEDED if i in superseded else 1.0)
        if messages[i].get("role") == "tool":
            weight *= RAW
        tokens, values, short = array("d"), array("d"), bytearray()
        for k, piece in enumerate(piece_texts[i]):
            worth = PRESENCE * costs[n] + salient[n]
            worth *= weight * (REPEATED if repeated[i][k] else 1.0)
            if n in working:
                worth *= WORKING_SET_WEIGHT
            tokens.append(costs[n])
            values.append(worth)
            short.append(len(piece.strip()) <= NEAR)
            n += 1
        texts.append(Text(i, bodies[i], spans[i], tokens, values, short, layout.costs[i]))
    return texts


def _body(message: Message, *, foldable: bool) -> str:
    """What a message's pieces are cut from: its text, and in a unit that may be folded into a
    stand-in, its tool calls as `name arguments` (what a later turn may need of them; nothing
    between the two, so an argument keeps the call's name as its context)."""
    text = message_text(message)
    calls = message.get("tool_calls") if foldable else None
    if not isinstance(calls, list):
        return text
    written = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            written.append(f"{function.get('name')} {function.get('arguments')}")
    return "\n".join([text, *written]) if text else "\n".join(written)


def _tail(messages: list[Message], units: list[Unit], layout: Layout) -> list[int]:
    """What the conversation is about now: the last user message, the final unit and the
    newest TAIL_UNITS units (their tool calls too: what the agent just asked for)."""
    recent = [u for u in units if u.kind != "system"][-TAIL_UNITS:]
    tail = {i for u in recent for i in u.indices()}
    tail |= {i for i in layout.fixed if messages[i].get("role") not in ("system", "developer")}
    return sorted(tail)


def _weights(units: list[Unit]) -> list[float]:
    """Per unit, how much its pieces' value counts for its age: from 1 (oldest) to
    1 + AGE_SPAN (newest)."""
    ages = [u for u, unit in enumerate(units) if unit.kind != "system"]
    weights = [1.0] * len(units)
    for age, u in enumerate(ages):
        weights[u] = 1.0 + AGE_SPAN * age / max(len(ages) - 1, 1)
    return weights


def _working_set(
    owners: array[int], costs: array[float], said: bytearray, recent: int, room: float
) -> set[int]:
    """The newest pieces of the recency window (`recency_turns`), `room` tokens of them at
    most (`owners`: each piece's message, `costs`: its tokens): what the conversation is working
    on, the last to lose anything (they count WORKING_SET_WEIGHT times more). It ends before
    the first piece that does not fit whole: on a short chat a fifth of the room is less than
    one message, and taking that message whole gave it all the room the older facts needed.
    A piece said again later (`said`: a banner, a prompt, an error template the final output
    repeats) is not in it and costs it nothing: the later copy carries it."""
    out: set[int] = set()
    for n in range(len(owners) - 1, -1, -1):
        if owners[n] < recent:
            break
        if said[n]:
            continue
        if costs[n] > room:
            break
        room -= costs[n]
        out.add(n)
    return out


def _superseded(messages: list[Message], units: list[Unit]) -> set[int]:
    """Tool results of a call (tool name and arguments) that is made again later."""
    later: set[bytes] = set()
    out: set[int] = set()
    for unit in reversed(units):
        calls = messages[unit.start].get("tool_calls")
        if unit.kind != "assistant" or not isinstance(calls, list):
            continue
        keys = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                keys.append(orjson.dumps([function.get("name"), function.get("arguments")]))
        if keys and all(k in later for k in keys):
            out.update(i for i in unit.indices() if messages[i].get("role") == "tool")
        later.update(keys)
    return out
