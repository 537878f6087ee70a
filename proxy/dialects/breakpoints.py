"""The client's prompt-cache breakpoints on a rewritten request.

Anthropic's `cache_control` (and the Responses API's `prompt_cache_breakpoint`) mark where a
cached prefix ends. The client places them on each request (and moves them every turn), so they
are kept out of the history's digests (`proxy.dialects.projection.Marks`) and put back here:

- every breakpoint on a message that goes upstream as it was is put back where it was;
- if the client had breakpoints on messages a compaction rewrote or dropped, the last of them is
  moved to the end of the compacted prefix (its last message compactd made), so the prefix that
  every later turn replays byte for byte ends on a breakpoint and is read from cache;
- never more breakpoints than the client sent (at most four on Anthropic: one moves, the rest
  are dropped with their messages), and never in an order the API refuses (a longer TTL after a
  shorter one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.dialects.projection import Marks, Path, put_mark, ttl_seconds

Place = Callable[[list[Any], str, Any], bool]
"""Puts a breakpoint on the last part of these items that may carry one; False if none may."""


@dataclass
class Breakpoints:
    """Collects the sent messages' items, then puts the client's breakpoints on them."""

    marks: Marks
    default_ttl: int
    place: Place
    sent: list[tuple[int | None, list[Any]]] = field(default_factory=list)

    def add(self, original: int | None, items: list[Any]) -> None:
        """One sent message's items (changed in place by `apply`) and, if it is one of the
        request's own messages unchanged, its index in the request's projection."""
        self.sent.append((original, items))

    def apply(self) -> None:
        """Put every kept breakpoint back and move the last lost one (see the module doc)."""
        per = self.marks.per_message
        kept = {o for o, _ in self.sent if o is not None}
        order: list[tuple[int, int]] = []  # (sent index, ttl) of each breakpoint put back
        for n, (original, items) in enumerate(self.sent):
            if original is None or original >= len(per):
                continue
            for path, value in per[original]:
                put_mark(items, path, self.marks.key, value)
                order.append((n, ttl_seconds(value, self.default_ttl)))
        lost = [v for j, found in enumerate(per) if j not in kept for _, v in found]
        if not lost:
            return
        target = next(
            (n for n in range(len(self.sent) - 1, -1, -1) if self.sent[n][0] is None), None
        )
        if target is None:
            return
        value = lost[-1]
        ttl = ttl_seconds(value, self.default_ttl)
        # Longer-lived breakpoints must come first: the moved one must fit between its
        # neighbours (those in its own message come before it, it goes last).
        if any(n <= target and t < ttl for n, t in order):
            return
        if any(n > target and t > ttl for n, t in order):
            return
        self.place(self.sent[target][1], self.marks.key, value)


def mark_path(items: list[Any], path: Path, key: str, value: Any) -> None:
    """`put_mark` re-exported for the adapters' `Place` functions."""
    put_mark(items, path, key, value)
