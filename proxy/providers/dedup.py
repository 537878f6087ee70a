"""Exact and fuzzy (line-Jaccard) duplicate detection for the engine provider.

A duplicate always points at a LATER occurrence: the later one is newer, so it is the last to be
compacted, and the text the model reads says which message to look at instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MIN_FUZZY_LINES = 2
_SHARED_LINES = 3
_MIN_LENGTH_RATIO = 0.7


@dataclass(frozen=True)
class Duplicate:
    """Message `index` repeats message `target` (later) with this line similarity (1.0 = exact)."""

    index: int
    target: int
    similarity: float
    only_here: tuple[str, ...] = ()
    """Lines of `index` that the target lacks (fuzzy duplicates only)."""


def _lines(text: str) -> list[str]:
    return [ln.strip().lower() for ln in text.splitlines() if ln.strip()]


def line_jaccard(a: Sequence[str], b: Sequence[str]) -> float:
    """Multiset Jaccard similarity of two line lists: sum of min counts over sum of max counts."""
    ca, cb = Counter(a), Counter(b)
    union = sum((ca | cb).values())
    return sum((ca & cb).values()) / union if union else 1.0


def find_exact(texts: Sequence[str], candidates: Sequence[int], min_chars: int) -> list[Duplicate]:
    """Candidates whose whole text reappears verbatim in a later message (any message)."""
    last: dict[str, int] = {}
    for i, text in enumerate(texts):
        if len(text) >= min_chars:
            last[text] = i
    found = []
    for i in candidates:
        text = texts[i]
        if len(text) >= min_chars and last.get(text, i) > i:
            found.append(Duplicate(i, last[text], 1.0))
    return found


def find_fuzzy(
    texts: Sequence[str],
    candidates: Sequence[int],
    min_chars: int,
    threshold: float,
    exclude: frozenset[int] = frozenset(),
) -> list[Duplicate]:
    """Candidates whose lines are at least `threshold` similar to a later message's lines."""
    lines = [_lines(t) if len(t) >= min_chars else [] for t in texts]
    index: dict[str, list[int]] = {}
    for j, ls in enumerate(lines):
        for line in dict.fromkeys(ls):
            index.setdefault(line, []).append(j)
    found = []
    for i in candidates:
        if i in exclude or len(lines[i]) < MIN_FUZZY_LINES:
            continue
        shared: Counter[int] = Counter()
        for line in dict.fromkeys(lines[i]):
            shared.update(j for j in index[line] if j > i)
        best: tuple[float, int] | None = None
        for j, count in shared.items():
            if count < min(_SHARED_LINES, len(lines[i])):
                continue
            short, long_ = sorted((len(texts[i]), len(texts[j])))
            if short / long_ < _MIN_LENGTH_RATIO:
                continue
            sim = line_jaccard(lines[i], lines[j])
            # Ties go to the latest message, the last to be compacted.
            if sim >= threshold and (best is None or (sim, j) > best):
                best = (sim, j)
        if best is not None:
            target_lines = set(lines[best[1]])
            only = tuple(
                ln.strip()
                for ln in texts[i].splitlines()
                if ln.strip() and ln.strip().lower() not in target_lines
            )
            found.append(Duplicate(i, best[1], best[0], only))
    return found
