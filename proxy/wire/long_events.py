"""An SSE event too long to hold, read without its long strings.

An event over `accounting.max_sse_event_bytes` is mostly one or two strings: an image's base64
(image generation's partial images, and `response.completed` carrying the image again), a long
text. Its `usage` sits among the rest. `Skim` takes such an event as it arrives and keeps its
bytes with every JSON string longer than `MAX_STRING` emptied (`""`), so what it holds is the
event's structure: small, valid JSON when the event was, and read like any other event. An
event whose structure alone passes the limit is passed over: memory stays bounded either way.

JSON strings hold no raw line break, so a line break outside a string, or ending a line that
opened one (not JSON then), is what an event's lines and its end (a blank line) are found by.
"""

from __future__ import annotations

import re

MAX_STRING = 128
"""Longest string kept whole (a `type`, a key, a model name); longer ones are emptied."""

# Inside a string: a run of plain bytes and escapes, stopping at its closing quote, a line break,
# a lone backslash at the end of the data, or the data's end. Outside: up to a quote or a break.
_IN_STRING = re.compile(rb'[^"\\\n]*(?:\\[^\n][^"\\\n]*)*')
_OUTSIDE = re.compile(rb'[^"\n]*')


class Skim:
    """One event's bytes without its long strings, fed in pieces (LF line endings)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._out = bytearray()
        self._string = -1  # where the open string's content starts in _out (-1: none open)
        self._emptied = False  # the open string is too long: its content is left out
        self._escaped = False  # the data ended inside a string on a backslash
        self._break = False  # the last byte outside a string was a line break
        self._over = False  # the structure itself is over the limit: nothing is kept

    def feed(self, data: bytes) -> int:
        """Take the event's next bytes; the offset in `data` just past its end, or -1."""
        i, n = 0, len(data)
        while i < n:
            if self._string >= 0:
                i = self._in_string(data, i)
                continue
            j = _end(_OUTSIDE, data, i)
            if j > i:
                self._keep(data[i:j])
                self._break = False
            if j == n:
                break
            if data[j] == ord("\n"):
                if self._break:
                    self._keep(b"\n")
                    return j + 1
                self._break = True
            else:
                self._string, self._emptied, self._break = len(self._out) + 1, False, False
            self._keep(data[j : j + 1])
            i = j + 1
        return -1

    def _in_string(self, data: bytes, i: int) -> int:
        """Take string content from `i`; where to go on."""
        if self._escaped and data[i] != ord("\n"):  # the byte after the last piece's backslash
            self._escaped = False
            self._content(data[i : i + 1])
            return i + 1
        self._escaped = False
        j = _end(_IN_STRING, data, i)
        self._content(data[i:j])
        if j == len(data):
            return j
        if data[j] == ord("\\"):
            if j + 1 == len(data):  # its escaped byte comes with the next piece
                self._escaped = True
                self._content(b"\\")
                return j + 1
            j += 1  # a backslash before a line break: not JSON, the line ends
        self._string = -1  # a closing quote, or a line break ending a line that is not JSON
        if data[j] == ord("\n"):
            return j  # taken as a break outside a string
        self._keep(b'"')
        return j + 1

    def _content(self, piece: bytes) -> None:
        if self._emptied:
            return
        if len(self._out) - self._string + len(piece) > MAX_STRING:
            del self._out[self._string :]
            self._emptied = True
            return
        self._keep(piece)

    def _keep(self, piece: bytes) -> None:
        if self._over:
            return
        self._out += piece
        if len(self._out) > self._limit:
            self._over, self._out = True, bytearray()

    def event(self) -> bytes | None:
        """The event as taken so far without its long strings; None if it was passed over."""
        return None if self._over else bytes(self._out)


def _end(run: re.Pattern[bytes], data: bytes, i: int) -> int:
    """Where the run `run` matches from `i` ends (it matches the empty run too)."""
    found = run.match(data, i)
    return found.end() if found is not None else i
