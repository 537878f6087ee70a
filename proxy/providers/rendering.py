"""Rendering a selection: the messages a compaction sends, and the originals behind each ref.

A unit that may go and keeps all its pieces stays whole. Every other such unit is folded with
its neighbours into one stand-in for the run: its marker (`[compactd:ref=<id> … 5 messages,
3,200 tokens dropped]`), then what the run keeps, message by message under its speaker's label
(`user:`, `assistant:`, `tool:`, three tokens, given once for a speaker's consecutive messages;
a tool call as `name arguments`), whole lines and sentences joined where they were adjacent,
an ellipsis for each gap between them. In a unit that must stay, each message keeps its role,
tool identity and content type: whole when every piece is kept, else headed by its own marker
with its kept pieces. Each ref maps to the original messages it stands for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.providers import canonical
from proxy.providers.base import CompressionConfig, Message, ref_marker, short_marker
from proxy.providers.markers import dropped_marker
from proxy.providers.selection import Text
from proxy.providers.units import (
    Unit,
    after_results,
    final_tool_results,
    message_text,
    placeholder,
    with_text,
)

CUT = "cut"
# What stands for the lines missing between kept lines.
GAP = "…\n"
# What a speaker's label in a stand-in costs (`\nassistant: `), in tokens.
LABEL_TOKENS = 3.0


@dataclass
class Layout:
    """The fixed facts of one conversation that rendering needs."""

    messages: Sequence[Message]
    units: Sequence[Unit]
    fixed: frozenset[int]
    config: CompressionConfig
    _stays: list[bool] = field(default_factory=list)
    costs: list[int] = field(default_factory=list)
    """Tokens of each original message (the counts the request was priced with)."""
    base: int = 0
    """Tokens of the request without its messages (priming, tool schemas)."""
    _refs: dict[tuple[int, int], str] = field(default_factory=dict)
    _digests: canonical.Digests = field(init=False)
    _lines: dict[tuple[str, int, bytes, bool], tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.costs = [self.config.count_message(m) for m in self.messages]
        self.base = self.config.count_tokens([])
        self._stays = [
            unit.kind == "system" or not self.fixed.isdisjoint(unit.indices())
            for unit in self.units
        ]
        # A unit whose tool results a user message that stays follows: the two may be one
        # message of the client's (Anthropic's `tool_result` blocks, then text), and a stand-in
        # must not end between them, so it stays too (its messages may still be cut in place).
        for u in range(len(self.units) - 2, -1, -1):
            follows = after_results(self.messages, self.units[u + 1])
            if self._stays[u + 1] and not self._stays[u] and follows:
                self._stays[u] = True
        self._digests = canonical.Digests(self.messages)

    def source_digest(self) -> str:
        """The digest of the whole conversation."""
        return self._digests.source_digest(0, len(self.messages))

    def ref_of(self, start: int, end: int) -> str:
        """The ref id of messages[start:end] (a run is folded again on every round of a fit)."""
        key = (start, end)
        if key not in self._refs:
            self._refs[key] = self._digests.ref_id(start, end)
        return self._refs[key]

    def line(self, text: Text, role: str, *, labelled: bool = True) -> tuple[str, int]:
        """A text's line in a stand-in of this role (`speaker: kept pieces`, or the kept pieces
        alone where the line before has the same speaker) and what it adds to the stand-in's
        cost: remembered by what it keeps, as a fit renders most lines again on every round."""
        key = (role, text.index, bytes(text.kept), labelled)
        found = self._lines.get(key)
        if found is None:
            speaker = self.messages[text.index].get("role")
            line = f"{speaker}: {kept_text(text)}" if labelled else kept_text(text)
            count = self.config.count_message
            cost = count({"role": role, "content": line}) - count({"role": role, "content": ""})
            found = self._lines[key] = (line, cost + 1)
        return found

    def rewritable(self) -> list[int]:
        """Messages a compaction may rewrite, in order."""
        return [i for i in range(len(self.messages)) if i not in self.fixed]

    def stays(self, u: int) -> bool:
        """Whether unit u stays whatever is kept (a system unit, or one holding a fixed
        message): its other messages are rewritten one for one, never folded."""
        return self._stays[u]

    def cut_final(
        self, out: list[Message], verbatim: dict[str, list[Message]], over: int
    ) -> tuple[list[Message], dict[str, list[Message]]]:
        """The final tool results cut head and tail by about `over` tokens in all."""
        offset = len(out) - len(self.messages)
        for i in sorted(final_tool_results(self.messages)):
            if over <= 0:
                break
            original = self.messages[i]
            text = message_text(original)
            tokens = self.costs[i]
            ref = canonical.ref_id([original])
            marker = ref_marker(ref, 1, tokens, CUT)
            room = tokens - over - self.config.count_message(with_text(original, marker))
            if room <= 0:
                marker = short_marker(ref)  # no room for any of it: the cheapest marker
                room = tokens - over - self.config.count_message(with_text(original, marker))
            keep = max(len(text) * room // max(tokens, 1), 0) // 2
            new = with_text(original, f"{text[:keep]}\n{marker}\n{text[len(text) - keep :]}")
            if self.config.count_message(new) >= tokens:
                continue
            out[i + offset] = new
            verbatim[ref] = [original]
            over -= tokens - self.config.count_message(new)
        return out, verbatim


@dataclass
class Rendered:
    """What a selection sends: the messages, the originals behind each ref, and what each
    message costs (exact for kept and one-for-one messages; for a stand-in, the sum of its
    lines counted apart, an upper bound that its lines' cached counts make cheap to reprice)."""

    messages: list[Message] = field(default_factory=list)
    verbatim: dict[str, list[Message]] = field(default_factory=dict)
    costs: list[int] = field(default_factory=list)

    def add(self, message: Message, cost: int) -> None:
        """Append a message and its cost."""
        self.messages.append(message)
        self.costs.append(cost)


def render(layout: Layout, texts: Sequence[Text], *, short: bool) -> Rendered:
    """The messages the selection sends and the originals behind each ref (`short`: the
    short marker forms, the cheapest stand-ins)."""
    messages = layout.messages
    by_index = {t.index: t for t in texts}
    rendered = Rendered()
    run: list[int] = []

    def flush() -> None:
        if run:
            _fold(layout, [by_index.get(i) for i in run], run, short, rendered)
            run.clear()

    newest = _newest_whole(layout, by_index)
    for u, unit in enumerate(layout.units):
        if not layout.stays(u) and u < newest:
            run.extend(unit.indices())
            continue
        flush()
        for i in unit.indices():
            text = by_index.get(i)
            new, ref = (None, "")
            if text is not None and not all(text.kept):
                new, ref = _rewritten(layout, text, short)
            if new is None:
                rendered.add(messages[i], layout.costs[i])
                continue
            rendered.add(new, layout.config.count_message(new))
            rendered.verbatim[ref] = [messages[i]]
    flush()
    return rendered


def _newest_whole(layout: Layout, by_index: dict[int, Text]) -> int:
    """The first unit of the newest run of units kept whole (or that stay): they go as they
    were; every unit before it that may go is folded, whole or not, so the older part of a
    conversation costs one stand-in's marker, not one per gap."""
    u = len(layout.units)
    while u > 0:
        unit = layout.units[u - 1]
        texts = [by_index.get(i) for i in unit.indices()]
        whole = any(texts) and all(t is None or all(t.kept) for t in texts)
        if not (layout.stays(u - 1) or whole):
            break
        u -= 1
    # A user message right after tool results may be the text sent in one message with them
    # (Anthropic's `tool_result` blocks, then a reminder): the stand-in takes it too, so it
    # never ends between the two and a restore gives back the one message.
    units, messages = layout.units, layout.messages
    while u < len(units) and not layout.stays(u) and after_results(messages, units[u]):
        u += 1
    return u


def _fold(
    layout: Layout,
    texts: Sequence[Text | None],
    indices: Sequence[int],
    short: bool,
    rendered: Rendered,
) -> None:
    """One stand-in for a run of whole units, carrying what they keep; the run itself when
    that would cost as much."""
    run = [layout.messages[i] for i in indices]
    tokens = sum(layout.costs[indices[0] : indices[-1] + 1])  # a run is contiguous
    ref, stand_in = placeholder(run, tokens, ref=layout.ref_of(indices[0], indices[-1] + 1))
    role = stand_in["role"]
    lines = [dropped_marker(ref) if short else message_text(stand_in)]
    cost = layout.config.count_message({"role": role, "content": lines[0]})
    speaker = None  # a speaker's consecutive lines share one label
    for text in texts:
        if text is not None and any(text.kept):
            said_by = layout.messages[text.index].get("role")
            line, added = layout.line(text, role, labelled=said_by != speaker)
            speaker = said_by
            lines.append(line)
            cost += added
    if cost >= tokens:
        for i, message in zip(indices, run, strict=True):
            rendered.add(message, layout.costs[i])  # whole units, cheaper than a stand-in
        return
    rendered.add({"role": role, "content": "\n".join(lines)}, cost)
    rendered.verbatim[ref] = run


def _rewritten(layout: Layout, text: Text, short: bool) -> tuple[Message | None, str]:
    """Message `text.index` with only its kept pieces, headed by its marker; None when that
    would cost as much as the original."""
    original = layout.messages[text.index]
    ref = layout.ref_of(text.index, text.index + 1)
    marker = short_marker(ref) if short else ref_marker(ref, 1, int(text.full), CUT)
    body = kept_text(text)
    new = with_text(original, f"{marker}\n{body}" if body else marker)
    if layout.config.count_message(new) >= layout.costs[text.index]:
        return None, ref
    return new, ref


def kept_text(text: Text) -> str:
    """The kept pieces of a text, adjacent ones joined as they were, an ellipsis for each gap
    between the rest (inside a line, or on a line of its own between lines: one token, where
    `[… 12 lines]` cost five, a fifth of the room on small budgets with many gaps; the
    message's marker says how much it stood for, and the expand tool brings it all back)."""
    body = text.body
    parts: list[str] = []
    spans, kept = text.spans, text.kept
    k, n = 0, len(spans)
    while k < n:
        j = k
        while j < n and kept[j] == kept[k]:
            j += 1
        start, end = spans[k][0], spans[j - 1][1]
        if kept[k]:
            parts.append(body[start:end])
        elif parts or j < n:
            if body.find("\n", start, end) < 0:
                parts.append(" … ")
            else:
                if parts and not parts[-1].endswith("\n"):
                    parts.append("\n")
                parts.append(GAP)
        k = j
    return "".join(parts).strip()
