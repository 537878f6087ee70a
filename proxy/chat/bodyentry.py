"""A body the body cache holds, and how the next turn's body is built from it.

Where the array lies in the body's bytes (`locate`), and three ways a new body's bytes may be
this one's: its messages with new ones added and the same bytes after the array
(`same_fields`), or other bytes after it (`scanned`: a scan from the last known message finds
the array's end), or its messages but the last few, which the client changed (`cut_back`: a
client that moves its cache breakpoints onto the newest messages every turn). See
`proxy.chat.bodycache` for why each is sound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.runtime.digest import Message, RollingPrefixes
from proxy.runtime.exactjson import may_hold_wide_int
from proxy.runtime.jsonspan import array_span, close, element_ends

_WS = b" \t\r\n"
WIDE_OVERLAP = 20
"""Bytes before the new ones looked at again: a run of digits may begin in them."""


@dataclass
class History:
    """What is known of a list of messages' first ones: digests, prefix digests, counts."""

    digests: list[str] = field(default_factory=list)
    """Digests of the first messages, filled in when a decision first needs them."""
    prefixes: RollingPrefixes = field(default_factory=RollingPrefixes)
    """Their prefix digests (what a checkpoint is looked up by), filled in likewise."""
    counts: dict[str, list[int]] = field(default_factory=dict)
    """Encoding -> running token totals of the first messages: [i] is what messages [0, i)
    cost, without the reply priming (so one more item than messages counted)."""

    def head(self, n: int) -> History:
        """What holds of a list whose first `n` messages are these (the same objects)."""
        digests = self.digests[:n]
        prefixes = self.prefixes.head(min(n, len(self.prefixes.values)))
        if prefixes is None:  # cut back further than hash states are kept: rehash
            prefixes = RollingPrefixes()
            prefixes.extend(digests[: len(self.prefixes.values)])
        counts = {k: v[: n + 1] for k, v in self.counts.items()}
        return History(digests, prefixes, counts)


@dataclass(eq=False)  # identity: entries hold whole bodies
class Entry:
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
    history: History = field(default_factory=History)
    bounds: list[int] | None = None
    """The index just past each element of the array, once needed (`cut_back`)."""
    parsed: int = 0
    """Bytes handed to orjson to build this entry from the one it extends."""
    narrow: int = 0
    """The first `narrow` bytes of `raw` hold no integer beyond 64 bits (`holds_wide_int`)."""
    memo: dict[Any, Any] = field(default_factory=dict)
    """What callers derived from the bytes around the array (`BodyCache.memo`): kept while
    they stay the same."""
    derived: dict[str, Any] = field(default_factory=dict)
    """What callers derived from the array itself (`BodyCache.keep`), by name."""
    carried: dict[str, tuple[Any, int]] = field(default_factory=dict)
    """Name -> (what was derived from the array of the body this one was built from, how many
    of its leading elements this array shares): for `BodyCache.previous`."""
    lists: dict[int, tuple[Sequence[Message], History]] = field(default_factory=dict)
    """Lists of messages derived from the array (an API's items projected): their histories."""
    lists_before: dict[int, tuple[Sequence[Message], History]] = field(default_factory=dict)
    """`lists` of the body this one was built from, until `keep` takes what it reuses."""


def superseded(old: Entry, new: Entry, source: Entry | None) -> bool:
    """Whether `new` is `old` with messages added (or its last ones changed: `source`) and the
    same bytes around them."""
    tail = memoryview(old.raw)[old.end + 1 :]
    same_tail = len(new.raw) - new.end == len(tail) + 1 and new.raw.endswith(tail)
    if old is source:
        return same_tail and new.raw.startswith(memoryview(old.raw)[: old.start])
    return same_tail and new.raw.startswith(memoryview(old.raw)[: old.cut])


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


def locate(raw: bytes, body: dict[str, Any], name: str) -> Entry | None:
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
    return Entry(raw, name, start, _before_space(raw, end, start), end, body)


def _extends(seen: Entry, raw: bytes, cut: int) -> bool:
    """Whether `raw` begins with `seen`'s bytes up to `cut` (the end of one of its elements)."""
    # bytes.startswith compares with memcmp (a memoryview == goes item by item).
    return len(raw) > cut and raw.startswith(memoryview(seen.raw)[:cut])


def extends(seen: Entry, raw: bytes) -> bool:
    """Whether `raw` begins with `seen`'s bytes up to its last message (`same_fields` and
    `scanned` are tried only then, `cut_back` only otherwise)."""
    return _extends(seen, raw, seen.cut)


