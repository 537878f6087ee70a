"""Text surgery for rule-based providers: previews, reasoning blocks, extractive condensing.

Everything here is deterministic and linear in the text length.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.text.facts import SCAN_CHARS, bounded, paragraphs, scan_spans

_THINK = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL)
_BLANK_RUNS = re.compile(r"\n{3,}")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# Substrings of a lowered text, not a case-insensitive regex: this runs over every large tool
# result, and `in` is several times faster; a false positive only keeps a message.
_ERROR_WORDS = ("error", "exception", "traceback", "failed", "failure", "fatal", "panic")
# Paths are found among whitespace/punctuation-separated tokens that contain a slash: a split
# and a check per candidate token stay linear on long JSON or log output, where a free-running
# path regex backtracks.
_TOKEN_SPLIT = re.compile(r"[\s\"'`()<>\[\]{},;|=]+")
# Like the path split, but a comma inside a number ($1,234.50) does not split it.
# A fact token is a run of non-separator characters holding a digit or a slash; a comma inside
# a number ($1,234.50) does not end it. It may only start after a separator (the lookbehind) and
# its first part is possessive, so nothing is scanned twice: linear on any input.
_SEP = r"\s\"'`()<>\[\]{};|=,"
_FACT_TOKEN = re.compile(rf"(?<![^{_SEP}])[^{_SEP}\d/]*+[\d/](?:[^{_SEP}]|,(?=\d))*")
_NAME = re.compile(r"[^\W\d_]|/")
_PATH_TOKEN = re.compile(r"(?:~|\.{1,2})?/?[\w.@+-]+(?:/[\w.@+-]+)+/?")
# What a reader would need to act on: code spans, paths, URLs, identifiers, numbers, errors.
# Paths and calls start only where a run of their characters does (and a call's name is taken
# whole): tried inside a long run of letters they would backtrack quadratically.
_HARD_FACT = re.compile(
    r"`[^`\n]+`"
    r"|https?://\S+"
    r"|(?<![\w.-])(?:[\w.-]+/)+[\w.-]+"
    r"|\b[a-z]+_[a-z0-9_]+\b"
    r"|\b[a-z]+[A-Z]\w*\b"
    r"|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b"
    r"|(?<![\w.])[A-Za-z_][\w.]*+\("
    r"|\d"
    r"|(?i:\b(?:error|exception|traceback|failed|failure|warning)\b)"
)
_KEY_TERMS = re.compile(
    r"\b(decided|decision|because|must|never|always|important|note|todo|fixme|result|"
    r"conclusion|therefore|next step|will)\b",
    re.IGNORECASE,
)
ELLIPSIS = "…"


def looks_like_error(text: str) -> bool:
    """Whether text reports an error (such tool output is never stubbed as stale)."""
    lowered = text.lower()
    return any(word in lowered for word in _ERROR_WORDS)


def paths_in(text: str) -> set[str]:
    """File paths (and other slash-separated names) mentioned in text."""
    if "/" not in text:
        return set()
    out = set()
    # A piece at a time (cut after a space or line break, which the split drops anyway): one
    # split of a 3 MB log holds the GIL for ~60 ms.
    for start, end in scan_spans(text, SCAN_CHARS, " \n"):
        for token in _TOKEN_SPLIT.split(text[start:end]):
            candidate = token.rstrip(".:") if "/" in token else ""
            if candidate and _PATH_TOKEN.fullmatch(candidate):
                out.add(candidate)
    return out


def _fact_token_matches(text: str) -> list[str]:
    """`_FACT_TOKEN.findall(text)`, a piece at a time on long texts: no token spans whitespace,
    and one regex call holds the GIL (a 200 KB log at once stalls the event loop ~20 ms)."""
    if len(text) <= SCAN_CHARS:
        return _FACT_TOKEN.findall(text)
    found: list[str] = []
    for start, end in scan_spans(text, SCAN_CHARS, " \n"):
        found.extend(_FACT_TOKEN.findall(text, start, end))
    return found


def fact_tokens(text: str) -> list[str]:
    """Tokens of text that carry a digit or a path (ids, numbers, dates, amounts, files), in order,
    repeats included."""
    cleaned = (token.strip(".,:;") for token in _fact_token_matches(text))
    return [t for t in cleaned if 2 < len(t) <= 64]


def facts(tokens: Sequence[str], max_chars: int, exclude: str = "") -> str:
    """Distinct fact tokens not already in `exclude`, comma-joined within `max_chars` in order of
    (last) appearance. When not all fit, names (letters with digits: ids, codes, files) beat bare
    numbers, and later ones beat earlier ones."""
    chosen: dict[str, int] = {}  # token -> rank counted from the end
    numbers: dict[str, int] = {}
    seen: set[str] = set()
    used = 0
    # Latest first, so a long history stops being read as soon as the names fill the room.
    for rank, token in enumerate(reversed(tokens)):
        if token in seen or token in exclude:
            continue
        seen.add(token)
        if not has_name(token):
            numbers[token] = rank
        elif used + len(token) + 2 > max_chars:
            break
        else:
            chosen[token] = rank
            used += len(token) + 2
    for token, rank in numbers.items():
        if used + len(token) + 2 > max_chars:
            break
        chosen[token] = rank
        used += len(token) + 2
    return ", ".join(sorted(chosen, key=chosen.__getitem__, reverse=True))


def has_name(token: str) -> bool:
    """Whether a fact token is a name (letters with digits, or a path) rather than a number."""
    return _NAME.search(token) is not None


def strip_reasoning(text: str) -> str:
    """Text without `<think>`/`<thinking>` blocks (blank-line runs collapsed)."""
    if "<think" not in text:
        return text
    return _BLANK_RUNS.sub("\n\n", _THINK.sub("", text)).strip()


def preview(text: str, chars: int) -> str:
    """The head and tail of text, `chars` in total (2/3 head), cut at line ends where possible."""
    if len(text) <= chars:
        return text
    if chars <= 0:
        return ""
    head, tail = preview_parts(text, chars)
    return f"{head}\n{ELLIPSIS}\n{tail}"


def preview_parts(text: str, chars: int) -> tuple[str, str]:
    """The head and the tail `preview` keeps (the text and "" when it all fits)."""
    if len(text) <= chars:
        return text, ""
    head_len = chars * 2 // 3
    tail_len = chars - head_len
    head = text[:head_len]
    cut = head.rfind("\n")
    if cut > head_len // 2:
        head = head[:cut]
    tail = text[len(text) - tail_len :]
    cut = tail.find("\n")
    if 0 <= cut < tail_len // 2:
        tail = tail[cut + 1 :]
    return head, tail


def condense(text: str, keep_ratio: float) -> str:
    """Extractive condensing: keep code fences whole, every sentence holding a path, identifier,
    number or error, line and paragraph breaks, and the best-scoring rest up to `keep_ratio`."""
    parts = _fence_split(text)
    items: list[tuple[int, int, int, str]] = []  # (part, paragraph, line, sentence)
    ranked: list[tuple[float, int]] = []
    for pa, part in enumerate(parts):
        if pa % 2:
            continue
        for pg, paragraph in enumerate(paragraphs(part)):
            sentences = _sentences(paragraph)
            for k, (ln, sentence) in enumerate(sentences):
                ranked.append((-_score(sentence, k, len(sentences)), len(items)))
                items.append((pa, pg, ln, sentence))
    budget = sum(len(s) for *_, s in items) * keep_ratio
    keep = [False] * len(items)
    used = 0
    for neg, idx in sorted(ranked):
        size = len(items[idx][3])
        if neg <= -_MANDATORY or used + size <= budget:
            keep[idx] = True
            used += size
    return _assemble(parts, items, keep)


def _fence_split(text: str) -> list[str]:
    """Text and ```-fenced blocks alternating, the fences at odd positions, as a regex split
    at ```...``` would give them (found with str.find: no regex over the whole text)."""
    parts: list[str] = []
    pos = 0
    while True:
        start = text.find("```", pos)
        end = text.find("```", start + 3) if start >= 0 else -1
        if end < 0:
            parts.append(text[pos:])
            return parts
        parts += [text[pos:start], text[start : end + 3]]
        pos = end + 3


