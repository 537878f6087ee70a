"""Parse a long conversation's next turn by parsing only what is new in it.

A client resends the whole history on every turn, and an SDK serializes the same history to the
same bytes: the next turn's body is the previous body with a few messages added before the
messages array's closing bracket. So for a large body we look for a recent body (same leading
bytes) whose bytes up to its last message are a prefix of this one; then only the new messages
are parsed (orjson over a few KB instead of the whole body), and the earlier messages are the
same objects as last time. Everything per-message that is cached by content (token counts)
then finds its strings' hashes already computed: the turn costs its new messages, end to end.

The array is found by a string-aware scan (`proxy.runtime.jsonspan`), whatever keys come before or
after it and however many brackets they hold (an agent's tool schemas); it is `messages` (chat
completions, Anthropic messages) or `input` (the Responses API). When the bytes around the array
are those of the body extended, what was derived from them (`memo`) is kept too: a replayed
turn's work does not grow with the number of tools it sends.

Soundness: the reused prefix is byte-identical and ends at an element boundary of the array;
the new part is accepted only if `[` + new + `]` parses as an array and the rest of the object
(everything around the array) parses with that key holding `[]`; otherwise, or for any other
shape, the body is parsed whole, as before. Shared message objects are read, never
mutated (the request path treats messages as immutable values).

Memory is bounded by the bytes of the bodies kept (`max_bytes`, least recently used first out).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from proxy.runtime.digest import Message, RollingPrefixes, message_digest, prefix_digests
from proxy.runtime.exactjson import holds_wide_int, may_hold_wide_int
from proxy.runtime.jsonspan import array_span, close
from proxy.tokens.counter import REPLY_PRIMING, TokenCounter

T = TypeVar("T")

MIN_BYTES = 64 * 1024
"""Smaller bodies are parsed whole: orjson is faster than any bookkeeping for them."""
KEY_BYTES = 512
"""Bodies are looked up by their first bytes (the fields before the messages, the system
prompt's start); several conversations may share them."""
PER_KEY = 4
_WS = b" \t\r\n"
_WIDE_OVERLAP = 20
"""Bytes before the new ones looked at again: a run of digits may begin in them."""
FIELDS = ("messages", "input")
"""The arrays a conversation grows in: chat completions' and Anthropic's, the Responses API's."""


@dataclass(eq=False)  # identity: entries hold whole bodies
class _Seen:
    """A body parsed before, and where its messages array lies in its bytes."""

    raw: bytes
    array: str
    """The key of the array (one of FIELDS)."""
    start: int
    """Index just after the array's `[`."""
    cut: int
    """End of the array's last element (before any whitespace and the `]`)."""
    end: int
    """Index of the array's closing `]`."""
    body: dict[str, Any]
    digests: list[str] = field(default_factory=list)
    """Digests of the first messages, filled in when a decision first needs them."""
    prefixes: RollingPrefixes = field(default_factory=RollingPrefixes)
    """Their prefix digests (what a checkpoint is looked up by), filled in likewise."""
    counts: dict[str, list[int]] = field(default_factory=dict)
    """Encoding -> running token totals of the first messages: [i] is what messages [0, i)
    cost, without the reply priming (so one more item than messages counted)."""
    parsed: int = 0
    """Bytes handed to orjson to build this entry from the one it extends."""
    narrow: int = 0
    """The first `narrow` bytes of `raw` hold no integer beyond 64 bits (`holds_wide_int`)."""
    memo: dict[Any, Any] = field(default_factory=dict)
    """What callers derived from the bytes around the array (`BodyCache.memo`): kept while
    they stay the same."""


class BodyCache:
    """`parse(raw)`: `orjson.loads(raw)`, reusing the parse of a recent body it extends."""

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._seen: OrderedDict[bytes, list[_Seen]] = OrderedDict()
        self._by_messages: dict[int, _Seen] = {}
        """Entries by the id of their messages list (which they keep alive)."""
        self.hits = 0
        self.misses = 0
        self.parsed_bytes = 0
        """Bytes handed to orjson, in all: the measure of what a turn costs to read."""

    def entries(self) -> int:
        """Bodies held (their bytes, at most the configured size, are `held_bytes`)."""
        return len(self._seen)

    @property
    def held_bytes(self) -> int:
        """Bytes of the bodies held."""
        return self._bytes

    def parse(self, raw: bytes) -> Any:
        """The parsed body (raises orjson.JSONDecodeError as orjson.loads would)."""
        self.parsed_bytes += len(raw)
        if len(raw) < MIN_BYTES or self._max_bytes <= 0:
            return orjson.loads(raw)
        key = raw[:KEY_BYTES]
        entries = self._seen.get(key, [])
        # One whose fields are the same bytes first (agents sharing a prompt, other tools).
        for found in itertools.chain(
            (_same_fields(e, raw) for e in entries), (_scanned(e, raw) for e in entries)
        ):
            if found is not None:
                self.hits += 1
                # What was parsed: the new messages, and the fields only if their bytes changed.
                self.parsed_bytes += found.parsed - len(raw)
                self._remember(key, found)
                return found.body
        self.misses += 1
        body = orjson.loads(raw)
        if isinstance(body, dict):
            name = next((f for f in FIELDS if isinstance(body.get(f), list)), None)
            located = None if name is None else _locate(raw, body, name)
            if located is not None:
                self._remember(key, located)
        return body

    def memo(self, items: Sequence[Any], key: Any, make: Callable[[], T]) -> T:
        """`make()`, remembered with the body `items` (its array, from `parse`) came from for as
        long as the bytes around its array stay the same (the tools, the model, the options):
        only for values that depend on nothing else."""
        seen = self._entry(items)
        if seen is None:
            return make()
        if key not in seen.memo:
            seen.memo[key] = make()
        value: T = seen.memo[key]
        return value

    def digests(self, messages: Sequence[Message]) -> list[str]:
        """`[message_digest(m) for m in messages]`, computing only those of messages new since
        a body this one extends (when `messages` came from `parse`)."""
        seen = self._entry(messages)
        if seen is None:
            return [message_digest(m) for m in messages]
        known = seen.digests
        known.extend(message_digest(m) for m in messages[len(known) :])
        return list(known)

    def undigested(self, messages: Sequence[Message]) -> int:
        """How many of `messages` `digests` would compute (not known from an earlier body)."""
        seen = self._entry(messages)
        return len(messages) - (0 if seen is None else len(seen.digests))

    def prefixes(self, messages: Sequence[Message], digests: Sequence[str]) -> list[str]:
        """`prefix_digests(digests)`, where `digests` are `self.digests(messages)`, hashing
        only the prefixes of messages new since a body this one extends."""
        seen = self._entry(messages)
        if seen is None or seen.digests != digests:
            return prefix_digests(digests)
        rolling = seen.prefixes
        rolling.extend(digests[len(rolling.values) :])
        return list(rolling.values)

    async def count(
        self, messages: Sequence[Message], counter: TokenCounter, *, in_thread: bool
    ) -> int:
        """`counter.count_messages(messages)`, counting only messages new since a body this one
        extends; a history not known yet is counted whole (in a thread if `in_thread`, unless
        every message's count is cached)."""
        seen = self._entry(messages)
        known = [] if seen is None else seen.counts.get(counter.encoding_name, [])
        if known:
            new = counter.message_counts(messages[len(known) - 1 :])
        else:
            found = counter.cached_counts(messages)
            if found is None and in_thread:
                found = await asyncio.to_thread(counter.message_counts, messages)
            new = counter.message_counts(messages) if found is None else found
            known = [0]
        # A new list: the entry of the body this one extends shares the old one.
        running = [*known[:-1], *itertools.accumulate(new, initial=known[-1])]
        if seen is not None:
            seen.counts[counter.encoding_name] = running
        return running[-1] + REPLY_PRIMING

    def tokens_from(self, messages: Sequence[Message], encoding: str, start: int) -> int | None:
        """What messages [start:] cost with this encoding (without the reply priming), if `count`
        counted `messages` (from `parse`) with it; else None."""
        seen = self._entry(messages)
        running = None if seen is None else seen.counts.get(encoding)
        if running is None or len(running) != len(messages) + 1 or not 0 <= start < len(running):
            return None
        return running[-1] - running[start]

    def holds_wide_int(self, messages: Sequence[Message], raw: bytes) -> bool:
        """`exactjson.holds_wide_int(raw)`, where `raw` is the body whose messages are
        `messages`: looked for only in the bytes new since a body this one extends (when
        `messages` came from `parse`) that was found to hold none."""
        seen = self._entry(messages)
        start = 0 if seen is None else max(0, seen.narrow - _WIDE_OVERLAP)
        wide = may_hold_wide_int(raw[start:] if start else raw) and holds_wide_int(raw)
        if seen is not None and not wide:
            seen.narrow = len(raw)
        return wide

    def narrow(self, messages: Sequence[Message], raw: bytes) -> bool:
        """Whether `raw` (whose messages are `messages`, from `parse`) is known to hold no
        integer beyond 64 bits, without looking at it: the body it extends held none and
        neither do its new bytes. False means not known."""
        seen = self._entry(messages)
        return seen is not None and seen.narrow >= len(raw)

    def _entry(self, messages: Sequence[Message]) -> _Seen | None:
        """The entry whose body's messages list is `messages` itself."""
        seen = self._by_messages.get(id(messages))
        return seen if seen is not None and seen.body[seen.array] is messages else None

    def _remember(self, key: bytes, seen: _Seen) -> None:
        old = self._seen.pop(key, [])
        # The new body supersedes those it extends with the same fields around the messages
        # (the same conversation, turns earlier); one with other fields (tools) stays.
        kept = [e for e in old if not _superseded(e, seen)]
        kept = kept[: PER_KEY - 1]
        self._forget([e for e in old if e not in kept])
        self._bytes += len(seen.raw)
        self._seen[key] = [seen, *kept]
        self._by_messages[id(seen.body[seen.array])] = seen
        while self._bytes > self._max_bytes and self._seen:
            _, dropped = self._seen.popitem(last=False)
            self._forget(dropped)

    def _forget(self, entries: list[_Seen]) -> None:
        for e in entries:
            self._bytes -= len(e.raw)
            if self._by_messages.get(id(e.body[e.array])) is e:
                del self._by_messages[id(e.body[e.array])]


def _superseded(old: _Seen, new: _Seen) -> bool:
    """Whether `new` is `old` with messages added and the same bytes around them."""
    tail = memoryview(old.raw)[old.end + 1 :]
    return (
        len(new.raw) - new.end == len(tail) + 1
        and new.raw.startswith(memoryview(old.raw)[: old.cut])
        and new.raw.endswith(tail)
    )


def _before_space(raw: bytes, end: int, floor: int) -> int:
    """The index after the last non-whitespace byte before `end` (not below `floor`)."""
    while end > floor and raw[end - 1] in _WS:
        end -= 1
    return end


def _fields(raw: bytes, name: str, start: int, end: int) -> dict[str, Any] | None:
    """The object around the array (its `name` emptied), if those bytes parse as one."""
    try:
        rest = orjson.loads(raw[:start] + b"]" + raw[end + 1 :])
    except orjson.JSONDecodeError:
        return None
    return rest if isinstance(rest, dict) and rest.get(name) == [] else None


def _locate(raw: bytes, body: dict[str, Any], name: str) -> _Seen | None:
    """Where the `name` array of `raw` (parsed whole as `body`) lies, verified."""
    if not body[name]:
        return None
    span = array_span(raw, name)
    if span is None:
        return None
    start, end = span
    fields = _fields(raw, name, start, end)
    expected = {k: v for k, v in body.items() if k != name}
    if fields is None or {k: v for k, v in fields.items() if k != name} != expected:
        return None
    return _Seen(raw, name, start, _before_space(raw, end, start), end, body)


def _extends(seen: _Seen, raw: bytes) -> bool:
    """Whether `raw` begins with `seen`'s bytes up to its last message."""
    # bytes.startswith compares with memcmp (a memoryview == goes item by item).
    return len(raw) > seen.cut and raw.startswith(memoryview(seen.raw)[: seen.cut])


def _same_fields(seen: _Seen, raw: bytes) -> _Seen | None:
    """`raw` parsed by extending `seen`, if it is `seen`'s bytes with new messages added and
    the same bytes after them."""
    if not _extends(seen, raw):
        return None
    tail = memoryview(seen.raw)[seen.end + 1 :]
    end = len(raw) - len(tail) - 1
    if end < seen.cut or raw[end] != ord("]") or not raw.endswith(tail):
        return None
    found = _with_new(seen, raw, end, seen.body, same_tail=True)
    if found is not None:
        found.memo = seen.memo
    return found


def _scanned(seen: _Seen, raw: bytes) -> _Seen | None:
    """`raw` parsed by extending `seen`, if it is `seen`'s bytes with new messages added and
    other bytes after them: the scan from the last known message finds the array's end."""
    if not _extends(seen, raw):
        return None
    cut = seen.cut
    end = close(raw, cut)
    fields = None if end < 0 else _fields(raw, seen.array, seen.start, end)
    if fields is None:
        return None
    found = _with_new(seen, raw, end, fields)
    if found is not None:
        found.parsed += len(raw) - (end - seen.start)
    return found


def _with_new(
    seen: _Seen, raw: bytes, end: int, fields: dict[str, Any], *, same_tail: bool = False
) -> _Seen | None:
    """The body of `raw`: `seen`'s messages, those between its cut and `end`, and `fields`."""
    middle = raw[seen.cut : end].strip(_WS)
    new: Any = []
    if middle:
        if middle[:1] != b",":
            return None
        try:
            new = orjson.loads(b"[" + middle[1:] + b"]")
        except orjson.JSONDecodeError:
            return None
        if not isinstance(new, list) or not new:
            return None
    old = seen.body[seen.array]
    messages = old + new if new else list(old)
    body = {k: messages if k == seen.array else v for k, v in fields.items()}
    cut = _before_space(raw, end, seen.cut)
    digests, prefixes, counts = list(seen.digests), seen.prefixes.copy(), dict(seen.counts)
    # Bytes up to the old cut are the same, so what was found of them holds (the array's end
    # and the fields after it may have changed); the new ones are looked at now, while the
    # entry is this request's (a concurrent turn may supersede it before its decision).
    narrow = min(seen.narrow, seen.cut)
    # A tail the whole old body vouched for needs no second look (no run of digits crosses
    # the array's `]`): the bytes looked at are the new messages', however long the tools are.
    stop = end if same_tail and seen.narrow >= len(seen.raw) else len(raw)
    if narrow and not may_hold_wide_int(raw[max(0, narrow - _WIDE_OVERLAP) : stop]):
        narrow = len(raw)
    found = _Seen(
        raw, seen.array, seen.start, cut, end, body, digests, prefixes, counts, narrow=narrow
    )
    found.parsed = len(middle) + 2 if middle else 0
    return found