def same_fields(seen: Entry, raw: bytes) -> Entry | None:
    """`raw` parsed by extending `seen`, if it is `seen`'s bytes (`extends`) with new messages
    added and the same bytes after them."""
    return _same_tail(seen, raw, seen.cut, len(seen.body[seen.array]))


def _same_tail(seen: Entry, raw: bytes, cut: int, kept: int) -> Entry | None:
    """`raw` built from `seen`'s first `kept` elements (its bytes up to `cut`) and new ones,
    if the bytes after its array are `seen`'s."""
    tail = memoryview(seen.raw)[seen.end + 1 :]
    end = len(raw) - len(tail) - 1
    if end < cut or raw[end] != ord("]") or not raw.endswith(tail):
        return None
    found = _with_new(seen, raw, cut, kept, end=end, fields=seen.body, same_tail=True)
    if found is not None:
        found.memo = seen.memo
    return found


def scanned(seen: Entry, raw: bytes) -> Entry | None:
    """`raw` parsed by extending `seen`, if it is `seen`'s bytes (`extends`) with new messages
    added and other bytes after them: the scan from the last known message finds the array's
    end."""
    cut = seen.cut
    end = close(raw, cut)
    fields = None if end < 0 else _fields(raw, seen.array, seen.start, end)
    if fields is None:
        return None
    found = _with_new(seen, raw, cut, len(seen.body[seen.array]), end=end, fields=fields)
    if found is not None:
        found.parsed += len(raw) - (end - seen.start)
    return found


def cut_back(seen: Entry, raw: bytes) -> Entry | None:
    """`raw` parsed from `seen`'s first elements, if it is `seen`'s bytes with its last
    elements changed (a client moves its cache breakpoints onto the newest messages every
    turn) and the same bytes after the array."""
    if not raw.startswith(memoryview(seen.raw)[: seen.start]):
        return None
    bounds = _bounds(seen)
    if not bounds:
        return None
    # The longest run of whole elements `raw` begins with: the last few first, since clients
    # change only the newest messages, then by bisection (the test is monotone).
    n = len(bounds) - 1  # all of them: `same_fields` tried
    low = max(0, n - 8)
    while n > low and not _extends(seen, raw, bounds[n - 1]):
        n -= 1
    if n == low and low > 0:
        lo, hi = 0, low  # bounds[lo - 1] is shared (or lo == 0); find the last shared
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _extends(seen, raw, bounds[mid - 1]) else (lo, mid - 1)
        n = lo
    if n == 0:
        return None
    return _same_tail(seen, raw, bounds[n - 1], n)


def _bounds(seen: Entry) -> list[int] | None:
    """`seen.bounds`, found by a scan of its array the first time."""
    if seen.bounds is None:
        seen.bounds = element_ends(seen.raw, seen.start, seen.end)
        if seen.bounds is not None and len(seen.bounds) != len(seen.body[seen.array]):
            seen.bounds = None
    return seen.bounds


def _with_new(
    seen: Entry,
    raw: bytes,
    cut: int,
    kept: int,
    *,
    end: int,
    fields: dict[str, Any],
    same_tail: bool = False,
) -> Entry | None:
    """The body of `raw`: `seen`'s first `kept` messages (its bytes up to `cut`), those between
    `cut` and `end`, and `fields`."""
    middle = raw[cut:end].strip(_WS)
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
    messages = old[:kept] + new
    body = {k: messages if k == seen.array else v for k, v in fields.items()}
    history = seen.history.head(kept)
    # Bytes up to the cut are the same, so what was found of them holds (the array's end
    # and the fields after it may have changed); the new ones are looked at now, while the
    # entry is this request's (a concurrent turn may supersede it before its decision).
    narrow = min(seen.narrow, cut)
    # A tail the whole old body vouched for needs no second look (no run of digits crosses
    # the array's `]`): the bytes looked at are the new messages', however long the tools are.
    stop = end if same_tail and seen.narrow >= len(seen.raw) else len(raw)
    if narrow and not may_hold_wide_int(raw[max(0, narrow - WIDE_OVERLAP) : stop]):
        narrow = len(raw)
    found = Entry(raw, seen.array, seen.start, _before_space(raw, end, cut), end, body, history)
    found.narrow = narrow
    if seen.bounds is not None:
        ends = element_ends(raw, cut, end) if new else []
        found.bounds = None if ends is None else [*seen.bounds[:kept], *ends]
    found.parsed = len(middle) + 2 if middle else 0
    carried = {k: (v, min(n, kept)) for k, (v, n) in seen.carried.items()}
    found.carried = carried | {k: (v, kept) for k, v in seen.derived.items()}
    found.lists_before = seen.lists_before | seen.lists
    return found
