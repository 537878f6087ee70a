"""Selection: the order in which a compaction keeps pieces, best value per token first.

Every message a compaction may rewrite is cut into pieces (`pieces.py`), each with a value and
an estimated token cost. The ranking starts from the floor, where nothing that may go is kept
(older units folded into one stand-in, messages that must stay reduced to their marker), and
takes pieces in order of value per token. A piece brings along a short neighbour, and the
neighbour beside a fact at its edge (a fact keeps the words around it); the first piece of a
message also pays for its speaker's label in the stand-in.

The fit (`engine.py`) then keeps the longest prefix of the ranking that is within the target,
counted exactly.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from proxy.providers.salience import edges

# A neighbour with at most this many non-space characters comes along with a kept piece: it
# is what lets a fact at a line's start or end keep the words around it.
NEAR = 32


@dataclass
class Text:
    """One rewritable message: its pieces, what each costs and is worth."""

    index: int
    """The message's index in the conversation."""
    body: str
    """What the pieces cut: the message's text (and, in a unit that may be folded, its tool
    calls written as `name arguments`)."""
    spans: list[tuple[int, int]]
    # Per piece, in arrays and byte strings rather than lists: the garbage collector does not
    # walk them, and a long log has tens of thousands of pieces alive through every collection.
    tokens: array[float]
    value: array[float]
    short: bytearray
    """Whether piece k is short enough to come along with a kept neighbour."""
    full: float
    """Tokens the message costs unchanged."""
    kept: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.kept = bytearray(len(self.spans))


Pick = tuple[int, tuple[int, ...], float]
"""One step of the ranking: (text index, pieces of that text kept together, estimated tokens of
the request after it above the floor). A plain tuple: the garbage collector stops tracking it,
and a long log ranks tens of thousands of them."""


def rank(texts: Sequence[Text], label: float) -> list[Pick]:
    """Every valuable piece in the order it is kept (see the module's docstring); `label` is
    what the first piece kept of a message costs beyond its own tokens (the speaker's label in
    a stand-in). Leaves every text with nothing kept."""
    candidates = [
        (t, k) for t, text in enumerate(texts) for k, value in enumerate(text.value) if value > 0
    ]
    density = [-texts[t].value[k] / max(texts[t].tokens[k] + label, 1.0) for t, k in candidates]
    picks: list[Pick] = []
    opened: set[int] = set()
    spent = 0.0
    for t, k in map(candidates.__getitem__, _by_key(density)):
        text = texts[t]
        if text.kept[k]:
            continue
        bundle = _bundle(text, k)
        for j in bundle:
            text.kept[j] = True
        spent += sum(map(text.tokens.__getitem__, bundle))
        if t not in opened:
            opened.add(t)
            spent += label
        picks.append((t, tuple(bundle), spent))
    for text in texts:
        text.kept = bytearray(len(text.kept))
    return picks


# One sort call holds the GIL for as long as it runs: ~25 ms over the 60,000 pieces of a 3 MB
# log. Blocks this size sort in a couple of milliseconds each and are merged in Python.
SORT_BLOCK = 4096


def _by_key(keys: list[float]) -> Iterator[int]:
    """Indices of `keys` in ascending key order, equal keys in index order (a stable sort,
    done by blocks and merged)."""
    blocks = [
        sorted(range(start, min(start + SORT_BLOCK, len(keys))), key=keys.__getitem__)
        for start in range(0, len(keys), SORT_BLOCK)
    ]
    if len(blocks) == 1:
        return iter(blocks[0])
    return heapq.merge(*blocks, key=keys.__getitem__)


def _bundle(text: Text, k: int) -> list[int]:
    """Piece k with the neighbours that come along (short ones, and the one beside a fact at
    its edge), those not kept yet."""
    out = [k]
    kept, short = text.kept, text.short
    before = k > 0 and not kept[k - 1]
    after = k + 1 < len(kept) and not kept[k + 1]
    if (before and not short[k - 1]) or (after and not short[k + 1]):
        # Whether the piece holds a fact near its start, or its end: the neighbour on that side
        # comes along, so the fact keeps the words around it.
        start, end = text.spans[k]
        near_start, near_end = edges(text.body[start:end], NEAR)
        before = before and (near_start or bool(short[k - 1]))
        after = after and (near_end or bool(short[k + 1]))
    if before:
        out.append(k - 1)
    if after:
        out.append(k + 1)
    return out


def apply(texts: Sequence[Text], picks: Sequence[Pick], n: int) -> None:
    """Set every text's kept pieces to the first `n` picks of a ranking."""
    for text in texts:
        text.kept = bytearray(len(text.kept))
    for pick in picks[:n]:
        t, pieces, _ = pick
        kept = texts[t].kept
        for j in pieces:
            kept[j] = True
