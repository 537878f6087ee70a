"""The compacted forms of messages the engine provider chooses between, memoized per run.

Levels, from least to most lossy: 1 = summary (or a duplicate reference), 2 = facts only,
3 = dropped into a stub that stands for a run of whole units (with their facts), and the forced
forms: the short reference marker with fewer and fewer facts, down to the marker alone. A form
is offered only if it costs fewer tokens than what it replaces, so no message ever grows.

A form is first a `Draft` (what it will say) and only becomes a message (reference id, marker,
exact token count) when a rung that uses it is priced exactly. The search prices most rungs with
`estimate`, from the draft's length, so the hundreds of forms a long history has are written but
only those near the answer are counted.
"""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from proxy.providers.base import CompressionConfig, Message
from proxy.providers.canonical import canonical_bytes
from proxy.providers.dedup import Duplicate
from proxy.providers.facts import (
    SCAN_CHARS,
    TAG_MESSAGES,
    TextFacts,
    analyze,
    candidates_of,
    facts_within,
    occurs_in,
    pack_salient,
    parse_json,
    scan_spans,
    shape_counts,
    structural_shapes,
    unshown,
)
from proxy.providers.markers import REF_PATTERN, dropped_marker, ref_marker, short_marker
from proxy.providers.prose import preview_parts
from proxy.providers.relevance import LineHits, line_hits, relevant_lines
from proxy.providers.summary import SentenceCache, split_blocks, summarize_text
from proxy.providers.units import message_text, with_text

SUMMARY, FACTS, DROPPED, FORCED, MASKED = 1, 2, 3, 4, 5
# Observation masking (the cheapest loss, first on the ladder): a tool result keeps its head and
# tail, a share of its text up to a cap, then the facts of the cut middle. At SUMMARY and FACTS
# a tool result keeps the short preview instead of an extractive summary (what an agent needs
# back from a stale output is where it was and what it said last).
_MASK_RATIO = 0.3
_MASK_MAX_CHARS = 2400
_SHORT_MASK_CHARS = 400
_MASK_FACTS_CHARS = 240
_SHORT_MASK_LIMIT = _SHORT_MASK_CHARS + _MASK_FACTS_CHARS
# A mask keeps the lines of at most this many terms the agent's next message took up from it.
_TAKEN_TERMS = 12
# Longer messages are masked (head, tail, relevant lines), never summarized.
SUMMARY_MAX_CHARS = 1_000_000
# A stub reads the fact candidates of its messages until it has this many times its room.
STUB_READ = 3
# ... or this many times its room of their text (a sparse chat has few candidates to gather).
STUB_READ_TEXT = 30
# What a character of conversation prose (a message that is no tool result and makes no tool
# call) weighs in a stub's room against one of a tool exchange: prose says its names, numbers
# and dates a few to a sentence, all of them what a later question may ask about, where a tool
# output's facts come dense and its masks and the agent's next message keep the ones acted on.
# (Dev split, stubs at 1.2 against 1.0: aider, chitchat, tau-bench and memory-tests keep more
# at 50 % and 25 %, the agent runs are unchanged.)
PROSE_WEIGHT = 1.2
_SNIPPET = 60
# Capitalized words that start a sentence (at the start of a line or after a sentence mark and a
# blank), of at least _MIN_LEAD letters, that are not among the words most sentences start with:
# a stub lists them after its facts, in at most 1/_LEAD_SHARE of its room (1/_FILL_LEAD_SHARE
# of a stub filling the budget's slack, which no search prices).
# (The place is checked behind the capital, so the search skips to capitals at C speed.)
_LEAD_WORD = re.compile(
    r"([A-Z](?:(?<=^[A-Z])|(?<=[.!?] [A-Z])|(?<=[.!?]  [A-Z]))[a-z]+(?:-[a-z]+)*)\b(?!['\u2019])",
    re.M,
)
_MIN_LEAD = 3
# A lead word the conversation's prose says again, in any case (`Team is me plus 4 engineers`
# ... `the team is now 7`, `Playtesters love it` ... `my playtesters said`), is what it talks
# about and ranks before one said once (`Welcome`, `Absolutely`, `Mainly`: to open a reply).
# Dev split, the lead words holding a probe: memory-tests 10 of 150 said again, 0 of 184 said
# once; memorybank 61 of 1,405 / 0 of 455; chitchat 621 of 8,131 / 24 of 4,208. (Counted as a
# substring of the lowered prose, so `rust` in `trust` counts: a word ranked a tier early,
# never one left out.)
_LEAD_RANK = 4
_LEAD_ONCE_RANK = 5
# Characters of the latest prose a lead word is searched in.
PROSE_SEARCH = 1 << 18
_LEAD_SHARE = 8
_FILL_LEAD_SHARE = 2
# (A coding chat's stub reads its messages' facts newest first, see `Forms._coding`; dev split,
# aider 50 / 40 / 30 / 25 / 20 %: 2,662 / 2,637 / 2,576 / 2,505 / 2,300 -> 2,665 / 2,648 /
# 2,600 / 2,555 / 2,363 of 2,746 probes; taken newest first in every prose stub, chitchat and
# memory-tests lost 1-6 probes, in every stub tau-bench and swe-agent lost up to 10.)
_STARTER_WORDS = """
    The This That These Those There Then Than Their They Them Its It's Here Hey Hi Hello Yes Yeah
    Yep Nope Not Now Also And But Because Since While When Where What Which Who Whom Whose Why How
    Well Just Maybe Perhaps Actually Really Honestly Basically Anyway Sure Okay Thanks Thank
    Please Sorry Great Good Nice Cool Awesome Perfect Wow Haha Lol Let Let's You You're Your Yours
    Our Ours His Her Hers She He Him We We're Mine Some Any All Each Every Most Many Much More
    Other Another Such Both Either Neither None One Two First Second Next Last Finally After
    Before During Until Though Although However Still Even Only Very Too Again Already Always
    Never Often Sometimes Usually Today Tomorrow Yesterday Right Oh Ooh Ah Aw Wait Hmm Hope Love
    Like Can Could Would Should Will Shall May Might Must Did Does Don't Didn't Was Were Are Has
    Have Had Got Get Make Try See Look Think Know Said Say Tell Ask Keep Give Take Use Want
    Need Going Do Don Is Isn't Am Be Been For From With Without Into Onto Over Under About Above
    Below Between Through Of On In At By To As If Or So No Nor Yet Once Instead Otherwise
"""
_STARTERS = frozenset(_STARTER_WORDS.split())
# Fields that cost tokens but carry nothing the summary keeps; the originals hold them.
_DROP_ON_REWRITE = ("reasoning_content", "reasoning", "thinking")
# Estimates: a message's own overhead (3 tokens and its role), the tokens per character of a fact
# list relative to the text it came from, a reference id to price markers with, and the ratio for
# messages without text.
_OVERHEAD = 4
_FACTS_DENSITY = 1.3
_TYPICAL_REF = "5f0e3c9a1b"
_DEFAULT_RATIO = 0.3
_EMPTY: Message = {"role": "user", "content": ""}


