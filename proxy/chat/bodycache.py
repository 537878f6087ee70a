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

A client that moves its cache breakpoints (Claude Code marks its newest messages) changes the
last messages of the previous body, not only the bytes after them: then the longest run of the
previous body's whole messages this one begins with is reused (`bodyentry.cut_back`).

What callers derive from the array itself (an API's items projected onto chat messages:
`proxy.dialects.incremental`) is kept with the body (`keep`), handed to the next turn's body with
how many leading elements the two share (`previous`), and a list derived so is a history like
the array itself: its digests, prefix digests and counts carry over for its reused messages.

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
from typing import Any, Protocol, TypeVar

import orjson

from proxy.chat.bodyentry import (
    WIDE_OVERLAP,
    Entry,
    History,
    cut_back,
    extends,
    locate,
    same_fields,
    scanned,
    superseded,
)
from proxy.runtime.digest import Message, message_digest, prefix_digests
from proxy.runtime.exactjson import holds_wide_int, may_hold_wide_int
from proxy.tokens.counter import REPLY_PRIMING

T = TypeVar("T")

MIN_BYTES = 64 * 1024
"""Smaller bodies are parsed whole: orjson is faster than any bookkeeping for them."""
KEY_BYTES = 512
"""Bodies are looked up by their first bytes (the fields before the messages, the system
prompt's start); several conversations may share them."""
PER_KEY = 4
FIELDS = ("messages", "input")
"""The arrays a conversation grows in: chat completions' and Anthropic's, the Responses API's."""


class Counter(Protocol):
    """What `BodyCache.count` needs of a counter (`TokenCounter`, `NativeCounter`)."""

    @property
    def encoding_name(self) -> str:
        """The key its counts are kept under (an encoding, and the API for a projection)."""

    def message_counts(self, messages: Sequence[Message]) -> list[int]:
        """Each message's tokens."""

    def cached_counts(self, messages: Sequence[Message]) -> list[int] | None:
        """`message_counts` if every count is cached, else None."""


