"""Where a top-level array lies in a JSON object's bytes, found by a string-aware scan.

A chat body's messages array may be followed by any number of keys holding any number of
brackets (an agent's tool schemas: hundreds), and preceded by keys whose strings hold the text
`"messages"`. Counting brackets from either end cannot tell those apart; a scan that steps over
strings as wholes can. Each step is one regular-expression match that runs, in C, over
everything up to the next bracket outside a string: the Python work is one step per bracket of
the values skipped, never one per byte.

Only used on bytes orjson has already accepted (or whose result is verified by a parse), so
the scan may assume valid JSON and give up (None) on anything else.
"""

from __future__ import annotations

import re

_WS = b" \t\r\n"
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_TO_BRACKET = re.compile(rb'(?:[^"\[\]{}]+|"[^"\\]*(?:\\.[^"\\]*)*")*', re.DOTALL)
"""Everything up to the next bracket that is not inside a string."""
_SCALAR = re.compile(rb"[^,}\]\s]*")
_OPEN = frozenset(b"[{")


def _skip_ws(raw: bytes, i: int) -> int:
    n = len(raw)
    while i < n and raw[i] in _WS:
        i += 1
    return i


def close(raw: bytes, i: int, depth: int = 1) -> int:
    """The index of the bracket that closes the one `depth` levels up from `i` (-1 if none)."""
    n = len(raw)
    while True:
        m = _TO_BRACKET.match(raw, i)
        j = m.end() if m is not None else i
        if j >= n or raw[j] == 0x22:  # the end, or a string that does not end
            return -1
        depth += 1 if raw[j] in _OPEN else -1
        if depth == 0:
            return j
        i = j + 1


def _skip_value(raw: bytes, i: int) -> int:
    """The index just past the value starting at `i` (-1 if it does not end)."""
    c = raw[i : i + 1]
    if c in (b"{", b"["):
        end = close(raw, i + 1)
        return end + 1 if end >= 0 else -1
    if c == b'"':
        m = _STRING.match(raw, i)
        return m.end() if m is not None else -1
    m = _SCALAR.match(raw, i)
    return m.end() if m is not None and m.end() > i else -1


def array_span(raw: bytes, key: str) -> tuple[int, int] | None:
    """(index just after the `[`, index of the `]`) of the array under top-level `key`, spelled
    plainly (no escapes) in the object `raw`; None if not found that way."""
    want = b'"' + key.encode() + b'"'
    i = _skip_ws(raw, 0)
    if raw[i : i + 1] != b"{":
        return None
    i += 1
    while True:
        i = _skip_ws(raw, i)
        m = _STRING.match(raw, i)
        if m is None:
            return None
        i = _skip_ws(raw, m.end())
        if raw[i : i + 1] != b":":
            return None
        i = _skip_ws(raw, i + 1)
        if m.group() == want and raw[i : i + 1] == b"[":
            end = close(raw, i + 1)
            return (i + 1, end) if end >= 0 else None
        i = _skip_value(raw, i)
        if i < 0:
            return None
        i = _skip_ws(raw, i)
        if raw[i : i + 1] != b",":
            return None
        i += 1


def element_ends(raw: bytes, start: int, end: int) -> list[int] | None:
    """The index just past each element of the array whose items lie in `raw[start:end]`
    (`start` just after its `[`, `end` at its `]` or at a `,` after its last element); None if
    those bytes are not elements separated by commas."""
    ends: list[int] = []
    i = _skip_ws(raw, start)
    if i < end and raw[i] == 0x2C and not ends:  # a continuation: starts after a comma
        i = _skip_ws(raw, i + 1)
    while i < end:
        j = _skip_value(raw, i)
        if j < 0 or j > end:
            return None
        ends.append(j)
        i = _skip_ws(raw, j)
        if i < end:
            if raw[i] != 0x2C:
                return None
            i = _skip_ws(raw, i + 1)
    return ends