@dataclass(frozen=True)
class FormSettings:
    """The engine options that shape forms."""

    summary_ratio: float
    facts_ratio: float
    stub_facts_ratio: float
    max_facts_chars: int


@dataclass(frozen=True)
class Draft:
    """What a replacement for input messages `start .. end-1` will say; `verb` None for the short
    marker, `role` set for a stub (always a plain user/assistant message)."""

    start: int
    end: int
    verb: str | None
    body: str
    role: str | None = None


LATER_FACTS = Draft(-1, -1, None, "")
"""Stands for a message's fact list, priced before it is written."""
Candidate = Draft | None
"""A draft, None for the message's summary or LATER_FACTS for its fact list: those two are
written only when wanted (they are priced before they are written)."""
# Fact lists written and priced exactly before the rest are priced from how full they were.
_CALIBRATION = 4


@dataclass(frozen=True)
class Form:
    """A replacement for input messages `start .. end-1`."""

    message: Message
    start: int
    end: int
    body: str
    """The replacement's text without its marker line (what a merge joins)."""
    ref: str
    tokens: int
    """What the replacement message costs (counted once, when built)."""


def _is_json(text: str) -> bool:
    return text.lstrip()[:1] in ("[", "{") and parse_json(text) is not None


def fact_text(message: Message) -> str:
    """A message's text plus its tool-call names and arguments (where agents keep ids), the
    arguments' escaped line breaks, tabs and quotes as written (an escaped `\\nWait` is no
    fact `nWait`)."""
    calls = message.get("tool_calls")
    if not calls:  # a tool result or plain message (half of an agent run's): its text
        return message_text(message)
    parts = [message_text(message)]
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            arguments = str(fn.get("arguments", ""))
            # (An escaped backslash could be read as part of an escape: left as it is.)
            if "\\" in arguments and "\\\\" not in arguments:
                arguments = _unescaped(arguments)
            parts.append(f"{fn.get('name', '')} {arguments}")
    return "\n".join(p for p in parts if p)


def _unescaped(arguments: str) -> str:
    """JSON text with its common string escapes (line break, tab, quote) undone, at C speed."""
    return arguments.replace("\\n", "\n").replace("\\t", "\t").replace('\\"', '"')


def _has_ref(text: str) -> bool:
    """Whether text holds a reference marker (searched a piece at a time)."""
    if len(text) <= SCAN_CHARS:
        return REF_PATTERN.search(text) is not None
    spans = scan_spans(text, SCAN_CHARS, " \n")
    return any(REF_PATTERN.search(text, start, end) for start, end in spans)


def _snippet(text: str) -> str:
    # A prefix flattens to a prefix of the whole text's flattening: flatten only what is needed.
    flat = " ".join(text[: _SNIPPET * 8].split())
    if len(flat) <= _SNIPPET and len(text) > _SNIPPET * 8:
        flat = " ".join(text.split())
    return flat if len(flat) <= _SNIPPET else flat[:_SNIPPET].rstrip() + "…"


