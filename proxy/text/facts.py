"""Facts: what a paraphrase would lose (ids, paths, names, quoted code, dates, amounts).

Standard library only. Facts are found with one cheap pattern (and names and quoted phrases
with a few more); long texts are scanned a piece at a time (`scan_spans`, `bounded`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

# A fact is what a paraphrase would lose: inline `code`, or a token holding a digit, an
# underscore, a slash or an @, a dot inside a word (`utils.py`, `aider.repo`) or a lower-to-upper
# hump (`warmCache`). One cheap pattern anchored at token starts finds them.
# Not right after `<`: a closing markup tag (`</output>`) is structure, not a path.
_FACT = re.compile(
    r"`[^`\s]{2,60}`"
    r"|(?<![\w./@$€£~:%+<-])[\w./@$€£~:%+-]*"
    r"(?:[\d_/@]|\w\.\w|[a-z][A-Z]|[A-Z]{2}[a-z]|[A-Z]-[A-Za-z]|[a-z]-[A-Z]|\w\+[A-Z]|[A-Za-z]#)"
    r"[\w./@$€£~:%+?=&#-]*"
)


_PUNCT_EDGES = ".:,-+%~"
# Stripped from a token before testing whether it is a plain word: none of these can start or
# complete a fact (digits, `_`, `/`, `@` and backticks are not among them; a dot at the edge has
# no word character on one side).
_WORD_EDGES = ".,;:!?()\"'"
# Characters a single regex call scans at most (when lines allow): ~5 ms of holding the GIL.
SCAN_CHARS = 32_768
# For lowered text (case-sensitive patterns run much faster than re.I ones).
ERROR_WORDS = re.compile(
    r"\b(?:error|exception|traceback|failed|failure|fatal|denied|refused|not found|invalid)\b"
    r"|[a-z](?:error|exception)\b"
)
# Every match of ERROR_WORDS contains one of these (lowered): a text without any
# skips the patterns.
ERROR_HINTS = (
    "error", "exception", "traceback", "fail", "fatal", "denied", "refused", "not found", "invalid",
)  # fmt: skip
_MIN_FACT_LEN = 2
_LETTER = re.compile(r"[^\W\d_]")


def scan_spans(text: str, size: int, boundaries: str) -> Iterator[tuple[int, int]]:
    """(start, end) pieces of text of about `size` characters, each ending just after one of
    the `boundaries` characters, or at 2 * size when none comes before (a text without them is
    still cut: no piece is ever longer)."""
    n = len(text)
    if n <= size:  # one piece (most texts): what the loop below yields, without its finds
        if n:
            yield 0, n
        return
    start = 0
    while start < n:
        limit = min(n, start + 2 * size)
        cuts = [c for c in (text.find(b, start + size, limit) for b in boundaries) if c >= 0]
        end = min(cuts) + 1 if cuts else limit
        yield start, end
        start = end


# The most characters a "sentence" may have when it is scored or summarized: a text with no
# sentence ends (a multi-megabyte line) is cut into pieces this long, so no regex over one
# sentence holds the GIL for long.
MAX_SENTENCE = 2_000


def bounded(text: str, size: int = MAX_SENTENCE) -> list[str]:
    """`text` itself if it has at most `size` characters, else its pieces of `size` to
    2 * `size` characters, cut after blanks where there are any."""
    if len(text) <= size:
        return [text]
    return [text[start:end] for start, end in scan_spans(text, size, " \t")]


def paragraphs(text: str) -> list[str]:
    """The paragraphs of a text: its runs of lines that are not blank (spaces and tabs only),
    each joined back with its line breaks. (A regex split at blank lines is one call over the
    whole text.)"""
    out: list[str] = []
    run: list[str] = []
    for line in text.split("\n"):
        if line.strip(" \t"):
            run.append(line)
        elif run:
            out.append("\n".join(run))
            run = []
    if run:
        out.append("\n".join(run))
    return out


def _fact_matches(text: str, tokens: dict[str, list[str]] | None = None) -> list[str]:
    """`_FACT.findall(text)`, a whitespace-separated token at a time.

    No match spans whitespace (a token's neighbours are whitespace, which the pattern's
    lookbehind and its classes treat as the start and end of the text), so the matches of the
    tokens are the text's, in order. Most prose tokens are plain words, which cannot hold a
    fact, and a few string tests rule them out; the pattern runs on the rest. That halves the
    cost on prose; long texts are split a piece at a time, cut at spaces and line breaks."""
    if len(text) > SCAN_CHARS:  # one split of a 10 MB log would hold the GIL for ~30 ms
        return [
            m
            for start, end in scan_spans(text, SCAN_CHARS, " \n")
            for m in _scan(text[start:end], tokens)
        ]
    return _scan(text, tokens)


# Names: capitalized words that do not start a sentence (the word before ends in a lower-case
# letter, a digit or a comma), with the capitalized words right after them: places, people,
# titles, products (`Green Meadow Park`, `NYC`). Quoted phrases: what the author put in double
# quotes (`"The Great Gatsby"`).
_NOT_NAMES = frozenset({"I", "I'm", "I've", "I'll", "I'd", "OK", "Ok"})
_QUOTED_PHRASE = re.compile(r"[\"“]([^\"“”\n]{3,80})[\"”]")
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")


_AFTER_WORD = "[a-zß-ÿ\\d,;][ \\t]"
_CAPITAL = "[A-ZÀ-Þ]"
# Or after an amount with a letter (`22K MAU`, `5G LTE`), or after a dash set off by blanks,
# which goes on with the sentence (`… to FSDP — PyTorch's native FSDP`).
_NAME_FIRST = (
    f"{_CAPITAL}(?:(?<={_AFTER_WORD}{_CAPITAL})|(?<={_AFTER_WORD}[\"'(\u201c\u2018]{_CAPITAL})"
    f"|(?<=\\d[A-Za-z][ \\t]{_CAPITAL})|(?<=[ \\t][\u2013\u2014][ \\t]{_CAPITAL}))"
)
# Hyphenated parts of a word of a name (`Sichuan-style`, `Chick-fil-a`, `Qinghai-Tibet`).
_HYPHENATED = "(?:-[A-Za-zß-ÿ]+)*"
# A word of a name: capitalized, or an acronym, maybe a plural or a word after it (`GPUs`,
# `GDScript`).
_NAME_WORD = f"(?:[A-ZÀ-Þ][a-zß-ÿ]+|[A-ZÀ-Þ]{{2,}}[a-zß-ÿ]*){_HYPHENATED}(?:'s)?"
# A capitalized word right after a lower-case letter, a digit or a comma and a blank (and maybe
# an opening quote; checked behind the first letter, so the search skips to capitals at C
# speed), and up to three more after it on the same line, the last not followed by more word
# characters.
_NAME = re.compile(
    f"({_NAME_FIRST}(?:[a-zß-ÿ]+(?:[A-ZÀ-Þ][a-zß-ÿ]+)*|[A-ZÀ-Þ]+[a-zß-ÿ]*){_HYPHENATED}(?:'s)?"
    f"(?:[ \\t]+{_NAME_WORD}){{0,3}})"
    "(?![\\w-]|['\u2019]\\w)"
)


# An amount with thousands separators (`300,000`, `$1,250.50`): the fact pattern stops at a
# comma and finds only its pieces.
_GROUPED = re.compile(r"(?<![\w.,])[$€£]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w|[.,]\d)")


def _quoted_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Where `_QUOTED_PHRASE` matches in text[start:end]."""
    return [match.span() for match in _QUOTED_PHRASE.finditer(text, start, end)]


