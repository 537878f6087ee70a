"""Deterministic extractive summaries that keep hard content and drop filler.

Standard library only. "Hard content" is what a model cannot re-derive from a paraphrase: code,
JSON, SQL, tracebacks, keys, file paths, identifiers, numbers, URLs, error lines and decisions.
`summarize_text` keeps the hard blocks verbatim and the most informative prose sentences; the
facts (see `facts.py`) of the dropped sentences follow on a `facts:` line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from proxy.text.facts import (
    ERROR_HINTS,
    ERROR_WORDS,
    MAX_SENTENCE,
    SCAN_CHARS,
    FactMemo,
    bounded,
    facts_of_matches,
    paragraphs,
    parse_json,
    scan_spans,
)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LIST_MARKER = re.compile(r"^(?:[-*+]|\(?\w{1,3}[.)])$")

# What sentence scoring counts: a cheaper stand-in for a fact (about one hit per fact).
_FACT_HINT = re.compile(r"`[^`\s]+`|[\d_/@]+|[a-z][A-Z]")
# Decision and filler patterns match lowered text: case-sensitive runs much faster than re.I.
_DECISION = re.compile(
    r"\b(?:decided|decision|we(?:'ll| will) use|going with|chose|instead|must|never|always|"
    r"important|confirmed?|agreed|the (?:fix|solution|approach|plan) is)\b",
)
_FILLER = re.compile(
    r"^\s*(?:sure|great|certainly|of course|ok(?:ay)?|thanks|thank you|got it|absolutely|"
    r"i understand|i see|no problem|happy to|glad to|let me|here(?:'s| is)|alright|"
    r"i hope this|feel free|please let me know|if you have any)\b",
)
_SQL = re.compile(
    r"\b(?:SELECT\s[^;]{0,200}?\sFROM|INSERT INTO|UPDATE\s+\w+\s+SET|DELETE FROM|"
    r"CREATE (?:TABLE|INDEX)|ALTER TABLE|GROUP BY|ORDER BY|PRIMARY KEY|"
    r"(?:INNER|LEFT|RIGHT|OUTER) JOIN)\b",
    re.S,
)
_CODE_ENDINGS = (":", "{", "}", ";", "(", ")", ",", "[", "]", "=", "\\")
# All ASCII: deleting them from the UTF-8 bytes removes one byte per character (bytes.translate
# runs at C speed; a str table is a dict lookup a character).
_SPECIAL_DELETE = b"{}[]<>|\\;:@#$%^&*()=+`~"


# A traceback is its header, or an indented line starting a Python (`File "x.py", line 3`) or
# JS/Java (`at f(`) frame. Frames are matched only where their first word occurs, and fences
# only looked for where ``` or ~~~ occurs: a regex tried at every position of a 200 KB block
# holds the GIL for ~10 ms per pattern.
_TRACEBACK_HEAD = "Traceback (most recent call last)"
_FILE_FRAME = re.compile(r"File \"[^\"]+\", line \d+")
_AT_FRAME = re.compile(r"at [\w$.<>]+\(")
# Every _SQL match starts with one of these words: matching only where they occur keeps each
# regex call short (one search over a 200 KB block holds the GIL for ~30 ms).
_SQL_STARTS = (
    "SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "GROUP", "ORDER", "PRIMARY",
    "INNER", "LEFT", "RIGHT", "OUTER",
)  # fmt: skip
_SQL_START = re.compile("|".join(_SQL_STARTS))


def _has_traceback(block: str) -> bool:
    """Whether the block holds a traceback header or an indented stack frame line."""
    if _TRACEBACK_HEAD in block:
        return True
    for word, rest in (('File "', _FILE_FRAME), ("at ", _AT_FRAME)):
        at = block.find(word)
        while at >= 0:
            if _indented(block, at) and rest.match(block, at):
                return True
            at = block.find(word, at + 1)
    return False


def _indented(block: str, at: int) -> bool:
    """Whether whitespace that starts a line runs up to `at` (what `^\\s+` before it needs)."""
    start = at
    while start > 0 and block[start - 1].isspace():
        start -= 1
    return start < at and (start == 0 or "\n" in block[start : at - 1])


def _has_sql(block: str) -> bool:
    # One scan for any start word (uppercase letters are rare in prose, so it skips fast)
    # instead of one per word, a piece at a time (cut after a space or line break, so no word
    # straddles a cut): one search through a 3 MB log holds the GIL for ~10 ms.
    # (A block of one piece, most of them, is searched without the pieces' generator.)
    spans = ((0, len(block)),) if len(block) <= SCAN_CHARS else scan_spans(block, SCAN_CHARS, " \n")
    for start, end in spans:
        found = _SQL_START.search(block, start, end)
        while found is not None:
            if _SQL.match(block, found.start()):
                return True
            found = _SQL_START.search(block, found.start() + 1, end)
    return False


def _is_hard(block: str) -> bool:
    lines = [ln for ln in block.splitlines() if ln.strip()]
    if not lines:
        return False
    # The cheap tests first: most hard blocks are code, found without scanning for SQL words.
    if len(lines) >= 2 and _mostly_code(lines):
        return True
    data = block.encode("utf-8", "surrogatepass")
    special = len(data) - len(data.translate(None, _SPECIAL_DELETE))
    if len(block) >= 20 and special / len(block) > 0.15:
        return True
    return _has_traceback(block) or _has_sql(block)


def _mostly_code(lines: list[str]) -> bool:
    """Whether at least 60 % of the lines are indented or end like code (unfenced code: a file
    read, a diff), deciding as soon as the rest of the lines cannot change the answer."""
    needed = -(-len(lines) * 3 // 5)  # ceil(0.6 n)
    code = 0
    for seen, ln in enumerate(lines, 1):
        if ln[0] in " \t" or ln.rstrip().endswith(_CODE_ENDINGS):
            code += 1
            if code >= needed:
                return True
        elif code + len(lines) - seen < needed:
            return False
    return False


def _fence_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each fenced block: an opening line of at most 3 spaces or tabs, 3 or more
    backticks or tildes and anything else; the block ends with the first later line holding the
    same fence alone (indented at most 3), or the text. (The tests check it against the regex
    this replaces.)

    Found with str.find: the pattern's lazy body tried a line start at every character of long
    code blocks."""
    pos, n = 0, len(text)
    while pos < n:
        hits = [i for i in (text.find("```", pos), text.find("~~~", pos)) if i >= 0]
        if not hits:
            return
        at = min(hits)
        start = text.rfind("\n", 0, at) + 1
        newline = text.find("\n", at)
        indent = text[start:at]
        if start < pos or len(indent) > 3 or indent.strip(" \t"):
            pos = at + 1
            continue
        if newline < 0:
            return  # an opening line needs a line after it
        mark = text[at]
        stop = at
        while stop < n and text[stop] == mark:
            stop += 1
        fence = text[at:stop]
        end = _closing_line(text, fence, newline + 1)
        yield start, end
        pos = end if end > start else start + 1


