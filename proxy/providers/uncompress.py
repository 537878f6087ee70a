"""Restore compacted messages to the originals their reference ids stand for.

Semantics follow context-compression-engine's `uncompress`: a message carrying refs is replaced by
the originals found for them (in ref order); if none is found the message is kept and its ids are
reported missing. With `recursive`, expansion repeats on what it restored (refs inside restored
originals: a chain of providers' in-memory `verbatim`, or a store written before refs were
resolved to originals) with no depth limit: a ref is never expanded inside its own expansion, so
a cycle ends, and its id is reported missing, like every other id left unresolved. Lookups are
batched: one call per round, each id asked for once, so a store answers with one round trip.

A restore is bounded (`Bounds`): past `max_messages` messages or `max_bytes` bytes of restored
originals it stops with RestoreTooLargeError, and a recursive one expands at most `max_depth`
rounds (the refs left are reported missing). `refs_of(message, depth)` says which of a message's
markers count (the API counts only those compactd wrote: `proxy.chat.refscope`).

A message may also quote a marker it does not stand for (a summary quoting an earlier summary's
marker). Such a ref is not expanded a second time: it is nested in another of the message's refs,
either because that ref's originals carry it (in-memory `verbatim`) or because its originals are
a run inside that ref's originals (a store, where every ref maps to original messages).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field

from proxy.errors import RestoreTooLargeError
from proxy.providers.base import Message
from proxy.providers.units import refs_in

Lookup = Mapping[str, list[Message]] | Callable[[list[str]], Mapping[str, list[Message]]]
AsyncLookup = Callable[[list[str]], Awaitable[Mapping[str, list[Message]]]]
RefsOf = Callable[[Message, int], list[str]]
"""The refs of a message that count, at a depth (0: the caller's own messages)."""


def _all_refs(message: Message, depth: int) -> list[str]:
    del depth
    return refs_in(message)


@dataclass(frozen=True)
class Bounds:
    """How large a restore may grow: messages, bytes of restored originals, rounds."""

    max_messages: int = 1_000_000
    max_bytes: int = 1 << 40
    max_depth: int = 1_000_000
    refs_of: RefsOf = field(default=_all_refs)


UNBOUNDED = Bounds()


class _Tally:
    """Messages and restored bytes so far, raising past the bounds (sizes cached per ref)."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.bytes = 0
        self._sizes: dict[str, int] = {}

    def add(self, ref: str, originals: Sequence[Message], messages: int) -> None:
        if ref not in self._sizes:
            self._sizes[ref] = sum(len(json.dumps(m, ensure_ascii=False)) for m in originals)
        self.bytes += self._sizes[ref]
        if messages > self.bounds.max_messages:
            raise RestoreTooLargeError(f"the restore passes {self.bounds.max_messages} messages")
        if self.bytes > self.bounds.max_bytes:
            raise RestoreTooLargeError(f"the restore passes {self.bounds.max_bytes} bytes")


@dataclass(frozen=True)
class UncompressResult:
    """Restored messages and what happened to each input message."""

    messages: list[Message]
    messages_expanded: int
    """Messages replaced by (some of) their originals, summed over rounds."""
    messages_passthrough: int
    """Input messages that carried no reference and were kept as they were."""
    missing_ids: tuple[str, ...]
    """Reference ids left unresolved (no original found, or a cycle), in order of appearance."""


@dataclass(frozen=True)
class _Item:
    message: Message
    within: frozenset[str]
    """The refs this message was restored from (never expanded again inside themselves)."""


@dataclass(frozen=True)
class _Round:
    items: list[_Item]
    expanded: int
    passthrough: int
    missing: list[str]


def uncompress(
    messages: Sequence[Message], lookup: Lookup, recursive: bool = False, bounds: Bounds = UNBOUNDED
) -> UncompressResult:
    """Replace every message carrying refs by its originals from `lookup` (a map or a function)."""
    rounds = _rounds(messages, recursive, bounds)
    try:
        wanted = next(rounds)
        while True:
            found = (
                lookup(wanted)
                if callable(lookup)
                else {k: lookup[k] for k in wanted if k in lookup}
            )
            wanted = rounds.send(found)
    except StopIteration as done:
        result: UncompressResult = done.value
        return result


async def uncompress_async(
    messages: Sequence[Message],
    lookup_async: AsyncLookup,
    recursive: bool = False,
    bounds: Bounds = UNBOUNDED,
) -> UncompressResult:
    """`uncompress` with an async batch lookup (e.g. the store)."""
    rounds = _rounds(messages, recursive, bounds)
    try:
        wanted = next(rounds)
        while True:
            wanted = rounds.send(await lookup_async(wanted))
    except StopIteration as done:
        result: UncompressResult = done.value
        return result


def _rounds(
    messages: Sequence[Message], recursive: bool, bounds: Bounds
) -> Generator[list[str], Mapping[str, list[Message]], UncompressResult]:
    """The expansion loop, shared by both entry points: yields the ids it needs, gets originals."""
    current = [_Item(m, frozenset()) for m in messages]
    known: dict[str, list[Message]] = {}
    asked: set[str] = set()
    rounds: list[_Round] = []
    tally = _Tally(bounds)
    while True:
        depth = len(rounds)
        refs = dict.fromkeys(r for i in current for r in bounds.refs_of(i.message, depth))
        wanted = [r for r in refs if r not in asked]
        if wanted:
            asked.update(wanted)
            known.update((yield wanted))
        step = expand_round(current, known, depth, tally)
        rounds.append(step)
        current = step.items
        if not recursive or not step.expanded:
            break
        if len(rounds) >= bounds.max_depth:
            # Stopped with markers left: their ids are reported as not restored.
            left = dict.fromkeys(r for i in current for r in bounds.refs_of(i.message, depth + 1))
            rounds.append(_Round(current, 0, 0, list(left)))
            break
    return _combine(messages, current, rounds)


def wanted_ids(messages: Sequence[Message]) -> list[str]:
    """Every reference id the messages carry, once each, in order."""
    return list(dict.fromkeys(ref for m in messages for ref in refs_in(m)))


def expand_round(
    items: Sequence[_Item],
    found: Mapping[str, list[Message]],
    depth: int = 0,
    tally: _Tally | None = None,
) -> _Round:
    """One level of expansion using the originals in `found`."""
    tally = tally or _Tally(UNBOUNDED)
    out: list[_Item] = []
    expanded = passthrough = 0
    missing: list[str] = []
    for item in items:
        refs = tally.bounds.refs_of(item.message, depth)
        if not refs:
            passthrough += 1
            out.append(item)
            continue
        usable = [r for r in refs if r in found and r not in item.within]
        outer = _outer(usable, found)
        if not outer:
            missing.extend(refs)
            out.append(item)
            continue
        missing.extend(r for r in refs if r not in found or r in item.within)
        expanded += 1
        within = item.within | set(outer)
        for ref in outer:
            tally.add(ref, found[ref], len(out) + len(found[ref]))
            out.extend(_Item(m, within) for m in found[ref])
    return _Round(out, expanded, passthrough, missing)


def _outer(refs: Sequence[str], found: Mapping[str, list[Message]]) -> list[str]:
    """The refs a message stands for, minus those nested in another of them."""
    nested = {r for ref in refs for m in found[ref] for r in refs_in(m)}
    for a, ref in enumerate(refs):
        for b, other in enumerate(refs):
            if a != b and other not in nested and _inside(found[ref], found[other], a > b):
                nested.add(ref)
                break
    return [r for r in refs if r not in nested]


def _inside(inner: list[Message], outer: list[Message], later: bool) -> bool:
    """Whether `inner` is a run of `outer` (when they are equal, only the later ref is inside)."""
    if len(inner) > len(outer) or (len(inner) == len(outer) and not later):
        return False
    n = len(inner)
    return any(outer[i : i + n] == inner for i in range(len(outer) - n + 1))


def _combine(
    messages: Sequence[Message], current: list[_Item], rounds: list[_Round]
) -> UncompressResult:
    missing = list(dict.fromkeys(r for step in rounds for r in step.missing))
    return UncompressResult(
        messages=[item.message for item in current],
        messages_expanded=sum(step.expanded for step in rounds),
        messages_passthrough=rounds[0].passthrough if rounds else len(messages),
        missing_ids=tuple(missing),
    )
