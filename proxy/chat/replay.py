"""`checkpoint.replay_problem`, with what depends only on the stored checkpoint remembered.

A long conversation replays the same stored checkpoint on every turn, and the store hands back
the same Checkpoint object for as long as its stored bytes stay the same
(`proxy.store.decoded`). So what the checks derive from the checkpoint alone (its shape, the
digests of the originals it keeps, the tool-call pairing state at its end) and from the prefix
it covers (identified by the rolling digest of messages [0..covered_through]: the roles there,
so which protected messages it rewrote) is computed once per checkpoint, and a replay costs
only the messages after it: a long conversation's next turn costs only its new messages.

Facts are kept by the checkpoint object's identity, never holding it alive (a weak reference
tells a reused id from the same object); `ReplayChecks.problem` answers exactly what
`replay_problem` answers (tests/chat/test_replay_checks.py).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.chat.checkpoint import kept_originals, replay_problem
from proxy.providers.base import Message
from proxy.providers.units import INSTRUCTION_ROLES, final_unit_start, last_index
from proxy.providers.validate import PairingScan, pairing_problems, pairing_scan
from proxy.runtime.digest import message_digest
from proxy.store.base import Checkpoint

MAX_ENTRIES = 4096

_SHAPE = "its structure does not match its messages"
_KEPT = "a message it keeps is not the original it stands for"
_PAIRING = "with this request's messages after it, tool-call pairing breaks"


@dataclass
class _Facts:
    """What the checks of one (structured) checkpoint derive from it alone."""

    shape: str
    """structure_problem's verdict on the checkpoint alone, once its kept originals before the
    first wrong message match ("" if sound)."""
    kept: list[tuple[int, str]]
    """(original index, digest) of every message it keeps as it is (up to that message)."""
    kept_set: frozenset[int]
    scan: PairingScan
    """The tool-call pairing scan of its messages."""
    open_calls: bool | None = None
    """Whether the originals it covers end with tool calls still waiting for results (None:
    not known yet); known like `rewritten`, tool call ids being part of the digests too."""
    rewritten: int | None = None
    """The first system/developer message of the originals it covers that it does not keep as
    it is (-1: none; None: not known yet). Known from any request whose messages
    [0..covered_through] have the checkpoint's source digest: roles are part of the digests."""


class ReplayChecks:
    """`problem(cp, messages, digests, prefixes)` == `replay_problem(cp, messages, digests)`."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max = max_entries
        self._facts: OrderedDict[int, tuple[weakref.ref[Checkpoint], _Facts]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def entries(self) -> int:
        """Checkpoints whose facts are held."""
        return len(self._facts)

    def problem(
        self,
        cp: Checkpoint,
        messages: Sequence[Message],
        digests: Sequence[str],
        prefixes: Sequence[str],
    ) -> str:
        """Why `cp` must not be replayed for this request; "" if it may. `digests` and
        `prefixes` are the request's message and rolling prefix digests."""
        k = cp.covered_through
        if not cp.ends or not 0 <= k < final_unit_start(messages) or k >= len(prefixes):
            return replay_problem(cp, messages, digests)  # unstructured, or refused up front
        facts = self._facts_of(cp)
        if any(digests[i] != d for i, d in facts.kept):
            return _KEPT
        if facts.shape:
            return facts.shape
        prefix = prefixes[k]
        return self._protected(cp, facts, messages, prefix) or _pairing(cp, facts, messages, prefix)

    def _facts_of(self, cp: Checkpoint) -> _Facts:
        found = self._facts.get(id(cp))
        if found is not None and found[0]() is cp:
            self._facts.move_to_end(id(cp))
            self.hits += 1
            return found[1]
        self.misses += 1
        facts = _derive(cp)
        self._facts[id(cp)] = (weakref.ref(cp), facts)
        if len(self._facts) > self._max:
            dead = [key for key, (ref, _) in self._facts.items() if ref() is None]
            for key in dead:
                del self._facts[key]
            while len(self._facts) > self._max:
                self._facts.popitem(last=False)
        return facts

    @staticmethod
    def _protected(cp: Checkpoint, facts: _Facts, messages: Sequence[Message], prefix: str) -> str:
        """protected_problem: the first protected message at or before covered_through that
        the checkpoint does not keep as it is (the final message and the final tool results lie
        past it, since it ends before the final unit)."""
        k = cp.covered_through
        first = facts.rewritten if prefix == cp.source_digest else None
        if first is None:
            first = next(
                (
                    i
                    for i in range(k + 1)
                    if messages[i].get("role") in INSTRUCTION_ROLES and i not in facts.kept_set
                ),
                -1,
            )
            if prefix == cp.source_digest:
                facts.rewritten = first
        last_user = last_index(messages, "user")
        if 0 <= last_user <= k and last_user not in facts.kept_set:
            first = last_user if first < 0 else min(first, last_user)
        if first < 0:
            return ""
        return f"it rewrites protected message {first} ({messages[first].get('role')})"


def _pairing(cp: Checkpoint, facts: _Facts, messages: Sequence[Message], prefix: str) -> str:
    """pairing_problem, scanning only the request's messages after the checkpoint, or none of
    them: when the checkpoint itself pairs every call and leaves none open, and so do the
    originals it stands for, the candidate's pairing errors are all the request's own."""
    k = cp.covered_through
    if not facts.scan.problems and not facts.scan.pending:
        open_calls = facts.open_calls if prefix == cp.source_digest else None
        if open_calls is None:
            open_calls = bool(pairing_scan(messages[: k + 1]).pending)
            if prefix == cp.source_digest:
                facts.open_calls = open_calls
        if not open_calls:
            return ""
    after = pairing_problems(messages[k + 1 :], facts.scan)
    if after and after - pairing_problems(messages):  # the request's own: scanned only if needed
        return _PAIRING
    return ""


def _derive(cp: Checkpoint) -> _Facts:
    """structure_problem's checks of the checkpoint alone, in its order: the kept originals
    up to the first message whose structure is wrong, and that problem."""
    scan = pairing_scan(cp.messages)
    kept: list[tuple[int, str]] = []
    n = len(cp.messages)
    if len(cp.ends) != n or len(cp.parts) != n or not n or cp.ends[-1] != cp.covered_through + 1:
        return _Facts(_SHAPE, kept, frozenset(), scan)
    start = 0
    for message, end, refs in zip(cp.messages, cp.ends, cp.parts, strict=True):
        if end <= start:
            return _Facts(_SHAPE, kept, frozenset(), scan)
        if not refs:
            if end - start != 1:
                return _Facts(_KEPT, kept, frozenset(), scan)
            kept.append((start, message_digest(message)))
        start = end
    return _Facts("", kept, frozenset(kept_originals(cp)), scan)