def _closing_line(text: str, fence: str, body: int) -> int:
    """The end of the first line from `body` on that holds `fence` alone (indent at most 3),
    without its line break; the end of the text if there is none."""
    at = text.find(fence, body)
    while at >= 0:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        indent = text[start:at]
        if (
            start >= body
            and len(indent) <= 3
            and not indent.strip(" \t")
            and not text[at + len(fence) : end].strip(" \t")
        ):
            return end
        at = text.find(fence, at + 1)
    return len(text)


def split_blocks(text: str) -> list[tuple[bool, str]]:
    """(is_hard, text) blocks in order: fences and hard paragraphs, and prose paragraphs."""
    blocks: list[tuple[bool, str]] = []
    pos = 0
    for start, end in _fence_spans(text):
        blocks.extend((_is_hard(p), p) for p in paragraphs(text[pos:start]))
        blocks.append((True, text[start:end]))
        pos = end
    blocks.extend((_is_hard(p), p) for p in paragraphs(text[pos:]))
    return [(hard, b.strip("\n")) for hard, b in blocks if b.strip()]


def sentences(block: str) -> list[str]:
    """Sentences of a prose block; lines never join, list markers stay with their item. A line
    is split a piece at a time and no sentence is longer than MAX_SENTENCE (a line without
    sentence ends is cut at blanks), so no regex runs over a huge piece of text."""
    out: list[str] = []
    for line in block.splitlines():
        pending = ""
        for part in bounded(line.strip(), SCAN_CHARS):
            for piece in _SENTENCE_END.split(part):
                if (_LIST_MARKER.match(piece) or len(piece) < 4) and len(pending) < MAX_SENTENCE:
                    pending = f"{pending}{piece} "
                    continue
                out.extend(bounded(pending + piece))
                pending = ""
        if pending.strip():
            out.extend(bounded(pending.strip()))
    return out