def _quoted_word(text: str, at: int, end: int) -> bool:
    """Whether a quoted single word (the `_QUOTED_PHRASE` match text[at:end]) stands in a
    sentence (`call her "spoiled."`): a word of letters (maybe with a sentence mark), after a
    word and a blank, and no key (no `:` or `=` after it), so the strings of code, commands
    and JSON are no facts."""
    # The tests of the characters around it first: most quoted strings (code's) fail one.
    if at < 2 or text[at - 1] != " " or not text[at - 2].isalpha():
        return False
    word = text[at + 1 : end - 1].strip().rstrip(".,!?")
    return _WORD.fullmatch(word) is not None and text[end : end + 1] not in (":", "=")


def name_matches(text: str) -> list[str]:
    """Quoted phrases, amounts with thousands separators, then names, of a text, in order; a
    piece at a time (cut after spaces and line breaks), so a multi-megabyte line is never one
    regex call."""
    found: list[str] = []
    quotes = '"' in text or "“" in text
    commas = "," in text
    for start, end in scan_spans(text, SCAN_CHARS, " \n"):
        if quotes:
            for at, stop in _quoted_spans(text, start, end):
                phrase = text[at + 1 : stop - 1].strip()  # the quotes are one character each
                if (" " in phrase and _LETTER.search(phrase)) or _quoted_word(text, at, stop):
                    found.append(phrase)
        if commas:
            found += _GROUPED.findall(text, start, end)
        found += _name_facts(text, start, end, _NOT_NAMES)
    return found