class BodyCache:
    """`parse(raw)`: `orjson.loads(raw)`, reusing the parse of a recent body it extends."""

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._seen: OrderedDict[bytes, list[Entry]] = OrderedDict()
        self._by_messages: dict[int, Entry] = {}
        """Entries by the id of their messages list (which they keep alive), and of the lists
        derived from it (`keep`)."""
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
        # One whose fields are the same bytes first (agents sharing a prompt, other tools);
        # then one whose last messages the client changed (it moved its cache breakpoints).
        extended = [extends(e, raw) for e in entries]
        tries = ((same_fields, True), (scanned, True), (cut_back, False))
        attempts = (
            (f(e, raw), e) for f, want in tries for e, ext in zip(entries, extended, strict=True)
            if ext is want
        )  # fmt: skip
        for found, source in attempts:
            if found is not None:
                self.hits += 1
                # What was parsed: the new messages, and the fields only if their bytes changed.
                self.parsed_bytes += found.parsed - len(raw)
                self._remember(key, found, source)
                return found.body
        self.misses += 1
        body = orjson.loads(raw)
        if isinstance(body, dict):
            name = next((f for f in FIELDS if isinstance(body.get(f), list)), None)
            located = None if name is None else locate(raw, body, name)
            if located is not None:
                self._remember(key, located)
        return body

    def memo(self, items: Sequence[Any], key: Any, make: Callable[[], T]) -> T:
        """`make()`, remembered with the body `items` (its array, from `parse`, or a list kept
        with it) came from for as long as the bytes around its array stay the same (the tools,
        the model, the options): only for values that depend on nothing else."""
        found = self._entry(items)
        if found is None:
            return make()
        seen = found[0]
        if key not in seen.memo:
            seen.memo[key] = make()
        value: T = seen.memo[key]
        return value

    def recall(self, items: Sequence[Any], name: str) -> Any:
        """What `keep` kept under `name` with the body whose array is `items`, or None."""
        seen = self._raw_entry(items)
        return None if seen is None else seen.derived.get(name)

    def previous(self, items: Sequence[Any], name: str) -> tuple[Any, int] | None:
        """What was kept under `name` with the body this one was built from, and how many of
        the leading elements of `items` that body's array had (the same objects)."""
        seen = self._raw_entry(items)
        return None if seen is None else seen.carried.get(name)

    def keep(
        self,
        items: Sequence[Any],
        name: str,
        value: Any,
        messages: Sequence[Message] | None = None,
        reused: tuple[Sequence[Message], int] | None = None,
    ) -> None:
        """Keep `value` under `name` with the body whose array is `items` (from `parse`), and
        `messages` (derived from it) as a history `digests`, `prefixes` and `count` know:
        `reused` = (a list kept so with the body this one was built from, n) when the first n
        messages are that list's, so what is known of them carries over."""
        seen = self._raw_entry(items)
        if seen is None:
            return
        seen.derived[name] = value
        seen.carried.pop(name, None)
        if messages is None:
            return
        old = None if reused is None else seen.lists_before.get(id(reused[0]))
        history = History()
        if old is not None and reused is not None and old[0] is reused[0]:
            history = old[1].head(reused[1])
        if not seen.carried:
            seen.lists_before = {}
        seen.lists[id(messages)] = (messages, history)
        self._by_messages[id(messages)] = seen

    def digests(self, messages: Sequence[Message]) -> list[str]:
        """`[message_digest(m) for m in messages]`, computing only those of messages new since
        a body this one extends (when `messages` came from `parse`)."""
        found = self._entry(messages)
        if found is None:
            return [message_digest(m) for m in messages]
        known = found[1].digests
        known.extend(message_digest(m) for m in messages[len(known) :])
        return list(known)

    def undigested(self, messages: Sequence[Message]) -> int:
        """How many of `messages` `digests` would compute (not known from an earlier body)."""
        found = self._entry(messages)
        return len(messages) - (0 if found is None else len(found[1].digests))

    def prefixes(self, messages: Sequence[Message], digests: Sequence[str]) -> list[str]:
        """`prefix_digests(digests)`, where `digests` are `self.digests(messages)`, hashing
        only the prefixes of messages new since a body this one extends."""
        found = self._entry(messages)
        if found is None or found[1].digests != digests:
            return prefix_digests(digests)
        rolling = found[1].prefixes
        rolling.extend(digests[len(rolling.values) :])
        return list(rolling.values)

    async def count(self, messages: Sequence[Message], counter: Counter, *, in_thread: bool) -> int:
        """`counter.count_messages(messages)`, counting only messages new since a body this one
        extends; a history not known yet is counted whole (in a thread if `in_thread`, unless
        every message's count is cached)."""
        found = self._entry(messages)
        name = counter.encoding_name
        known = [] if found is None else found[1].counts.get(name, [])
        if known:
            new = counter.message_counts(messages[len(known) - 1 :])
        else:
            counts = counter.cached_counts(messages)
            if counts is None and in_thread:
                counts = await asyncio.to_thread(counter.message_counts, messages)
            new = counter.message_counts(messages) if counts is None else counts
            known = [0]
        # A new list: the entry of the body this one extends shares the old one.
        running = [*known[:-1], *itertools.accumulate(new, initial=known[-1])]
        if found is not None:
            found[1].counts[name] = running
        return running[-1] + REPLY_PRIMING

    def tokens_from(self, messages: Sequence[Message], encoding: str, start: int) -> int | None:
        """What messages [start:] cost with this encoding (without the reply priming), if `count`
        counted `messages` (from `parse`) with it; else None."""
        found = self._entry(messages)
        running = None if found is None else found[1].counts.get(encoding)
        if running is None or len(running) != len(messages) + 1 or not 0 <= start < len(running):
            return None
        return running[-1] - running[start]

    def holds_wide_int(self, items: Sequence[Any], raw: bytes) -> bool:
        """`exactjson.holds_wide_int(raw)`, where `raw` is the body whose array is `items`:
        looked for only in the bytes new since a body this one extends (when `items` came from
        `parse`) that was found to hold none."""
        seen = self._raw_entry(items)
        start = 0 if seen is None else max(0, seen.narrow - WIDE_OVERLAP)
        wide = may_hold_wide_int(raw[start:] if start else raw) and holds_wide_int(raw)
        if seen is not None and not wide:
            seen.narrow = len(raw)
        return wide

    def narrow(self, items: Sequence[Any], raw: bytes) -> bool:
        """Whether `raw` (whose array is `items`, from `parse`) is known to hold no integer
        beyond 64 bits, without looking at it: the body it extends held none and neither do
        its new bytes. False means not known."""
        seen = self._raw_entry(items)
        return seen is not None and seen.narrow >= len(raw)

    def _raw_entry(self, items: Sequence[Any]) -> Entry | None:
        """The entry whose body's array is `items` itself."""
        seen = self._by_messages.get(id(items))
        return seen if seen is not None and seen.body[seen.array] is items else None

    def _entry(self, messages: Sequence[Message]) -> tuple[Entry, History] | None:
        """The entry whose body's array is `messages` itself, or that keeps `messages` as a
        list derived from it, with what is known of them."""
        seen = self._by_messages.get(id(messages))
        if seen is None:
            return None
        if seen.body[seen.array] is messages:
            return seen, seen.history
        kept = seen.lists.get(id(messages))
        return (seen, kept[1]) if kept is not None and kept[0] is messages else None

    def _remember(self, key: bytes, seen: Entry, source: Entry | None = None) -> None:
        old = self._seen.pop(key, [])
        # The new body supersedes those it extends with the same fields around the messages
        # (the same conversation, turns earlier); one with other fields (tools) stays.
        kept = [e for e in old if not superseded(e, seen, source)]
        kept = kept[: PER_KEY - 1]
        self._forget([e for e in old if e not in kept])
        self._bytes += len(seen.raw)
        self._seen[key] = [seen, *kept]
        self._by_messages[id(seen.body[seen.array])] = seen
        while self._bytes > self._max_bytes and self._seen:
            _, dropped = self._seen.popitem(last=False)
            self._forget(dropped)

    def _forget(self, entries: list[Entry]) -> None:
        for e in entries:
            self._bytes -= len(e.raw)
            for list_id in (id(e.body[e.array]), *e.lists):
                if self._by_messages.get(list_id) is e:
                    del self._by_messages[list_id]
