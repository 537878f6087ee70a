"""Restore compacted messages to the originals their reference ids stand for.

Semantics follow context-compression-engine's `uncompress`: a message carrying refs is replaced by
the originals found for them (in ref order); if none is found the message is kept and its ids are
reported missing; with `recursive`, expansion repeats (refs inside restored originals, e.g. from a
chain of providers) up to ten rounds, stopping early when a round expands nothing. Lookups are
batched: one call per round, so a store answers with one round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass

from proxy.providers.base import Message
from proxy.providers.units import refs_in

MAX_DEPTH = 10

Lookup = Mapping[str, list[Message]] | Callable[[list[str]], Mapping[str, list[Message]]]
AsyncLookup = Callable[[list[str]], Awaitable[Mapping[str, list[Message]]]]


@dataclass(frozen=True)
class UncompressResult:
    """Restored messages and what happened to each input message."""

    messages: list[Message]
    messages_expanded: int
    """Messages replaced by (some of) their originals, summed over rounds."""
    messages_passthrough: int
    """Input messages that carried no reference and were kept as they were."""
    missing_ids: tuple[str, ...]
    """Reference ids no original was found for, in order of first appearance."""


@dataclass(frozen=True)
class _Round:
    messages: list[Message]
    expanded: int
    passthrough: int
    missing: list[str]


def uncompress(
    messages: Sequence[Message], lookup: Lookup, recursive: bool = False
) -> UncompressResult:
    """Replace every message carrying refs by its originals from `lookup` (a map or a function)."""
    rounds = _rounds(messages, recursive)
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
    messages: Sequence[Message], lookup_async: AsyncLookup, recursive: bool = False
) -> UncompressResult:
    """`uncompress` with an async batch lookup (e.g. the store)."""
    rounds = _rounds(messages, recursive)
    try:
        wanted = next(rounds)
        while True:
            wanted = rounds.send(await lookup_async(wanted))
    except StopIteration as done:
        result: UncompressResult = done.value
        return result


def _rounds(
    messages: Sequence[Message], recursive: bool
) -> Generator[list[str], Mapping[str, list[Message]], UncompressResult]:
    """The expansion loop, shared by both entry points: yields the ids it needs, gets originals."""
    current, rounds = list(messages), []
    for _ in range(MAX_DEPTH if recursive else 1):
        wanted = wanted_ids(current)
        if not wanted:
            break
        step = expand_round(current, (yield wanted))
        rounds.append(step)
        current = step.messages
        if not step.expanded:
            break
    return _combine(messages, current, rounds)


def wanted_ids(messages: Sequence[Message]) -> list[str]:
    """Every reference id the messages carry, once each, in order."""
    return list(dict.fromkeys(ref for m in messages for ref in refs_in(m)))


def expand_round(messages: Sequence[Message], found: Mapping[str, list[Message]]) -> _Round:
    """One level of expansion using the originals in `found`."""
    out: list[Message] = []
    expanded = passthrough = 0
    missing: list[str] = []
    for message in messages:
        refs = refs_in(message)
        if not refs:
            passthrough += 1
            out.append(message)
            continue
        known = [r for r in refs if r in found]
        missing.extend(r for r in refs if r not in found)
        # A summary may quote the marker of a message it summarized; that ref is restored
        # through its parent, not a second time.
        nested = {r for ref in known for m in found[ref] for r in refs_in(m)}
        outer = [r for r in known if r not in nested]
        if not outer:
            out.append(message)
            continue
        expanded += 1
        for ref in outer:
            out.extend(found[ref])
    return _Round(out, expanded, passthrough, missing)


def _combine(
    messages: Sequence[Message], current: list[Message], rounds: list[_Round]
) -> UncompressResult:
    missing = list(dict.fromkeys(r for step in rounds for r in step.missing))
    return UncompressResult(
        messages=current,
        messages_expanded=sum(step.expanded for step in rounds),
        messages_passthrough=rounds[0].passthrough if rounds else len(messages),
        missing_ids=tuple(missing),
    )
