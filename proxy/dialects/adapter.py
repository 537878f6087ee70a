"""What the Responses and Messages adapters share: the `Dialect` methods over a projection.

An adapter is built from its API's functions: how the body is projected (`project`), what items
cost beyond their projection (`cost`), which message is the turn a pending tool result continues
(`pending`), what the request costs besides its history (`fixed`) and how projected messages go
back into its field (`emit`); the rest is the same for both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.dialects.breakpoints import Breakpoints, Place
from proxy.dialects.incremental import Incremental
from proxy.dialects.projection import (
    Marks,
    Message,
    NativeCounter,
    Sent,
    is_unchanged,
    match_originals,
    native,
    native_problems,
    opaque_tokens,
    repair_result,
)
from proxy.providers.base import CompactionResult
from proxy.tokens.counter import TokenCounter

Projector = Callable[[Mapping[str, Any]], "tuple[list[Message], Marks] | None"]
Current = tuple[Sequence[Message], Marks]
"""A request's own projected messages and its breakpoints (what `Projector` gives)."""
Emitter = Callable[["Current | None", Sequence[Message], int], list[Any]]
"""The field's new value for projected messages, against the request's own (`emit_all`)."""
Continuer = Callable[["Current | None", Sequence[Message], int, Message], list[Any]]


def _never(body: Mapping[str, Any]) -> bool:
    del body
    return False


@dataclass(frozen=True)
class Adapter:
    """A `proxy.dialects.chat.Dialect` for an API whose items are projected onto chat messages."""

    name: str
    field: str
    """The body field that holds the history (`input`, `messages`)."""
    project: Projector
    """The projected history and the client's breakpoints, or None."""
    cost: Callable[[TokenCounter, Any], int]
    """What a projected message's items cost beyond its projection."""
    pending: Callable[[Sequence[Message]], int | None]
    """The projected assistant message a pending tool result continues, if any."""
    fixed: Callable[[TokenCounter, Mapping[str, Any]], int]
    """What the request costs besides its history (instructions or system, tools)."""
    emit: Emitter
    """The field's new value for projected messages (against the request's own, for its
    breakpoints and originals; for a restore, those of what was forwarded)."""
    opens: Callable[[Message, Message], bool]
    """Whether the items of the second message go out apart from the first's when it follows
    it (they are not joined into one of the API's messages)."""
    reader: Incremental
    """The projection that reuses the last turn's."""
    history: Callable[[Mapping[str, Any]], bool] = _never
    """Whether the request continues history the server keeps."""
    stream_usage_option: bool = False
    continued: Continuer | None = None
    """`emit`'s value for messages whose first joins the last of the messages emitted before
    them (given), starting with that one joined (None: no message ever joins another)."""

    def messages(self, body: Mapping[str, Any]) -> list[Message] | None:
        """The projected history, or None if the body has none we can work on."""
        projected = self.project(body)
        return None if projected is None else projected[0]

    def history_elsewhere(self, body: Mapping[str, Any]) -> bool:
        """See `history`."""
        return self.history(body)

    def fixed_tokens(self, counter: TokenCounter, body: Mapping[str, Any]) -> int:
        """See `fixed`."""
        return self.fixed(counter, body)

    def counter(self, base: TokenCounter) -> NativeCounter:
        """Counts projections plus what only their items carry."""
        return NativeCounter(base, self.cost)

    def problems(self, original: Sequence[Message], result: CompactionResult) -> list[str]:
        """The pending turn and native-item invariants (see `native_problems`)."""
        return native_problems(original, result.messages, result.verbatim, self.pending(original))

    def repair(self, original: Sequence[Message], result: CompactionResult) -> CompactionResult:
        """What a provider must not change put back where it can be (see `repair_result`)."""
        return repair_result(original, result, self.pending(original))

    def set_aside(self, messages: Sequence[Message]) -> int:
        """What follows the results of the turn a pending tool result continues (the rest of
        the final Anthropic user message): providers then see that turn as the final unit,
        which they keep, instead of one they may drop before the final user text."""
        pending = self.pending(messages)
        if pending is None:
            return 0
        end = pending + 1
        while end < len(messages) and messages[end].get("role") == "tool":
            end += 1
        return len(messages) - end

    def with_messages(self, body: Mapping[str, Any], messages: Sequence[Message]) -> bytes:
        """The request with only its history field rebuilt from these projected messages."""
        return self.replayed(body, self.project(body), messages, 0)

    def emitted(self, body: Mapping[str, Any], messages: Sequence[Message]) -> list[Any]:
        """The history field's value for these projected messages, against `body`'s own."""
        return self.emit(self.project(body) if body else None, messages, 0)

    def replayed(
        self,
        body: Mapping[str, Any],
        current: Current | None,
        messages: Sequence[Message],
        tail: int,
    ) -> bytes:
        """`with_messages`, `current` being the body's own projection, whose last `tail`
        messages are the last of `messages` (a replay: the request's own after a checkpoint)."""
        new = dict(body)
        new[self.field] = self.emit(current, messages, tail)
        return orjson.dumps(new)


@dataclass(frozen=True)
class Way:
    """How one API's projected messages go back (see `emit_all`)."""

    project: Projector
    project_native: Callable[[Any], Message | None]
    items: Callable[[Any], list[Any]]
    """The native items of an unchanged projection, as a fresh list."""
    rebuild: Callable[[Message, Any], list[Any]]
    """The native items of a projection a provider rewrote."""
    stand_in: Callable[[Message], list[Any]]
    """The native items of a stand-in compactd made."""
    mark: str
    default_ttl: int
    place: Place


def emit_all(
    way: Way, projected: Current | None, messages: Sequence[Message], tail: int = 0
) -> list[tuple[Message, list[Any], bool]]:
    """Every sent message with the native items it goes back as and whether they are the
    client's own (unchanged), breakpoints put back (and the last lost one moved, see
    `Breakpoints`) against the request's own projection. The last `tail` messages are the
    request's last ones, as they are; the others are matched to the rest by digest."""
    current, marks = projected if projected is not None else ([], Marks(way.mark))
    breakpoints = Breakpoints(marks, default_ttl=way.default_ttl, place=way.place)
    out: list[tuple[Message, list[Any], bool]] = []
    head, base = len(messages) - tail, len(current) - tail
    matched = match_originals(messages[:head], current[:base])
    matched += (Sent(m, base + i) for i, m in enumerate(messages[head:]))
    for sent in matched:
        m = sent.message
        nat = native(m)
        kept = nat is not None and (
            sent.original is not None or is_unchanged(m, way.project_native)
        )
        if nat is None:
            items = way.stand_in(m)
        elif kept:
            items = way.items(nat)
        else:
            items = way.rebuild(m, nat)
        breakpoints.add(sent.original, items)
        out.append((m, items, kept))
    breakpoints.apply()
    return out


def tools_tokens(
    counter: TokenCounter, tools: Any, to_chat: Callable[[Mapping[str, Any]], Message | None]
) -> int:
    """An API's tool list: client functions by the chat tool-schema rules (`to_chat` gives the
    chat shape), built-in and server tools by their text."""
    if not isinstance(tools, list) or not tools:
        return 0
    shaped = [(t, to_chat(t)) for t in tools if isinstance(t, Mapping)]
    functions = [chat for _, chat in shaped if chat is not None]
    return counter.count_tools({"tools": functions}) + sum(
        opaque_tokens(counter, t) for t, chat in shaped if chat is None
    )
