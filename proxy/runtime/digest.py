"""Canonical message form and digests.

Clients resend history with cosmetic changes: key order, whitespace, optional fields sent as
`null` or left out, the SDK's re-serialization of an assistant reply (`refusal: null`,
`annotations: []`). The canonical form ignores those, so the same history always has the same
digests and finds the same checkpoint, whose stored bytes are then replayed. Messages themselves
are forwarded as the client sent them (a restore gives back exactly what was sent).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

Message = dict[str, Any]

# Keys that clients add as empty placeholders; an empty value means the same as no key.
_EMPTY_MEANS_ABSENT = frozenset({"annotations", "tool_calls", "refusal", "audio", "function_call"})


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _clean(v)
            for k, v in sorted(value.items())
            if v is not None and not (k in _EMPTY_MEANS_ABSENT and v in ([], "", {}))
        }
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def canonical_message(message: Message) -> Message:
    """The message without null fields and empty placeholders, keys sorted at every level.

    Sorting here (rather than with orjson.OPT_SORT_KEYS at dump time) lets a rewritten request
    keep its own top-level key order while every message in it is serialized canonically.
    """
    cleaned: Message = _clean(message)
    return cleaned


def canonical_bytes(message: Message) -> bytes:
    """Compact, key-sorted JSON of the canonical form."""
    return orjson.dumps(canonical_message(message))


def message_digest(message: Message) -> str:
    """SHA-256 hex (first 32 chars) of one message's canonical form."""
    return hashlib.sha256(canonical_bytes(message)).hexdigest()[:32]


def prefix_digests(digests: Sequence[str]) -> list[str]:
    """Rolling digests: result[i] identifies messages[0..i] as a whole."""
    rolling = RollingPrefixes()
    rolling.extend(digests)
    return rolling.values


class RollingPrefixes:
    """`prefix_digests` kept as it grows: extending by more messages' digests hashes only
    those (a long conversation's next turn, see proxy.chat.bodycache)."""

    KEPT_STATES = 32
    """Hash states kept for the last values: a history cut back by a few messages (a client
    that moved its cache breakpoints) continues from one without rehashing the rest."""

    def __init__(self) -> None:
        # One attribute, replaced whole: a long history is extended in a thread, and a copy
        # taken meanwhile on the event loop (the next turn's) must see the hash and the values
        # of the same digests.
        self._state: tuple[Any, list[str], list[Any]] = (hashlib.sha256(), [], [])

    @property
    def values(self) -> list[str]:
        """prefix_digests of every digest given so far."""
        return self._state[1]

    def extend(self, digests: Iterable[str]) -> None:
        """Append the prefix digests of `digests`, which follow those given so far."""
        new = list(digests)
        if not new:
            return
        h, values, states = self._state
        h, values, states = h.copy(), list(values), states[-self.KEPT_STATES :]
        for d in new:
            h.update(d.encode())
            state = h.copy()
            values.append(state.hexdigest()[:32])
            states.append(state)
        self._state = (h, values, states[-self.KEPT_STATES :])

    def copy(self) -> RollingPrefixes:
        """An independent copy (to extend along one branch)."""
        h, values, states = self._state
        other = RollingPrefixes()
        other._state = (h.copy(), list(values), list(states))
        return other

    def head(self, n: int) -> RollingPrefixes | None:
        """An independent copy of the first `n` values, or None if no hash state for them is
        kept (the caller extends a fresh one)."""
        _, values, states = self._state
        if n >= len(values):
            return self.copy()
        other = RollingPrefixes()
        if n <= 0:
            return other
        back = len(values) - n  # the state after value n - 1 is `back` from the end
        if back >= len(states):
            return None
        kept = states[: len(states) - back]
        other._state = (kept[-1].copy(), values[:n], kept)
        return other


def root_length(messages: Sequence[Message]) -> int:
    """How many messages the conversation's root is: up to and including the first user one."""
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            return i + 1
    return len(messages)


def conversation_id(messages: Sequence[Message], key: bytes = b"") -> str:
    """Digest of the conversation's root: messages up to and including the first user message;
    keyed (HMAC-SHA256) with the server secret when one is given, so that an id seen in a log
    cannot be matched to a guessed system prompt and first message offline."""
    h = hmac.new(key, digestmod=hashlib.sha256) if key else hashlib.sha256()
    for m in messages:
        h.update(canonical_bytes(m))
        if m.get("role") == "user":
            break
    return h.hexdigest()[:24]