def _assemble(parts: list[str], items: list[tuple[int, int, int, str]], keep: list[bool]) -> str:
    """Kept sentences in their places; an ellipsis marks a line that lost something."""
    lines: dict[tuple[int, int, int], list[str]] = {}
    gaps: set[tuple[int, int, int]] = set()
    for (pa, pg, ln, sentence), kept in zip(items, keep, strict=True):
        key = (pa, pg, ln)
        if kept:
            lines.setdefault(key, []).append(sentence)
        else:
            gaps.add(key)
    out: list[str] = []
    for pa, part in enumerate(parts):
        if pa % 2:
            out.append(part)
            continue
        paragraphs: dict[int, list[str]] = {}
        for (p, pg, ln), sentences in lines.items():
            if p == pa:
                tail = f" {ELLIPSIS}" if (p, pg, ln) in gaps else ""
                paragraphs.setdefault(pg, []).append(" ".join(sentences) + tail)
        block = "\n\n".join("\n".join(paragraphs[pg]) for pg in sorted(paragraphs))
        if block:
            out.append(block)
    return "\n\n".join(x.strip("\n") for x in out if x.strip())


def _sentences(paragraph: str) -> list[tuple[int, str]]:
    """(line number, sentence): list items, headings and short lines stay whole. A line is
    split a piece at a time and no sentence is longer than MAX_SENTENCE (cut at blanks), so
    the scoring regexes never run over a huge piece of text."""
    out: list[tuple[int, str]] = []
    for ln, line in enumerate(paragraph.splitlines()):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0] in "-*#>|0123456789" or len(stripped) < 80:
            out.extend((ln, piece) for piece in bounded(stripped))
            continue
        for part in bounded(stripped, SCAN_CHARS):
            out.extend((ln, piece) for s in _SENTENCE.split(part) if s for piece in bounded(s))
    return out


_MANDATORY = 10.0


def _score(sentence: str, position: int, count: int) -> float:
    """Facts make a sentence mandatory; otherwise position and key terms rank it."""
    if _HARD_FACT.search(sentence):
        return _MANDATORY
    score = 0.0
    if position == 0:
        score += 2.0
    elif position == count - 1:
        score += 1.0
    score += 0.5 * len(_KEY_TERMS.findall(sentence))
    if len(sentence) > 200:
        score -= 0.5
    return score