def _name_facts(text: str, start: int, end: int, not_names: frozenset[str]) -> list[str]:
    """The names of text[start:end] a fact list keeps."""
    found: list[str] = []
    for match in _NAME.findall(text, start, end):
        # A possessive stays as written (`Jay Chou's`: it holds the name too). Most names are one
        # word (only blanks and tabs separate a name's words): no split for those.
        if " " not in match and "\t" not in match:
            if match not in not_names:
                found.append(match)
            continue
        words = match.split()
        while words and words[0] in not_names:
            del words[0]
        if words:
            found.append(" ".join(words))
    return found


_NO_FACTS: list[str] = []
# Distinct tokens whose matches a compaction remembers (a log of unique ids would otherwise fill
# a dict that takes long to free).
_TOKEN_MEMO = 50_000


def _scan(text: str, tokens: dict[str, list[str]] | None = None) -> list[str]:
    """The fact pattern's matches, token by token; `tokens` remembers each distinct token's
    matches (agent conversations repeat most of their tokens: `self.x`, `return`, ids)."""
    found: list[str] = []
    findall = _FACT.findall
    seen: dict[str, list[str]] = {} if tokens is None else tokens
    get = seen.get
    for token in text.split():
        hit = get(token)
        if hit is None:
            word = token if token.isalpha() else token.strip(_WORD_EDGES)
            if word.isalpha() and (word.islower() or word.isupper() or word.istitle()):
                hit = _NO_FACTS  # letters only and no lower-to-upper hump: no fact
            else:
                hit = findall(token) or _NO_FACTS
            if len(seen) < _TOKEN_MEMO:
                seen[token] = hit
        if hit:
            found += hit
    return found


def _quoted(matches: Iterable[str]) -> dict[str, bool]:
    """Each distinct fact of the matches, in order, and whether the author quoted it as code."""
    # Backticked code as True, the rest stripped of `_PUNCT_EDGES` as False unless there already.
    quoted: dict[str, bool] = {}
    for v in matches:
        if v[0] == "`":
            quoted[v[1:-1]] = True
        else:
            quoted.setdefault(v.strip(_PUNCT_EDGES), False)
    return quoted


@dataclass
class FactMemo:
    """Fact matches per piece of text (a line, a sentence) and per token, shared by the
    summaries of one compaction: agent conversations repeat lines, ids and paths."""

    pieces: dict[str, list[str]] = field(default_factory=dict)
    tokens: dict[str, list[str]] = field(default_factory=dict)

    def piece(self, piece: str) -> list[str]:
        """The raw fact matches of one piece of text."""
        found = self.pieces.get(piece)
        if found is None:
            found = self.pieces[piece] = all_matches(piece, self.tokens)
        return found


def all_matches(text: str, tokens: dict[str, list[str]] | None = None) -> list[str]:
    """The fact pattern's matches, then the quoted phrases and names (see `name_matches`)."""
    return _fact_matches(text, tokens) + name_matches(text)


def facts_of_matches(matches: Iterable[str]) -> list[str]:
    """Identifiers, paths, URLs, ids, dates, numbers and names of a text, unique, in order, from
    its raw matches (a summary memoizes them per sentence; no match spans a space, so the
    matches of sentences joined by spaces are theirs in order)."""
    return [value for value in _quoted(matches) if len(value) >= _MIN_FACT_LEN]


def parse_json(text: str) -> Any | None:
    """The JSON value if the whole text is a JSON object or array, else None."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        return None