@dataclass
class SentenceCache:
    """Sentence scores and fact matches shared by the summaries of one compaction.

    Agent conversations repeat sentences (boilerplate, status lines), and a compaction
    summarizes hundreds of messages: each distinct sentence is scored and scanned once."""

    scores: dict[str, float | None] = field(default_factory=dict)
    facts: FactMemo = field(default_factory=FactMemo)

    def score(self, sentence: str, first: bool) -> float:
        """A sentence's score (a block's first gets a bonus), computed once per sentence."""
        if sentence in self.scores:
            base = self.scores[sentence]
        else:
            base = self.scores[sentence] = _base_score(sentence)
        return -10.0 if base is None else base + (1.0 if first else 0.0)


def _base_score(sentence: str) -> float | None:
    """A sentence's score without the first-sentence bonus; None for filler."""
    low = sentence.lower()
    if _FILLER.match(low):
        return None
    score = 2.0 * len(_FACT_HINT.findall(sentence))
    # Every error-word match holds one of the hints: plain substring tests skip the regex.
    if any(word in low for word in ERROR_HINTS) and ERROR_WORDS.search(low):
        score += 3.0
    score += 2.0 if _DECISION.search(low) else 0.0
    return score - (1.0 if len(sentence) < 15 else 0.0)


def summarize_text(
    text: str,
    ratio: float = 0.4,
    facts_chars: int = 400,
    cache: SentenceCache | None = None,
    blocks: list[tuple[bool, str]] | None = None,
) -> str:
    """Hard blocks verbatim and the best prose sentences within `ratio` of the prose; facts of
    the dropped sentences follow on a `facts:` line. A JSON document is returned unchanged.

    `cache` shares sentence work between the summaries of one compaction and `blocks` is
    `split_blocks(text)` when the caller has it (same output)."""
    if parse_json(text) is not None:
        return text
    memo = cache if cache is not None else SentenceCache()
    if blocks is None:
        blocks = split_blocks(text)
    # Sentences in order, each with its block; grouped by score so the best come first in
    # text order without sorting them all (a sort of a huge log's sentences in one C call would
    # hold the GIL for tens of milliseconds).
    scored: list[tuple[int, str]] = []
    by_score: dict[float, list[int]] = {}
    for b, (hard, block) in enumerate(blocks):
        if not hard:
            for s, sentence in enumerate(sentences(block)):
                by_score.setdefault(memo.score(sentence, s == 0), []).append(len(scored))
                scored.append((b, sentence))
    budget = int(sum(len(sentence) for _, sentence in scored) * ratio)
    kept = [False] * len(scored)
    used = 0
    for score in sorted(by_score, reverse=True):
        if score < 0:
            break
        for at in by_score[score]:
            length = len(scored[at][1])
            if used + length <= budget:
                kept[at] = True
                used += length + 1
    chosen: dict[int, list[str]] = {}
    dropped: list[str] = []
    for (b, sentence), keep in zip(scored, kept, strict=True):
        if keep:
            chosen.setdefault(b, []).append(sentence)
        else:
            dropped.append(sentence)
    out: list[str] = []
    for b, (hard, block) in enumerate(blocks):
        if hard:
            out.append(block)
        elif b in chosen:
            out.append(" ".join(chosen[b]))
    body = "\n\n".join(out)
    # The facts of the dropped sentences joined by spaces (`facts_of_matches`), from cached matches.
    facts = _missing(
        facts_of_matches(m for d in dropped for m in memo.facts.piece(d)), body, facts_chars
    )
    if facts:
        body = f"{body}\nfacts: {', '.join(facts)}" if body else f"facts: {', '.join(facts)}"
    return body


def _missing(items: list[str], body: str, max_chars: int) -> list[str]:
    """The items not in `body` that fit in max_chars (comma-separated), in order.

    Only items that would fit are looked up: each lookup scans the body, and a long text has
    thousands of facts (checking them all was quadratic: 0.3 s on a 200 KB log)."""
    chosen: list[str] = []
    used = 0
    for item in items:
        if used > max_chars - 2:
            break
        cost = len(item) + 2
        if used + cost > max_chars or item in body:
            continue
        chosen.append(item)
        used += cost
    return chosen
