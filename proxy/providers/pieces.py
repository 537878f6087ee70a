"""Pieces: the units a compaction keeps or cuts inside one message's text.

A piece is a whole line of code or output, a whole sentence of prose, or a whole member of JSON
(a run of members, never a member cut in two): what a model needs to read a fact with its
meaning. Pieces tile the text exactly, so kept neighbours join back into the original bytes.

A line up to `LONG_LINE` characters is one piece, short ones gathered with the lines after
them. A longer one is cut where its own structure allows: a script or file inside a JSON
string (a tool call's arguments) at its escaped line breaks, like lines; prose at sentence
ends (a sentence shorter than `SENTENCE` characters stays with the next); data (JSON, a Python
repr, a CSV row) at the commas and semicolons between its members, never inside a quoted
string, small members joined up to `PART` characters so a fact keeps a few words on either
side. Anything still longer than `LONGEST` (a line without any such boundary) is cut at spaces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

SHORT = 32
"""A line with fewer characters (white space at its ends aside) is gathered with the next: a
brace, a blank line or `else:` is no unit of meaning on its own."""
LONG_LINE = 240
"""A line longer than this is cut into parts."""
SENTENCE = 40
"""A shorter sentence is kept with the next one."""
PART = 160
"""Members of data are joined up to about this many characters."""
LONGEST = 600
"""No piece is longer than this."""
SCAN = 4096
"""Characters one regex call looks at, at most."""
ESCAPED_BREAK = "\\n"
"""A line break as a JSON string writes it."""
ESCAPED_LINES = 3
"""A long line with at least this many escaped line breaks is cut at them, like lines."""

# A sentence ends at . ! ? (or a run of them), optional closing quotes or brackets, then space.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]\u201d\u2019]*\s+")
_OPENERS = "{["


def split(text: str) -> list[tuple[int, int]]:
    """The pieces of `text` as (start, end) offsets, in order, tiling the whole text."""
    out: list[tuple[int, int]] = []
    start = pending = 0  # where the line and the piece being gathered start
    for line in _lines(text):
        end = start + len(line)
        if len(line) > LONG_LINE:
            if pending < start:
                out.append((pending, start))
            out.extend(_parts(text, start, end))
            pending = end
        elif len(line.strip()) >= SHORT or end - pending >= LONG_LINE:
            out.append((pending, end))
            pending = end
        start = end
    if pending < start:
        out.append((pending, start))
    return out


def _lines(text: str) -> Iterator[str]:
    """`text.splitlines(keepends=True)`, a chunk of about SCAN * 16 characters (cut after a line
    feed) at a time: one call over a multi-megabyte text holds the GIL for milliseconds."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + SCAN * 16) + 1 or len(text)
        yield from text[start:end].splitlines(keepends=True)
        start = end


def _parts(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """A long line cut at its own boundaries and joined back up to about PART characters."""
    stripped = text[start:end].lstrip()
    if text.count(ESCAPED_BREAK, start, end) >= ESCAPED_LINES:
        # A script or a file inside a JSON string (a tool call's arguments): its escaped line
        # breaks are its lines.
        cuts, least = _escaped_cuts, SHORT
    elif stripped[:1] in _OPENERS or _looks_like_data(stripped):
        cuts, least = _data_cuts, PART
    else:
        cuts, least = _prose_cuts, SENTENCE
    piece_start = start
    for cut in (*cuts(text, start, end), end):
        if cut - piece_start >= least or cut == end:
            yield from _at_spaces(text, piece_start, cut)
            piece_start = cut


def _looks_like_data(line: str) -> bool:
    """More structure than words: a line of values, not of sentences."""
    sample = line[:400]
    marks = sum(sample.count(c) for c in ',;:{}[]=|"')
    return marks * 6 > len(sample)


def _prose_cuts(text: str, start: int, end: int) -> Iterator[int]:
    """Offsets just after each sentence end (and its spaces) of text[start:end], looked for a
    window of SCAN characters at a time (a regex call holds the GIL while it runs)."""
    for pos in range(start, end, SCAN):
        for m in _SENTENCE_END.finditer(text, pos, min(pos + SCAN, end)):
            yield m.end()


def _escaped_cuts(text: str, start: int, end: int) -> Iterator[int]:
    """Offsets just after each escaped line break of text[start:end]."""
    at = text.find(ESCAPED_BREAK, start, end)
    while at >= 0:
        yield at + len(ESCAPED_BREAK)
        at = text.find(ESCAPED_BREAK, at + len(ESCAPED_BREAK), end)


def _data_cuts(text: str, start: int, end: int) -> Iterator[int]:
    """Offsets just after each `,` or `;` outside quoted strings (and the spaces after it)."""
    quote = ""
    escaped = False
    i = start
    while i < end:
        c = text[i]
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in ",;":
            j = i + 1
            while j < end and text[j] == " ":
                j += 1
            yield j
            i = j
            continue
        i += 1


def _at_spaces(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """text[start:end] as one piece, or cut at spaces into pieces of at most ~LONGEST chars."""
    while end - start > LONGEST:
        cut = text.rfind(" ", start + LONGEST // 2, start + LONGEST)
        cut = start + LONGEST if cut < 0 else cut + 1
        yield start, cut
        start = cut
    if end > start:
        yield start, end
