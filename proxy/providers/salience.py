"""Salience: how much a piece of an older message is worth keeping, before its age is counted.

Two things make a line or sentence worth its tokens, and one makes it worthless:

- **Specificity.** Rare, exact items are what a later turn needs and cannot rebuild: ids,
  numbers, dates, amounts, paths, URLs, names. Each distinct specific term of a piece is
  weighted by its form (anything with a digit, a path, URL or identifier: 1; a name, an
  acronym or a quoted phrase, a title someone gave: 0.6; plain words: nothing) times its rarity
  in the conversation (inverse document frequency over all pieces).
- **Relevance.** What the conversation is about now: BM25 of the piece against what the tail
  names (the files, functions, ids, numbers and names of the newest exchanges, those of the
  last user message counted twice), so the file an agent is still editing and the earlier
  answer the last question is about outrank what nobody mentions.
- **Redundancy.** A piece said again later (the same line in a newer view of a file, the same
  error template, a repeated banner) is worth nothing where it stands first: the later copy
  carries it, in its newer surroundings. An exact term (an id, number, path) that what stays
  holds counts only there (`Scorer.scores`' `carried`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence, Set

from proxy.providers.pieces import SCAN

# A term: a run of word characters, joined through the punctuation of paths, URLs, versions,
# amounts and dates (`src/app.py`, `https://x.org/a_b`, `2024-05-20`, `$1,250.00`).
# (Written as word runs joined by punctuation runs: the same matches as `\w(?:[\w.,:/@#%+~-]*\w)?`
# without backtracking off every term's last character.)
_TERM = re.compile(r"\w+(?:[.,:/@#%+~-]+\w+)*")
# A digit, a path's, URL's or identifier's punctuation, a camelCase join.
_EXACT = re.compile(r"\d|[_./@:]|[a-z][A-Z]")
# A capitalized word after a lower-case word or a comma: a name, not a sentence's first word.
# (The capital comes first, then the look behind it: a search then skips to capitals.)
_NAME = re.compile(r"[A-Z](?<=[a-z,;] [A-Z])\w*")
# A quoted phrase: a title, a name someone gave, a message someone saw ("Netrunner's Gambit",
# “domain users”, 'Firefox closed unexpectedly'), 3 to 60 characters on one line. A single
# quote opens only after a non-word character and closes only before one, so `it's` and `don't`
# open nothing, and an apostrophe between two letters stays inside. (Only there: an apostrophe
# that could open a quote ends the attempt at once, so a line of `'ab 'ab 'ab` costs a few steps
# per quote, not sixty.)
_QUOTED = re.compile(
    r'"([^"\n]{3,60})"|“([^”\n]{3,60})”'
    r"|(?<!\w)'((?:[^'\n]|(?<=\w)'(?=\w)){3,60})'(?!\w)"
)
# Where a fact may sit: a digit, joined punctuation inside a word, a camelCase join, a capital
# after a lower-case word or a comma (a name, not a sentence's first word), an acronym.
_FACTLIKE = re.compile(r"\d|\w[_./@:]\w|[a-z][A-Z]|(?<=[a-z,;] )[A-Z]|\b[A-Z]{2}")

# Terms counted into the document frequencies at once: one update of a 3 MB log's terms held
# the GIL for ~10 ms.
COUNT_BATCH = 8192
# BM25's usual constants (Robertson & Zaragoza).
K1 = 1.2
B = 0.75
# Weights of a specific term's form: ids, numbers, paths, URLs, identifiers; names, acronyms.
EXACT = 1.0
NAMED = 0.6


def terms(text: str, pattern: re.Pattern[str] = _TERM) -> list[str]:
    """The terms of a text (or another pattern's matches), as written, found a window of SCAN
    characters at a time (cut at a space where there is one): a regex call holds the GIL while
    it runs."""
    out: list[str] = []
    start = 0
    while start < len(text):
        end = start + SCAN
        if end < len(text):
            space = text.rfind(" ", start + SCAN // 2, end)
            end = space if space > 0 else end
        out.extend(pattern.findall(text, start, end))
        start = end
    return out


def form(term: str) -> float:
    """How specific a term is by its form alone: anything with a digit, a path, URL or
    identifier (EXACT); an acronym (NAMED); else 0 (a capitalized word counts as a name only
    where it does not start a sentence: `Scorer` looks at that)."""
    if _EXACT.search(term):
        return EXACT
    return NAMED if len(term) > 1 and term.isupper() else 0.0


def named_terms(text: str) -> set[str]:
    """What a text names: its terms specific by their form, and its capitalized words that do
    not start a sentence (the rule specificity uses: `What`, `The`, `THOUGHT:` name nothing)."""
    out = {t for t in terms(text) if form(t)}
    out.update(terms(text, _NAME))
    return out


def exact_terms(texts: Iterable[str]) -> set[str]:
    """The ids, numbers, paths, URLs and identifiers the texts hold (terms whose form alone makes
    them EXACT), lower case: what a piece holding them too says again."""
    out: set[str] = set()
    for text in texts:
        out.update(t.lower() for t in set(terms(text)) if form(t) == EXACT)  # each judged once
    return out


def edges(text: str, reach: int) -> tuple[bool, bool]:
    """Whether something that may be a fact (a digit, an identifier, a name) lies within
    `reach` characters of the text's start, and of its end (white space at either end aside):
    the neighbouring piece on that side then keeps the words around it."""
    body = text.strip()
    return bool(_FACTLIKE.search(body, 0, reach)), bool(
        _FACTLIKE.search(body, max(len(body) - reach, 0))
    )


_Analysis = tuple[tuple[tuple[str, float], ...], tuple[tuple[str, int], ...], int, tuple[str, ...]]
"""What the scores read of one piece: its specific terms (lower case, weight of the form), the
tail's terms it holds with their counts, its length in terms, and the terms it counts for in
the document frequencies."""


class _Terms:
    """Each distinct term of a conversation, as written, judged once: its lower case and the
    weight of its form (the specific ones), and whether the tail asks for it."""

    def __init__(self, asked: set[str]) -> None:
        self._asked = asked
        self._judged: set[str] = set()
        self._specific: dict[str, tuple[str, float]] = {}
        self._asked_forms: set[str] = set()

    def analyze(self, piece: str, quoting: bool) -> _Analysis:
        """What the scores read of `piece` (with its quoted phrases where `quoting`)."""
        written = _TERM.findall(piece)
        distinct = set(written)
        for term in distinct.difference(self._judged):
            self._judged.add(term)
            lower = term.lower()
            weight = form(term)
            if weight:
                self._specific[term] = (lower, weight)
            if lower in self._asked:
                self._asked_forms.add(term)
        # Sorted wherever a set's order would reach a sum: the same input must score the same
        # in every worker, whatever its string hash seed.
        forms = self._specific
        specific = dict(map(forms.__getitem__, sorted(forms.keys() & distinct)))
        for name in _NAME.findall(piece):
            specific.setdefault(name.lower(), NAMED)
        if quoting and ("'" in piece or '"' in piece or "\u201c" in piece):
            for quoted in _QUOTED.findall(piece):
                specific.setdefault("".join(quoted).lower(), NAMED)
        if self._asked_forms.isdisjoint(distinct):
            return tuple(specific.items()), (), len(written), tuple(specific)
        # Terms hold no line break: one lower() of them all, not one per term.
        lowered = "\n".join(written).lower().split("\n")
        asked = sorted(self._asked.intersection(lowered))
        hits = tuple((t, lowered.count(t)) for t in asked)
        scored = (*specific, *(t for t in asked if t not in specific))
        return tuple(specific.items()), hits, len(written), scored


class Scorer:
    """Specificity and relevance of every piece of one conversation.

    Only what the two scores read is kept of each piece: its specific terms, the tail's terms
    it holds (with their counts) and its length in terms; document frequencies are counted for
    those terms alone."""

    def __init__(
        self, pieces: Sequence[str], query: str, focus: str, written: bytes | bytearray = b""
    ) -> None:
        # `written`: whether each piece is what the user or the model wrote in words, where a
        # quoted phrase is a title or a name someone gave; in a tool's output or a call's
        # arguments, quotes are a program's string literals and JSON's keys and values (none
        # by default).
        # The working set is what the tail names (its files, functions, ids, numbers, names):
        # plain words match too much to say what a piece is about. The last user message says
        # what is asked now: its names count twice the tail's.
        self._query = {t.lower(): 1.0 for t in named_terms(query)}
        self._query.update({t.lower(): 2.0 for t in named_terms(focus)})
        terms = _Terms(set(self._query))
        df: Counter[str] = Counter()  # document frequencies of the scored terms
        counted: list[str] = []  # each piece's distinct scored terms, not counted in df yet
        # Tuples, not lists: the garbage collector stops tracking a tuple of strings and numbers,
        # and a full collection walking a list per piece (60,000 for a 3 MB log) held the GIL
        # for ~70 ms.
        self._specific: list[tuple[tuple[str, float], ...]] = []
        self._hits: list[tuple[tuple[str, int], ...]] = []
        self._lengths: list[int] = []
        # A quarter of an agent run's pieces are repeats: each is analyzed once (once as
        # written, once as output).
        known: tuple[dict[str, _Analysis], dict[str, _Analysis]] = ({}, {})
        for k, piece in enumerate(pieces):
            quoting = k < len(written) and written[k] == 1
            analysis = known[quoting].get(piece)
            if analysis is None:
                analysis = known[quoting][piece] = terms.analyze(piece, quoting)
            specific, hits, length, scored = analysis
            self._specific.append(specific)
            self._hits.append(hits)
            self._lengths.append(length)
            counted.extend(scored)
            if len(counted) >= COUNT_BATCH:
                df.update(counted)
                counted.clear()
        df.update(counted)
        n = max(len(pieces), 1)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self._avg = max(sum(self._lengths) / n, 1.0)

    def specificity(self, i: int, carried: Set[str] = frozenset()) -> float:
        """Form times rarity, summed over the distinct specific terms of piece i, but for the
        exact ones (ids, numbers, paths) in `carried`."""
        idf = self._idf
        return sum(w * idf[t] for t, w in self._specific[i] if w != EXACT or t not in carried)

    def scores(
        self, relevance: float, carried: Set[str] = frozenset(), carriers: Set[int] = frozenset()
    ) -> list[float]:
        """Every piece's specificity plus `relevance` times its relevance, in order; the exact
        terms in `carried` (what stays holds them) count only in the pieces `carriers` names.
        Consumes the scorer: each piece's terms are let go as it is scored (freeing those of
        tens of thousands of pieces at once held the GIL for ~20 ms)."""
        out = []
        for i in range(len(self._specific) - 1, -1, -1):
            score = self.specificity(i, frozenset() if i in carriers else carried)
            if relevance and self._hits[i]:  # most pieces hold none of the tail's terms
                score += relevance * self.relevance(i)
            out.append(score)
            self._specific.pop()
            self._hits.pop()
        out.reverse()
        return out

    def relevance(self, i: int) -> float:
        """BM25 of piece i against the tail's terms."""
        norm = K1 * (1 - B + B * self._lengths[i] / self._avg)
        idf, query = self._idf, self._query
        return sum(query[t] * idf[t] * tf * (K1 + 1) / (tf + norm) for t, tf in self._hits[i])


def normalized(text: str) -> str:
    """A piece's text with its white space folded: what counts as saying the same thing."""
    return " ".join(text.split())


def said_later(groups: Iterable[Sequence[str]], seen: set[str], min_chars: int) -> list[list[bool]]:
    """Per group (a message's pieces, oldest group first), whether each piece is repeated by a
    later group, by `seen` (what the untouchable messages say) or earlier in its own group.

    Pieces shorter than `min_chars` (a closing brace, a blank line) are never redundant: they
    are cheap, and they are the context of their neighbours."""
    groups = list(groups)
    out: list[list[bool]] = [[] for _ in groups]
    later = set(seen)
    for g in range(len(groups) - 1, -1, -1):
        keys = [normalized(p) for p in groups[g]]
        own: set[str] = set()
        flags = []
        for key in keys:
            repeated = len(key) >= min_chars and (key in later or key in own)
            flags.append(repeated)
            own.add(key)
        out[g] = flags
        later |= own
    return out