@dataclass
class Forms:
    """Lazily built, memoized forms and token costs for one compaction."""

    messages: Sequence[Message]
    config: CompressionConfig
    settings: FormSettings
    duplicates: dict[int, Duplicate]
    costs: list[int]
    """What each input message costs (counted by the caller)."""
    min_saving: int = field(init=False)
    _prefix: list[int] = field(init=False)
    _chars: list[int] = field(init=False)
    _memo: dict[tuple[int, int, int], Form | None] = field(default_factory=dict)
    _facts_drafts: dict[int, Draft] = field(default_factory=dict)
    _tried: dict[tuple[int, int], list[tuple[int, Candidate]]] = field(default_factory=dict)
    _summaries: dict[int, Draft | None] = field(default_factory=dict)
    _masks: dict[tuple[int, int], Draft | None] = field(default_factory=dict)
    _split: dict[int, list[tuple[bool, str]] | None] = field(default_factory=dict)
    _rewritable: dict[int, str | None] = field(default_factory=dict)
    _made: dict[Draft, Form] = field(default_factory=dict)
    _estimates: dict[Draft, int] = field(default_factory=dict)
    _markers: dict[tuple[str | None, bool], int] = field(default_factory=dict)
    _merges: dict[tuple[tuple[int, int, int, str], ...], Form] = field(default_factory=dict)
    _texts: dict[int, str] = field(default_factory=dict)
    _refs: dict[tuple[int, int], str] = field(default_factory=dict)
    _facts: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    _found: dict[str, TextFacts] = field(default_factory=dict)
    _canonical: dict[int, bytes] = field(default_factory=dict)
    _sentences: SentenceCache = field(default_factory=SentenceCache)
    _shapes: dict[str, str] = field(default_factory=dict)
    _shape_sets: dict[int, dict[str, set[str]]] = field(default_factory=dict)
    _cand_chars: dict[int, int] = field(default_factory=dict)
    _fact_prefix: list[int] = field(default_factory=list)
    _hits: dict[int, LineHits] = field(default_factory=dict)
    _fill: list[float] = field(default_factory=list)
    keys: Sequence[float] = ()
    """How long each message keeps its detail (the ladder's keys; higher: longer)."""
    query_terms: Sequence[tuple[str, float]] = ()
    """The heaviest terms of the recent turns (what a mask keeps the lines of)."""
    taken: dict[int, set[str]] = field(default_factory=dict)
    """Per tool result, the terms the agent's next message took up from it (a mask keeps the
    lines of the most specific of them too)."""
    shown: frozenset[int] = frozenset()
    """Messages every rung keeps as they are (system/developer, the last user message, the
    final ones): a stub does not list their facts again."""
    _known: str | None = None
    _known_test: Callable[[str], bool] | None = None
    _leads: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    _prose: str | None = None
    _fenced: dict[int, bool | None] = field(default_factory=dict)
    """Per message, whether it holds a code fence (None: a tool result or call)."""
    _again: dict[str, bool] = field(default_factory=dict)
    _shown: dict[str, bool] = field(default_factory=dict)
    """Per fact, whether `_shown_text` holds it (facts repeat from message to message)."""

    def __post_init__(self) -> None:
        # A rewrite must save at least what a marker costs: smaller savings lose text for
        # nothing, and skipping them skips writing hundreds of forms for short messages.
        self.min_saving = _OVERHEAD + self.marker_tokens("summarized", False)
        self._prefix = [0]
        for c in self.costs:
            self._prefix.append(self._prefix[-1] + c)
        self._chars = [0]
        for m in self.messages:
            self._chars.append(self._chars[-1] + len(message_text(m)))

    def cost(self, form: Form) -> int:
        """Tokens a form costs."""
        return form.tokens

    def span_cost(self, start: int, end: int) -> int:
        """Tokens input messages start .. end-1 cost."""
        return self._prefix[end] - self._prefix[start]

    def materialize(self, draft: Draft) -> Form:
        """The draft as a message: reference id, marker, content type kept, exact token count."""
        form = self._made.get(draft)
        if form is None:
            form = self._made[draft] = self._make(draft)
        return form

    def _make(self, draft: Draft) -> Form:
        start, end, verb, body, role = draft.start, draft.end, draft.verb, draft.body, draft.role
        originals = list(self.messages[start:end])
        ref = self._refs.get((start, end))
        if ref is None:
            ref = self._refs[(start, end)] = self.span_digest(start, end)[:10]
        # Forced forms carry the shortest marker the validator and `uncompress` recognise: the
        # long one alone costs ~25 tokens, more than the slack a tight budget leaves. A forced
        # stub (role set) is a plain stand-in, so its marker must say "dropped": a one-message
        # stub with the short marker would be checked as a rewrite that changed its role.
        if verb is None:
            marker = short_marker(ref) if role is None else dropped_marker(ref)
        else:
            marker = ref_marker(ref, end - start, self.span_cost(start, end), verb)
        text = f"{marker}\n{body}" if body else marker
        first = originals[0]
        # A stub is always a plain user/assistant message, even for one dropped message (an
        # orphan tool result rewritten in place would claim to answer a call).
        if end - start == 1 and role is None:
            message = with_text(first, text)
            for key in _DROP_ON_REWRITE:
                message.pop(key, None)
        else:
            content: object = text
            if isinstance(first.get("content"), list):
                content = [{"type": "text", "text": text}]
            message = {"role": role or first.get("role"), "content": content}
            if first.get("name") is not None and all(
                m.get("name") == first.get("name") for m in originals
            ):
                message["name"] = first["name"]
        return Form(message, start, end, body, ref, self.config.count_message(message))

    def estimate(self, draft: Draft) -> int:
        """What the draft's message will cost, from its length: the originals' tokens per
        character (facts, mostly ids and numbers, are denser) plus the marker's typical cost."""
        found = self._estimates.get(draft)
        if found is None:
            density = _FACTS_DENSITY if draft.body.startswith("facts: ") else 1.0
            body = len(draft.body) * self.ratio(draft.start, draft.end) * density
            found = _OVERHEAD + self.marker_tokens(draft.verb, draft.end - draft.start > 1)
            found += round(body) + (1 if draft.body else 0)
            self._estimates[draft] = found
        return found

    def ratio(self, start: int, end: int) -> float:
        """Content tokens per character of the text of input messages start .. end-1."""
        chars = self._chars[end] - self._chars[start]
        tokens = self.span_cost(start, end) - _OVERHEAD * (end - start)
        return max(tokens, 1) / chars if chars else _DEFAULT_RATIO

    def marker_tokens(self, verb: str | None, several: bool) -> int:
        """Tokens of a typical marker (the reference id and token figure vary a little)."""
        key = (verb, several)
        found = self._markers.get(key)
        if found is None:
            marker = (
                short_marker(_TYPICAL_REF)
                if verb is None
                else ref_marker(_TYPICAL_REF, 2 if several else 1, 100, verb)
            )
            count = self.config.count_message
            found = count({"role": "user", "content": marker}) - count(_EMPTY)
            self._markers[key] = found
        return found

    def source_digest(self) -> str:
        """`compute_source_digest(messages)`: the span of them all, so the bytes of each message
        serialized here serve the stubs' and merges' reference ids too."""
        return self.span_digest(0, len(self.messages))

    def span_digest(self, start: int, end: int) -> str:
        """`compute_source_digest(messages[start:end])`, serializing each message once.

        The canonical JSON of a list is its items' joined by commas in brackets, so the many
        overlapping spans a search tries (stubs, merges) share the bytes."""
        cached = self._canonical
        for i in range(start, end):
            if i not in cached:
                cached[i] = canonical_bytes(self.messages[i])
        # One update of the joined bytes: two calls a message cost more than the copy.
        digest = hashlib.sha256(b"[")
        digest.update(b",".join([cached[i] for i in range(start, end)]))
        digest.update(b"]")
        return digest.hexdigest()

    def _accept(self, form: Form) -> Form | None:
        return form if self.cost(form) < self.span_cost(form.start, form.end) else None

    def _analysis(self, text: str) -> TextFacts:
        # One fact scan per distinct text serves the facts form, every forced cap and the
        # stubs (a message's fact text is usually its text).
        found = self._found.get(text)
        if found is None:
            found = self._found[text] = analyze(text, self._sentences.facts)
        return found

    def _facts_cap(self, text: str) -> int:
        return self._facts_cap_of(len(text))

    def _facts_cap_of(self, chars: int) -> int:
        ratio = self.settings.facts_ratio
        return min(self.settings.max_facts_chars, max(48, int(chars * ratio)))

    def taken_terms(self, i: int) -> list[tuple[str, float]]:
        """The most specific terms tool result i's reaction took up (longest first; with a
        digit or `_`, or long), not among the query's, weighted as its heaviest term."""
        query = {t for t, _w in self.query_terms}
        # Identifier-like: with a digit or `_` (and 4 characters), or 7 characters long (tested
        # inline: a reaction takes up hundreds of an output's terms). Only the first
        # _TAKEN_TERMS of the sorted order are wanted (the keys are distinct).
        # (A word of letters only holds no digit: most terms are, and skip the character test.)
        found = [
            t
            for t in self.taken.get(i, ())
            if (
                len(t) >= 7
                or (len(t) >= 4 and ("_" in t or (not t.isalpha() and any(c.isdigit() for c in t))))
            )
            and t not in query
        ]
        weight = self.query_terms[0][1] if self.query_terms else 1.0
        best = heapq.nsmallest(_TAKEN_TERMS, found, key=lambda t: (-len(t), t))
        return [(t, weight) for t in best]

    def mask_draft(self, i: int, chars: int) -> Draft | None:
        """Tool result i cut to `chars`: the lines of its middle that hold the recent turns'
        terms (up to half of them), its head and tail (at line ends where possible) with the
        rest, then the facts of what was cut; None if that would keep nearly all of it."""
        key = (i, chars)
        if key in self._masks:
            return self._masks[key]
        text = self._summarizable(i)
        draft = None
        if text is not None and len(text) > chars + _MASK_FACTS_CHARS:
            hits = self._hits.get(i)
            if hits is None:
                hits = self._hits[i] = line_hits(text, [*self.query_terms, *self.taken_terms(i)])
            lines = relevant_lines(hits, chars // 3, len(text) - chars // 6, chars // 2)
            used = sum(len(line) + 1 for line in lines)
            head, tail = preview_parts(text, chars - used)
            kept = "\n…\n".join([head, *(line for line in lines if line not in head), tail])
            body = kept
            if not lines:
                listed = facts_within(self._analysis(text), _MASK_FACTS_CHARS + len(kept) // 8)
                lost = [f for f in listed.split(", ") if f and f not in kept]
                body = f"{kept}\nfacts: {', '.join(lost)}" if lost else kept
            draft = Draft(i, i + 1, "masked" if chars > _SHORT_MASK_CHARS else "truncated", body)
        self._masks[key] = draft
        return draft

    def fill_draft(self, i: int, chars: int) -> Draft | None:
        """Message i cut to about `chars`: its fact list (up to half of them, or all its fact
        form lists: a fill adds text, it never trades facts for it) first, then its head and
        tail with the rest, listing the facts the cut lost; None if nothing is cut."""
        text = self._summarizable(i)
        if text is None or len(text) <= chars:
            return None
        listed_chars = max(chars // 2, _MASK_FACTS_CHARS, len(self.facts_draft(i).body))
        listed = facts_within(self._analysis(text), listed_chars)
        head, tail = preview_parts(text, max(chars - len(listed), 0))
        kept = f"{head}\n…\n{tail}"
        lost = [f for f in listed.split(", ") if f and f not in kept]
        body = f"{kept}\nfacts: {', '.join(lost)}" if lost else kept
        return Draft(i, i + 1, "truncated", body)

    def mask_chars(self, i: int, level: int) -> int:
        """Characters of head and tail a tool result keeps at a level."""
        if level != MASKED:
            return _SHORT_MASK_CHARS
        chars = len(message_text(self.messages[i]))
        return min(_MASK_MAX_CHARS, max(2 * _SHORT_MASK_CHARS, int(chars * _MASK_RATIO)))

    def single(self, i: int, level: int) -> Form | None:
        """Message i at MASKED, SUMMARY or FACTS level; None if that would not make it smaller.

        At SUMMARY the first of its candidates (a duplicate reference, then the summary) that is
        smaller; at FACTS the lightest by estimate of those and the fact list that is smaller
        (so a climb from SUMMARY to FACTS does not make a message grow). Only candidates
        estimated to save at least `min_saving` are written out."""
        key = (i, i + 1, level)
        if key not in self._memo:
            form = None
            ceiling = self.costs[i] - self.min_saving
            for tokens, draft in self._candidates_at(i, level):
                if tokens > ceiling:
                    continue
                if draft is None:
                    written = self.summary_draft(i)
                elif draft is LATER_FACTS:
                    written = self.facts_draft(i)
                else:
                    written = draft
                form = None if written is None else self._accept(self.materialize(written))
                if form is not None:
                    break
            self._memo[key] = form
        return self._memo[key]

    def estimate_single(self, i: int, level: int) -> int:
        """What `single(i, level)` is estimated to cost (the original's cost if nothing smaller)."""
        for tokens, _draft in self._candidates_at(i, level):
            if tokens <= self.costs[i] - self.min_saving:
                return tokens
        return self.costs[i]

    def _candidates_at(self, i: int, level: int) -> list[tuple[int, Candidate]]:
        """(estimated tokens, draft or None for the summary) for message i at a level, in the order
        they are tried: at SUMMARY by preference, at FACTS lightest first. The summary is priced
        before it is written (writing it is most of a summary's cost)."""
        key = (i, level)
        found = self._tried.get(key)
        if found is not None:
            return found
        found = []
        # Below 2 * min_saving every form costs at least min_saving (most of a chat's messages).
        if self.costs[i] < 2 * self.min_saving:
            self._tried[key] = found
            return found
        chars = self._chars[i + 1] - self._chars[i]
        # A multi-megabyte message is cut like a tool result, not summarized: splitting it into
        # sentences and freeing them would hold the GIL for tens of milliseconds.
        tool = self.messages[i].get("role") == "tool" or chars > SUMMARY_MAX_CHARS
        # Masking is for tool results.
        if tool or level != MASKED:
            if level != MASKED:
                found = [(self.estimate(d), d) for d in self._duplicate_drafts(i)]
            if tool:
                mask = self.mask_draft(i, self.mask_chars(i, level))
                if mask is not None:
                    found.append((self.estimate(mask), mask))
            else:
                predicted = self._summary_estimate(i)
                if predicted is not None:
                    found.append((predicted, None))
            # A long tool result's fact list is longer than its short mask (it fills its cap):
            # only a short one's is worth writing to compare.
            if level == FACTS and (not tool or self._facts_cap_of(chars) < _SHORT_MASK_LIMIT):
                found.append(self._facts_candidate(i))
            if level == FACTS:
                found.sort(key=lambda c: c[0])
        self._tried[key] = found
        return found

    def _facts_candidate(self, i: int) -> tuple[int, Candidate]:
        """(estimated tokens, draft) of message i's fact list. The first few are written and
        priced; the rest are priced from how full those filled their room (fact lists are as
        dense as the conversation: nearly empty in chat, full in code), and written only when a
        rung that uses them is."""
        if i in self._facts_drafts or len(self._fill) < _CALIBRATION:
            draft = self.facts_draft(i)
            return self.estimate(draft), draft
        text = message_text(self.messages[i])
        chars = self._facts_cap(text) * sum(self._fill) / len(self._fill)
        body = round(chars * self.ratio(i, i + 1) * _FACTS_DENSITY) + (1 if chars >= 1 else 0)
        return _OVERHEAD + self.marker_tokens("reduced to facts", False) + body, LATER_FACTS

    def facts_draft(self, i: int) -> Draft:
        """Message i reduced to its facts."""
        found = self._facts_drafts.get(i)
        if found is None:
            text = message_text(self.messages[i])
            cap = self._facts_cap(text)
            facts = facts_within(self._analysis(text), cap)
            self._fill.append(len(facts) / cap)
            body = f"facts: {facts}" if facts else ""
            found = self._facts_drafts[i] = Draft(i, i + 1, "reduced to facts", body)
        return found

    def _summarizable(self, i: int) -> str | None:
        """Message i's text if a summary or a duplicate reference may replace it."""
        # Asked for by every mask, duplicate and summary of message i: the scan for a marker
        # reads the whole text, so it is done once.
        if i not in self._rewritable:
            text: str | None = message_text(self.messages[i])
            if not text or text.isspace() or _has_ref(text):
                # Already a compacted form (a replayed checkpoint): summarizing it again loses more.
                text = None
            self._rewritable[i] = text
        return self._rewritable[i]

    def _duplicate_drafts(self, i: int) -> list[Draft]:
        dup = self.duplicates.get(i)
        text = self._summarizable(i) if dup is not None else None
        if dup is None or text is None:
            return []
        role = self.messages[dup.target].get("role")
        if dup.similarity >= 1.0:
            body = f'Same text as a later {role} message: "{_snippet(text)}"'
            return [Draft(i, i + 1, "deduplicated", body)]
        cap = int(len(text) * self.settings.summary_ratio)
        only = "\n".join(dup.only_here)[:cap]
        body = (
            f"{round(dup.similarity * 100)}% the same lines as a later {role} message "
            f'("{_snippet(message_text(self.messages[dup.target]))}"); lines only here:\n{only}'
        )
        return [Draft(i, i + 1, "deduplicated", body)]

    def _blocks(self, i: int) -> list[tuple[bool, str]] | None:
        """Message i's hard and prose blocks; None when it has no summary (not summarizable,
        an exact duplicate, or a JSON document, whose summary is itself)."""
        if i not in self._split:
            text = self._summarizable(i)
            dup = self.duplicates.get(i)
            exact_duplicate = dup is not None and dup.similarity >= 1.0
            if text is None or exact_duplicate or _is_json(text):
                self._split[i] = None
            else:
                self._split[i] = split_blocks(text)
        return self._split[i]

    def _summary_estimate(self, i: int) -> int | None:
        """The summary's estimated tokens, from its blocks: hard ones kept, `summary_ratio` of
        the prose (the facts of the dropped sentences take about what filler frees)."""
        blocks = self._blocks(i)
        prose = sum(len(b) for hard, b in blocks or () if not hard)
        if not prose:
            return None
        assert blocks is not None
        hard = sum(len(b) + 2 for is_hard, b in blocks if is_hard)
        chars = hard + prose * self.settings.summary_ratio
        marker = self.marker_tokens("summarized", False)
        return _OVERHEAD + marker + round(chars * self.ratio(i, i + 1)) + 1

    def summary_draft(self, i: int) -> Draft | None:
        """Message i's extractive summary (hard content kept); None if it changes nothing."""
        if i not in self._summaries:
            blocks = self._blocks(i)
            draft = None
            if blocks is not None:
                text = message_text(self.messages[i])
                summary = summarize_text(
                    text,
                    self.settings.summary_ratio,
                    self.settings.max_facts_chars,
                    self._sentences,
                    blocks,
                )
                if summary != text:
                    draft = Draft(i, i + 1, "summarized", summary)
            self._summaries[i] = draft
        return self._summaries[i]

    def merged(self, parts: Sequence[Form]) -> Form:
        """One message for consecutive same-role rewritten messages (a single marker)."""
        key = tuple((p.start, p.end, p.tokens, p.body) for p in parts)
        form = self._merges.get(key)
        if form is None:
            body = "\n\n".join(p.body for p in parts if p.body)
            draft = Draft(parts[0].start, parts[-1].end, "summarized", body)
            form = self._merges[key] = self.materialize(draft)
        return form

    def fact_chars(self, i: int) -> int:
        """Characters of message i's fact text (what a stub's fact budget is a share of)."""
        return len(self._fact_text(i))

    def seed_fact_texts(self, texts: dict[int, str]) -> None:
        """Fact texts of some messages, computed already (`fact_text` of each)."""
        self._texts.update(texts)

    def _fact_text(self, i: int) -> str:
        if i not in self._texts:
            self._texts[i] = fact_text(self.messages[i])
        return self._texts[i]

    def _candidates(self, i: int) -> list[tuple[int, str]]:
        """Message i's fact candidates for a stub: those the text of the messages every rung
        keeps as they are (`shown`) holds are left out (the request says them anyway)."""
        if i not in self._facts:
            found = candidates_of(self._analysis(self._fact_text(i)))
            if self.shown:
                found = unshown(found, self._shown, self._shown_test())
            self._facts[i] = found
        return self._facts[i]

    def _lead_words(self, i: int) -> list[tuple[int, str]]:
        """The content words that start message i's sentences (`Roguelike deckbuilders are
        popular`, `Team is me plus 4 engineers`), capitalized as written: no name by the fact
        pattern, a stub lists them after its facts, in a share of the room those leave; none
        for a tool result or a message with tool calls."""
        found = self._leads.get(i)
        message = self.messages[i]
        if found is None and (message.get("tool_calls") or message.get("role") == "tool"):
            # An agent's notes before a call start with `Now`, `Looking`, `Perfect`: not these.
            found = self._leads[i] = []
        if found is None:
            text = self._fact_text(i)
            known = self._shown_test() if self.shown else "".__contains__
            # Each distinct word tested once (sentences start with the same words again).
            words = dict.fromkeys(
                w
                for start, end in scan_spans(text, SCAN_CHARS, " \n")
                for w in _LEAD_WORD.findall(text, start, end)
            )
            found = self._leads[i] = [
                (_LEAD_RANK if self._said_again(w) else _LEAD_ONCE_RANK, w)
                for w in words
                if len(w) >= _MIN_LEAD and w not in _STARTERS and not known(w)
            ]
        return found

    def _said_again(self, word: str) -> bool:
        """Whether the conversation's prose says `word` more than once, in any case (asked
        once per distinct word: chats repeat their lead words from message to message)."""
        found = self._again.get(word)
        if found is None:
            prose = self._prose_lowered()
            low = word.lower()
            first = prose.find(low)
            found = self._again[word] = first >= 0 and prose.find(low, first + 1) >= 0
        return found

    def _prose_lowered(self) -> str:
        """The conversation's latest prose, lowered: the text of the messages that are no tool
        result and make no tool call, newest first, up to PROSE_SEARCH characters (joined once,
        when a lead word is first ranked: a multi-megabyte history is not lowered and searched
        whole, which held the event loop for ~20 ms)."""
        if self._prose is None:
            parts: list[str] = []
            left = PROSE_SEARCH
            for m in reversed(self.messages):
                if left <= 0:
                    break
                if m.get("role") != "tool" and not m.get("tool_calls"):
                    text = message_text(m)[:left]
                    parts.append(text)
                    left -= len(text) + 1
            self._prose = "\n".join(parts).lower()
        return self._prose

    def _shown_text(self) -> str:
        """The fact text of the messages every rung keeps as they are (joined once)."""
        if self._known is None:
            self._known = "\n".join(self._fact_text(i) for i in sorted(self.shown))
        return self._known

    def _shown_test(self) -> Callable[[str], bool]:
        """Whether a str occurs in `_shown_text` (`in`, with the text indexed once)."""
        if self._known_test is None:
            self._known_test = occurs_in(self._shown_text())
        return self._known_test

    def _stub_read(self, start: int, end: int, cap: int) -> list[int]:
        """The messages of start .. end-1 whose fact candidates a stub chooses from, in order:
        those that keep their detail longest (the ladder's keys), read until they hold
        STUB_READ times the stub's room (or their text STUB_READ_TEXT times), so a long run
        costs what its stub can say."""
        # Highest key first, ties in message order (a reversed sort stays stable).
        keys = self.keys
        order = sorted(range(start, end), key=keys.__getitem__, reverse=True) if keys else []
        read: list[int] = []
        chars = text = 0
        for i in order or range(start, end):
            read.append(i)
            chars += self._candidate_chars(i)
            text += self.fact_chars(i)
            if chars >= STUB_READ * cap or text >= STUB_READ_TEXT * cap:
                break
        return sorted(read)

    def _candidate_chars(self, i: int) -> int:
        found = self._cand_chars.get(i)
        if found is None:
            found = self._cand_chars[i] = sum(len(f) + 2 for _rank, f in self._candidates(i))
        return found

    def _shape_counts(self, i: int) -> dict[str, set[str]]:
        found = self._shape_sets.get(i)
        if found is None:
            found = self._shape_sets[i] = shape_counts(self._candidates(i), self._shapes)
        return found

    def fact_chars_of(self, start: int, end: int) -> int:
        """Characters of the fact text of input messages start .. end-1, what a stub's room is
        a share of, conversation prose counted PROSE_WEIGHT times (prefix sums, made when first
        wanted: a long history's stubs span hundreds of messages)."""
        prefix = self._fact_prefix
        if not prefix:
            prefix.append(0)
            own = self._chars
            for i, m in enumerate(self.messages):
                if m.get("tool_calls"):
                    chars = self.fact_chars(i)
                else:
                    # The fact text of a message without tool calls is its text: its length is
                    # known, and most of a long history's are never wanted (only those a stub
                    # reads are).
                    chars = own[i + 1] - own[i]
                    if m.get("role") != "tool":
                        chars = int(chars * PROSE_WEIGHT)
                prefix.append(prefix[-1] + chars)
        return prefix[end] - prefix[start]

    def estimate_stub(self, start: int, end: int, chars: int) -> int:
        """Estimated tokens of the stub for messages start .. end-1, whose fact text has `chars`
        characters (what `stub` writes: a share of them, within bounds)."""
        share = max(40.0, chars * self.settings.stub_facts_ratio)
        facts = min(share, self.settings.max_facts_chars)
        ratio = self.ratio(start, end) * _FACTS_DENSITY
        return _OVERHEAD + self.marker_tokens("dropped", True) + round(facts * ratio) + 1

    def stub_cap(self, start: int, end: int) -> int:
        """Characters of facts the stub of input messages start .. end-1 lists at most."""
        chars = self.fact_chars_of(start, end)
        return min(
            self.settings.max_facts_chars, max(40, int(chars * self.settings.stub_facts_ratio))
        )

    def stub(self, start: int, end: int, force_cap: int | None = None) -> Form | None:
        """A run of whole units dropped, replaced by one user/assistant message with its facts.

        Forced stubs (`force_cap` set) carry the short marker and at most `force_cap` chars of
        facts (none at 0)."""
        key = (start, end, DROPPED if force_cap is None else -1 - force_cap)
        if key not in self._memo:
            cap = self.stub_cap(start, end)
            if force_cap is not None:
                cap = min(cap, force_cap)
            self._memo[key] = self._stub_form(start, end, cap, force_cap is None)
        return self._memo[key]

    def is_stub(self, form: Form) -> bool:
        """Whether `form` is the stub `stub` wrote for its span (asked without writing one)."""
        return self._memo.get((form.start, form.end, DROPPED)) is form

    def stub_sized(self, start: int, end: int, cap: int) -> Form | None:
        """The stub of input messages start .. end-1 listing up to `cap` characters of facts
        (the budget's slack filled)."""
        return self._stub_form(start, end, cap, True, filled=True)

    def _stub_form(
        self, start: int, end: int, cap: int, marked: bool, filled: bool = False
    ) -> Form | None:
        role = "user" if self.messages[start].get("role") == "user" else "assistant"
        body = ""
        if cap > 0:
            read = self._stub_read(start, end, cap)
            # (Most agent-run stubs read two to four messages: no shape can tag them.)
            structural = (
                structural_shapes([self._shape_counts(i) for i in read])
                if len(read) >= TAG_MESSAGES
                else frozenset()
            )
            groups = [self._candidates(i) for i in read]
            if self._coding(read):
                groups.reverse()
            facts = pack_salient(groups, cap, structural, self._shapes)
            room = min(cap - len(facts) - 2, cap // (_FILL_LEAD_SHARE if filled else _LEAD_SHARE))
            if room > _MIN_LEAD:
                listed = f", {facts}, "
                leads = [
                    [c for c in self._lead_words(i) if f", {c[1]}, " not in listed] for i in read
                ]
                more = pack_salient(leads, room, frozenset(), self._shapes)
                facts = f"{facts}, {more}" if facts and more else facts or more
            body = f"facts: {facts}" if facts else ""
        verb = "dropped" if marked else None
        return self._accept(self.materialize(Draft(start, end, verb, body, role)))

    def _coding(self, read: Sequence[int]) -> bool:
        """Whether a stub over messages `read` folds a coding chat: prose only (no tool result,
        no tool call) with a code fence in one of them. Its facts are then taken newest message
        first: the files and names the work is at now come before those it began with (a
        narrative chat's first mentions, who and where, and an agent run's task stay first)."""
        fenced = self._fenced
        for i in read:
            if i not in fenced:
                m = self.messages[i]
                prose = m.get("role") != "tool" and not m.get("tool_calls")
                fenced[i] = None if not prose else "```" in self._fact_text(i)
        return all(fenced[i] is not None for i in read) and any(fenced[i] for i in read)

    def stub_chars_per_token(self, start: int, end: int) -> float:
        """Characters of a stub's fact list per token (what sizes a filled stub)."""
        return 1 / (self.ratio(start, end) * _FACTS_DENSITY)

    def forced(self, i: int, force_cap: int) -> Form | None:
        """Message i with the short marker and at most `force_cap` chars of facts."""
        key = (i, i + 1, -1 - force_cap)
        if key not in self._memo:
            facts = ""
            if force_cap > 0:
                text = message_text(self.messages[i])
                cap = min(self._facts_cap(text), force_cap)
                facts = facts_within(self._analysis(text), cap)
            draft = Draft(i, i + 1, None, f"facts: {facts}" if facts else "")
            form = self._accept(self.materialize(draft))
            if form is None and force_cap > 0:
                form = self.forced(i, 0)
            self._memo[key] = form
        return self._memo[key]
