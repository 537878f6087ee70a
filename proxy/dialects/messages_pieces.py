"""Anthropic messages cut into the pieces compaction knows, and what pins them.

An assistant message is one piece; a user message is one piece per `tool_result` block and one
per run of other blocks; any other role is pinned. A tool result must answer the assistant
message right before its message and every `tool_use` must be answered by the next message:
what breaks that is pinned, and everything before the last compaction block is superseded (see
`proxy.dialects.messages`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SUPERSEDED = "superseded"
"""The kind of a piece before the last compaction block: the upstream drops it."""


@dataclass
class Piece:
    """One projected piece of a message: its kind, role and blocks (or text)."""

    kind: str
    role: str
    content: Any
    start: bool
    origin: int = 0
    """The index of the message it is (part of)."""


def split_pieces(messages: Sequence[Any]) -> tuple[list[Piece], list[int]] | None:
    """The projected pieces, and where the pairing pass may start again (`_pin_unpaired`)."""
    pieces: list[Piece] = []
    for origin, m in enumerate(messages):
        first = len(pieces)
        if not isinstance(m, Mapping):
            return None
        role, content = m.get("role"), m.get("content")
        if not isinstance(content, str | list) or not isinstance(role, str):
            return None
        if role == "assistant":
            pieces.append(Piece("assistant", role, content, True))
        elif role == "user" and isinstance(content, list):
            run: list[Any] = []
            start = True
            for block in content:
                if isinstance(block, Mapping) and block.get("type") == "tool_result":
                    if run:
                        pieces.append(Piece("user", role, run, start))
                        run, start = [], False
                    pieces.append(Piece("tool", role, [block], start))
                    start = False
                else:
                    run.append(block)
            if run or start:
                pieces.append(Piece("user", role, run, start))
        elif role == "user":
            pieces.append(Piece("user", role, content, True))
        else:
            pieces.append(Piece("pinned", role, content, True))
        for piece in pieces[first:]:
            piece.origin = origin
    stops = _pin_unpaired(pieces)
    _pin_compacted(pieces)
    return pieces, stops


def _pin_compacted(pieces: list[Piece]) -> None:
    """The last compaction block's message, and the results of its tool calls, stay as they
    are; what precedes it, which the API drops, is superseded (never touched, never counted)."""
    last = None
    for i, piece in enumerate(pieces):
        if piece.kind in ("assistant", "pinned") and has_compaction(piece.content):
            last = i
    if last is None:
        return
    for piece in pieces[:last]:
        piece.kind = SUPERSEDED
    pieces[last].kind = "pinned"
    j = last + 1
    while j < len(pieces) and pieces[j].kind == "tool":
        pieces[j].kind = "pinned"
        j += 1


def has_compaction(content: Any) -> bool:
    """Whether the content holds a compaction block (the upstream's own summary)."""
    return isinstance(content, list) and any(
        isinstance(b, Mapping) and b.get("type") == "compaction" for b in content
    )


def _tool_uses(piece: Piece) -> set[str]:
    content = piece.content if isinstance(piece.content, list) else []
    return {
        b["id"]
        for b in content
        if isinstance(b, Mapping) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    }


def _pin_unpaired(pieces: list[Piece]) -> list[int]:
    """A tool result must answer the assistant message right before its message, and every
    `tool_use` must be answered by the next message: what breaks that (with the rest of its
    turn) stays as it is.

    Returns the first piece of every message the pass stops at: what it decided before one
    depends on no piece after it, and from one it goes on as a pass over the messages from
    there would (`proxy.dialects.incremental`)."""
    stops: list[int] = []
    i = 0
    while i < len(pieces):
        piece = pieces[i]
        if i == 0 or pieces[i - 1].origin != piece.origin:
            stops.append(i)
        if piece.kind == "tool":
            piece.kind = "pinned"
            i += 1
            continue
        if piece.kind != "assistant":
            i += 1
            continue
        uses = _tool_uses(piece)
        j = i + 1
        answered: set[str] = set()
        while j < len(pieces) and pieces[j].kind == "tool" and not (pieces[j].start and answered):
            block = pieces[j].content[0]
            if block.get("tool_use_id") not in uses:
                break
            answered.add(block["tool_use_id"])
            j += 1
        if uses - answered and j < len(pieces):
            # Anthropic joins consecutive messages of one role into one turn: the assistant
            # messages after this one come before its results too, and nothing may go between.
            while j < len(pieces) and pieces[j].kind == "assistant":
                j += 1
            for p in pieces[i:j]:
                p.kind = "pinned"
        i = j
    return stops
