"""A long conversation's items projected once: each turn projects only the items it adds.

An adapter projects an API's items onto chat messages in one pass that looks at neighbours (a
call and the outputs after it, a reasoning reference and the run after it, a tool result and
the `tool_use` before it). The pass over items `[0, n)` reaches a point `p` (the start of the
projection of item `c`) where everything it decided before `p` depended only on items up to
`c`, and from where it goes on as a pass over items `[c, n)` alone would: a *restart*. So the
next turn, whose first items are this turn's (the same objects: `proxy.chat.bodycache`), keeps the
projection before the last restart whose item it shares and projects only from there. The
adapter says where its pass restarts (`Projected.restarts`) and which items reach back over
everything before them (`Projected.reach`: Anthropic's compaction blocks, which supersede the
history before them): a turn that adds one is projected whole.

The result is what projecting the whole body gives, message for message (the hypothesis state
machines in tests/dialects/test_replay_fast.py check it against `project` on growing sessions).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.dialects.projection import Marks, Message

LONG_TAIL = 1000
"""Items projected off the event loop past this many (Python work per item)."""


@dataclass(frozen=True)
class Projected:
    """An API's items projected onto chat messages, with where the pass may start again."""

    messages: list[Message]
    marks: Marks
    origins: list[int]
    """The index of the item each projected message begins with."""
    restarts: list[int]
    """Projected messages (ascending) at which the pass may start afresh (see module doc)."""
    reach: int = -1
    """The last item whose projection changes those before it (-1: none)."""

    def joined(self, p: int, tail: Projected) -> Projected:
        """These messages before `p`, then `tail` (the items from `origins[p]` projected)."""
        c = self.origins[p]
        return Projected(
            [*self.messages[:p], *tail.messages],
            Marks(self.marks.key, [*self.marks.per_message[:p], *tail.marks.per_message]),
            [*self.origins[:p], *(o + c for o in tail.origins)],
            [
                *self.restarts[: bisect.bisect_left(self.restarts, p)],
                *(r + p for r in tail.restarts),
            ],
            self.reach,
        )


class Keeper(Protocol):
    """Where a body's projection is kept for the next turn (`proxy.chat.bodycache.BodyCache`)."""

    def recall(self, items: Sequence[Any], name: str) -> Any:
        """What was kept under `name` with the body whose array is `items`, or None."""

    def previous(self, items: Sequence[Any], name: str) -> tuple[Any, int] | None:
        """What was kept under `name` with the body this one was built from, and how many of
        the leading elements of `items` that body's array had (the same objects)."""

    def keep(
        self,
        items: Sequence[Any],
        name: str,
        value: Any,
        messages: Sequence[Message] | None = None,
        reused: tuple[Sequence[Message], int] | None = None,
    ) -> None:
        """Keep `value` (and `messages` as a history) with the body whose array is `items`."""


ItemsProjector = Callable[[Sequence[Any]], "Projected | None"]
MayStart = Callable[[Sequence[Any], int], bool]
"""Whether the pass may start at item `c` of these items, beyond what `restarts` says."""


@dataclass(frozen=True)
class Incremental:
    """One API's projection, reusing the last turn's (see the module doc)."""

    name: str
    field: str
    project_items: ItemsProjector
    may_start: MayStart

    async def read(self, body: Mapping[str, Any], bodies: Keeper) -> Projected | None:
        """The body's history projected (long ones in a thread), kept with the body."""
        items = body.get(self.field)
        if not isinstance(items, list):
            return None
        found: Projected | None = bodies.recall(items, self.name)
        if found is not None:
            return found
        old, p = self._reusable(items, bodies)
        start = 0 if old is None else old.origins[p]
        part = items[start:] if start else items
        if len(part) > LONG_TAIL:
            projected = await asyncio.to_thread(self.project_items, part)
        else:
            projected = self.project_items(part)
        if projected is not None and old is not None:
            if projected.reach >= 0:  # it changes what was reused: all of it afresh
                return await self._whole(items, bodies)
            projected = old.joined(p, projected)
        if projected is None:
            return None
        reused = None if old is None else (old.messages, p)
        bodies.keep(items, self.name, projected, projected.messages, reused)
        return projected

    async def _whole(self, items: list[Any], bodies: Keeper) -> Projected | None:
        if len(items) > LONG_TAIL:
            projected = await asyncio.to_thread(self.project_items, items)
        else:
            projected = self.project_items(items)
        if projected is not None:
            bodies.keep(items, self.name, projected, projected.messages)
        return projected

    def _reusable(self, items: list[Any], bodies: Keeper) -> tuple[Projected | None, int]:
        """The last turn's projection and the restart to project from, if any past the first."""
        previous = bodies.previous(items, self.name)
        if previous is None:
            return None, 0
        old, shared = previous
        if not isinstance(old, Projected):
            return None, 0
        for p in reversed(old.restarts):
            c = old.origins[p]
            if p <= 0 or c <= old.reach:
                break
            if c < shared and self.may_start(items, c):
                return old, p
        return None, 0
