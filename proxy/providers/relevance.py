"""Lexical relevance of messages to the recent turns: BM25 with the recent turns as the query.

What a conversation is about now is in its last user message and its final messages; an older
message that shares their rare terms is more likely to be needed than one that does not. Terms
are lowered words split at punctuation (a path or `obj.attr` gives its parts), found with
`str.translate` and `str.split` (C speed, no regex); document frequencies are counted over the
messages scored, so a term every message holds weighs nothing.

Standard library only.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, count, repeat

from proxy.providers.facts import SCAN_CHARS, native, scan_spans

# Everything but letters, digits, `_` and `-` separates terms. They are all ASCII, and no byte
# of a multi-byte UTF-8 sequence is: a bytes table over the encoded text blanks exactly the
# characters a str table would, at a fraction of the cost (lone surrogates pass through).
_SEPARATOR_CHARS = "\t\n\r\"'`()[]{}<>,;:=|!?*#&^%$+~\\/.@"
_SEPARATORS = bytes.maketrans(_SEPARATOR_CHARS.encode(), b" " * len(_SEPARATOR_CHARS))
_K1 = 1.2
_B = 0.75


def terms(text: str) -> list[str]:
    """The lowered terms of a text, in order, repeats included (a piece at a time, cut at
    blanks, on long texts: one `translate` of megabytes would hold the GIL for long)."""
    if len(text) <= SCAN_CHARS:
        return _blanked(text.lower()).split()
    return [
        t
        for start, end in scan_spans(text, SCAN_CHARS, " \n")
        for t in _blanked(text[start:end].lower()).split()
    ]


# `python_term_set` of an ASCII text at C speed (proxy/providers/_factscan.c), where built.
NATIVE_TERM_SET = native("term_set", (_SEPARATOR_CHARS, "TERM_SEPARATORS"))


def term_set(text: str) -> tuple[set[str], int]:
    """The set of `terms(text)` and how many there are (repeats included): the same set, its
    terms added in the same order (one C pass for an ASCII text of at most SCAN_CHARS)."""
    if NATIVE_TERM_SET is not None and len(text) <= SCAN_CHARS:
        found: tuple[set[str], int] | None = NATIVE_TERM_SET(text)
        if found is not None:
            return found
    return python_term_set(text)


# `found.update(terms(text))` of an ASCII text at C speed (proxy/providers/_factscan.c), where
# built: the query's terms are added to one set, the messages' texts never made into lists.
NATIVE_TERMS_INTO = native("terms_into", (_SEPARATOR_CHARS, "TERM_SEPARATORS"))


def add_terms(found: set[str], text: str) -> None:
    """`found.update(terms(text))`: the same terms added in the same order (one C pass for an
    ASCII text of at most SCAN_CHARS)."""
    native = NATIVE_TERMS_INTO
    if native is None or len(text) > SCAN_CHARS or native(found, text) is None:
        found.update(terms(text))


def python_term_set(text: str) -> tuple[set[str], int]:
    """`term_set` in Python (the reference of the native one)."""
    found = terms(text)
    return set(found), len(found)


def _blanked(text: str) -> str:
    """`text` with every separator replaced by a space."""
    data = text.encode("utf-8", "surrogatepass").translate(_SEPARATORS)
    return data.decode("utf-8", "surrogatepass")


class Relevance:
    """BM25 scores of documents against one query. A document is its set of terms and its
    length in terms: a term counts once per document (agent outputs repeat identifiers; the
    saturation BM25 applies to repeats makes them worth little more anyway)."""

    def __init__(self, documents: Sequence[tuple[set[str], int]], query: Iterable[str]) -> None:
        self.documents = documents
        df: Counter[str] = Counter()
        for doc, _length in documents:
            df.update(doc)
        n = len(documents)
        wanted = set(query)
        self.df = df
        # A term's weight depends only on how many documents hold it: one per count (0: none).
        self._by_count = [0.0] + [math.log(1 + (n - k + 0.5) / (k + 0.5)) for k in range(1, n + 1)]
        self.idf = {t: self._by_count[df[t]] for t in wanted if t in df}
        total = sum(length for _doc, length in documents)
        self.avg = total / n if n and total else 1.0

    def weight(self, term: str) -> float:
        """The inverse document frequency of any term over the documents (0 if none holds it)."""
        return self._by_count[self.df.get(term, 0)]

    def weight_sum(self, found: Iterable[str]) -> float:
        """`sum(map(self.weight, found))`, with C iterators (the same additions in order)."""
        return sum(map(self._by_count.__getitem__, map(self.df.get, found, repeat(0))))

    def score(self, d: int) -> float:
        """BM25 of document d (0 when it shares no query term)."""
        doc, length = self.documents[d]
        norm = _K1 * (1 - _B + _B * length / self.avg)
        gain = (_K1 + 1) / (1 + norm)
        return gain * sum(map(self.idf.__getitem__, self.idf.keys() & doc))


# Relevant lines: the heaviest query terms are looked for (case-insensitively, as substrings of
# at least this many characters), a piece of the text at a time.
_MIN_TERM = 3
_LINE_TERMS = 24
_LINE_WIDTH = 240


def heaviest(weights: Mapping[str, float], k: int = _LINE_TERMS) -> list[tuple[str, float]]:
    """The k heaviest terms of at least `_MIN_TERM` characters, heaviest first."""
    usable = [(w, t) for t, w in weights.items() if len(t) >= _MIN_TERM]
    usable.sort(reverse=True)
    return [(t, w) for w, t in usable[:k]]


@dataclass(frozen=True)
class LineHits:
    """Where the query's terms occur in one text: per line start, the weight of the distinct
    terms it holds and the offset of its first hit."""

    text: str
    scores: dict[int, float]
    first_hit: dict[int, int]


# `python_line_hits`'s finds and sums at C speed (proxy/providers/_factscan.c), where built.
NATIVE_LINE_HITS = native("line_hits")


def line_hits(text: str, terms: Sequence[tuple[str, float]]) -> LineHits:
    """The lines of `text` that hold any of `terms` (see `heaviest`), found once per text. A
    term counts for each line holding it its weight over how many lines do: what every line
    of an output says singles none of them out.

    Every search is a `str.find` over one piece of at most 2 * SCAN_CHARS (cut at line breaks
    where there are any), so the work per call stays bounded whatever the text's shape (the
    native version holds the GIL through all the pieces of a text: ~1 ms a megabyte)."""
    if NATIVE_LINE_HITS is None:
        return python_line_hits(text, terms)
    pieces = (
        [(s, text[s:e].lower()) for s, e in scan_spans(text, SCAN_CHARS, "\n")] if terms else []
    )
    scores, first_hit = NATIVE_LINE_HITS(pieces, [t for t, _ in terms], [w for _, w in terms])
    return LineHits(text, scores, first_hit)


def python_line_hits(text: str, terms: Sequence[tuple[str, float]]) -> LineHits:
    """`line_hits` in Python (the reference of the native one)."""
    lines_of: dict[str, set[int]] = {}
    first_hit: dict[int, int] = {}
    for piece_start, piece_end in scan_spans(text, SCAN_CHARS, "\n") if terms else ():
        low = text[piece_start:piece_end].lower()
        starts: list[int] = []
        for term, _weight in terms:
            at = low.find(term)
            while at >= 0:
                if not starts:  # where the piece's lines start (a piece is one line at least)
                    starts = _line_starts(low)
                after = bisect.bisect_right(starts, at)
                line = piece_start + starts[after - 1]
                lines_of.setdefault(term, set()).add(line)
                first_hit.setdefault(line, piece_start + at)
                # A term's other hits on this line add nothing (no term holds a line break).
                at = low.find(term, starts[after]) if after < len(starts) else -1
    scores: dict[int, float] = {}
    for term, weight in terms:
        hit = lines_of.get(term, ())
        for line in hit:
            scores[line] = scores.get(line, 0.0) + weight / len(hit)
    return LineHits(text, scores, first_hit)


def _line_starts(text: str) -> list[int]:
    """The offsets where the lines of `text` start (after each line break), with C iterators:
    the k-th line starts at the length of the k lines before it plus k breaks."""
    lines = text.split("\n")
    return [0, *map(operator.add, accumulate(map(len, lines[:-1])), count(1))]


# `python_relevant_lines` at C speed (proxy/providers/_factscan.c), where built.
NATIVE_RELEVANT_LINES = native("relevant_lines")


def relevant_lines(hits: LineHits, start: int, end: int, max_chars: int) -> list[str]:
    """The lines starting in text[start:end] that hold the most weight of the query's terms,
    best first until max_chars, back in text order. A line longer than `_LINE_WIDTH` gives the
    part around its first hit."""
    if NATIVE_RELEVANT_LINES is None:
        return python_relevant_lines(hits, start, end, max_chars)
    found: list[str] = NATIVE_RELEVANT_LINES(
        hits.text, hits.scores, hits.first_hit, start, end, max_chars, _LINE_WIDTH
    )
    return found


def python_relevant_lines(hits: LineHits, start: int, end: int, max_chars: int) -> list[str]:
    """`relevant_lines` in Python (the reference of the native one)."""
    text = hits.text
    chosen: list[tuple[int, str]] = []
    seen: set[str] = set()
    used = 0
    scores = hits.scores
    inside = [line for line in scores if start <= line < end]
    # Heaviest first, ties in text order: a stable sort by line, then by weight reversed (a
    # reversed sort keeps ties in order), both keyed at C speed.
    inside.sort()
    inside.sort(key=scores.__getitem__, reverse=True)
    for line in inside:
        if used >= max_chars - 1:
            break
        limit = min(end, line + 4 * _LINE_WIDTH)
        stop = text.find("\n", line, limit)
        stop = limit if stop < 0 else stop
        body = text[line:stop].strip()
        if len(body) > _LINE_WIDTH:
            lo = max(0, hits.first_hit[line] - line - _LINE_WIDTH // 3)
            body = text[line + lo : line + lo + _LINE_WIDTH].strip()
        if body and body not in seen and used + len(body) + 1 <= max_chars:
            seen.add(body)
            chosen.append((line, body))
            used += len(body) + 1
    chosen.sort()
    return [body for _line, body in chosen]
