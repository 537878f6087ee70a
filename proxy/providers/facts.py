"""Facts: what a paraphrase would lose (ids, paths, names, quoted code, dates, amounts, errors).

Standard library only. Facts are found with one cheap pattern, ranked by how much they tell per
character, and packed into a character budget; JSON documents give their scalar leaves grouped
by key instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from typing import Any

# A fact is what a paraphrase would lose: inline `code`, or a token holding a digit, an
# underscore, a slash or an @, a dot inside a word (`utils.py`, `aider.repo`) or a lower-to-upper
# hump (`warmCache`). One cheap pattern anchored at token starts finds them; ranking is per match.
# Not right after `<`: a closing markup tag (`</output>`) is structure, not a path.
_FACT = re.compile(
    r"`[^`\s]{2,60}`"
    r"|(?<![\w./@$€£~:%+<-])[\w./@$€£~:%+-]*"
    r"(?:[\d_/@]|\w\.\w|[a-z][A-Z]|[A-Z]{2}[a-z]|[A-Z]-[A-Za-z]|[a-z]-[A-Z]|\w\+[A-Z]|[A-Za-z]#)"
    r"[\w./@$€£~:%+?=&#-]*"
)


def unshown(
    found: list[tuple[int, str]], shown: dict[str, bool], occurs: Callable[[str], bool]
) -> list[tuple[int, str]]:
    """The (rank, fact) pairs of `found` whose fact `occurs` says is not in the text every rung
    keeps (a stub lists them), each fact's answer remembered in `shown` (facts repeat from
    message to message)."""
    kept = []
    for c in found:
        hit = shown.get(c[1])
        if hit is None:
            hit = shown[c[1]] = occurs(c[1])
        if not hit:
            kept.append(c)
    return kept


def occurs_in(text: str) -> Callable[[str], bool]:
    """Whether a str occurs in text, for asking of many strs: a stub's hundreds of candidate
    facts, against the text every rung keeps."""
    return text.__contains__


_PUNCT_EDGES = ".:,-+%~"
# Stripped from a token before testing whether it is a plain word: none of these can start or
# complete a fact (digits, `_`, `/`, `@` and backticks are not among them; a dot at the edge has
# no word character on one side).
_WORD_EDGES = ".,;:!?()\"'"
# Characters a single regex call scans at most (when lines allow): ~5 ms of holding the GIL.
SCAN_CHARS = 32_768
_ERROR_LINE = re.compile(
    r"\b(?:error|exception|traceback|failed|failure|fatal|denied|refused|not found|invalid)\b"
    r"|(?-i:[a-z](?:Error|Exception))\b",
    re.I,
)
# For lowered text (case-sensitive patterns run much faster than re.I ones).
ERROR_WORDS = re.compile(
    r"\b(?:error|exception|traceback|failed|failure|fatal|denied|refused|not found|invalid)\b"
    r"|[a-z](?:error|exception)\b"
)
# Every match of ERROR_WORDS / _ERROR_LINE contains one of these (lowered): a text without any
# skips the patterns.
ERROR_HINTS = (
    "error", "exception", "traceback", "fail", "fatal", "denied", "refused", "not found", "invalid",
)  # fmt: skip
_ID_SHAPE = re.compile(r"[\w.@-]+")
_THREE_DIGITS = re.compile(r"\d\D*\d\D*\d")
_CODE = re.compile(r"[A-Z0-9]{5,8}")
_MIN_FACT_LEN = 2
_DIGIT = re.compile(r"\d")
_PATHLIKE = re.compile(r"^[\w.-]*/[\w./-]*\w$|^[\w-]+\.[a-z]{1,4}$")
_LETTER = re.compile(r"[^\W\d_]")


def _rank(value: str, quoted: bool = False) -> int:
    """0: what the author quoted as `code`, paths and ids (letters and digits); 1: other names,
    URLs and dates; 2: amounts; 3: other numbers."""
    if quoted or _PATHLIKE.search(value):
        return 0
    digits = _DIGIT.search(value) is not None
    letters = _LETTER.search(value) is not None
    if digits and letters:
        return 0 if "://" not in value else 1
    if letters or value.count("-") == 2:
        return 1
    return 2 if value[0] in "$€£" or len(value) >= 3 else 3


def scan_spans(
    text: str, size: int, boundaries: str, start: int = 0, stop: int | None = None
) -> Iterator[tuple[int, int]]:
    """(start, end) pieces of text[start:stop] of about `size` characters, each ending just
    after one of the `boundaries` characters, or at 2 * size when none comes before (a text
    without them is still cut: no piece is ever longer)."""
    n = len(text) if stop is None else stop
    if n - start <= size:  # one piece (most texts): what the loop below yields, without its finds
        if start < n:
            yield start, n
        return
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
        # A possessive stays as written (`Jay Chou's`: it holds the name too; a list that has
        # both keeps the possessive, see `_without_contained`). Most names are one word (only
        # blanks and tabs separate a name's words): no split for those.
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
    quoted: dict[str, bool] = {}
    _quote_into(quoted, matches)
    return quoted


def _quote_into(quoted: dict[str, bool], matches: Iterable[str]) -> None:
    """Each match's fact into `quoted`: backticked code as True, the rest stripped of
    `_PUNCT_EDGES` as False unless there already."""
    for v in matches:
        if v[0] == "`":
            quoted[v[1:-1]] = True
        else:
            quoted.setdefault(v.strip(_PUNCT_EDGES), False)


@dataclass
class FactMemo:
    """Fact matches per piece of text (a line, a sentence) and ranks per fact, shared by the
    analyses of one compaction: agent conversations repeat lines, ids and paths."""

    pieces: dict[str, list[str]] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, list[str]] = field(default_factory=dict)

    def piece(self, piece: str) -> list[str]:
        """The raw fact matches of one piece of text."""
        found = self.pieces.get(piece)
        if found is None:
            found = self.pieces[piece] = all_matches(piece, self.tokens)
        return found

    def matches(self, text: str) -> list[str]:
        """`all_matches(text)`, with the fact matches of each distinct token found once (a
        whole text is scanned at once: per-line calls cost more than repeated lines save)."""
        return all_matches(text, self.tokens)

    def rank(self, value: str, quoted: bool) -> int:
        """`_rank(value, quoted)`, computed once per fact (quoted facts always rank 0)."""
        if quoted:
            return 0
        found = self.ranks.get(value)
        if found is None:
            found = self.ranks[value] = _rank(value)
        return found


def all_matches(text: str, tokens: dict[str, list[str]] | None = None) -> list[str]:
    """The fact pattern's matches, then the quoted phrases and names (see `name_matches`)."""
    return _fact_matches(text, tokens) + name_matches(text)


def _ranked_facts(text: str, memo: FactMemo | None = None) -> list[tuple[int, int, str]]:
    """(rank, position, fact) for each distinct fact of `text` of at least `_MIN_FACT_LEN`
    characters, in order of appearance."""
    distinct = _distinct(text, memo)
    if memo is None:
        return [
            (_rank(value, q), pos, value)
            for pos, (value, q) in enumerate(distinct.items())
            if len(value) >= _MIN_FACT_LEN
        ]
    # `memo.rank` inlined: a long output has thousands of distinct facts.
    ranks = memo.ranks
    get = ranks.get
    out: list[tuple[int, int, str]] = []
    add = out.append
    for pos, (value, quoted) in enumerate(distinct.items()):
        if len(value) < _MIN_FACT_LEN:
            continue
        if quoted:
            add((0, pos, value))
            continue
        found = get(value)
        if found is None:
            found = ranks[value] = _rank(value)
        add((found, pos, value))
    return out


def _distinct(text: str, memo: FactMemo | None) -> dict[str, bool]:
    """`_quoted(all_matches(text))`. A long text is scanned a piece at a time and only its
    distinct facts are kept: the list of every match of a multi-megabyte text would hold the GIL
    for tens of milliseconds just to be freed."""
    tokens = None if memo is None else memo.tokens
    if len(text) <= SCAN_CHARS:
        return _quoted(all_matches(text, tokens))
    quoted: dict[str, bool] = {}
    spans = list(scan_spans(text, SCAN_CHARS, " \n"))
    for start, end in spans:
        _quote_into(quoted, _scan(text[start:end], tokens))
    for start, end in spans:
        _quote_into(quoted, name_matches(text[start:end]))
    return quoted


def fact_items(text: str) -> list[str]:
    """Identifiers, paths, URLs, ids, dates, numbers and names in `text`, unique, in order."""
    return facts_of_matches(all_matches(text))


def facts_of_matches(matches: Iterable[str]) -> list[str]:
    """`fact_items` of a text from its raw matches (a summary memoizes them per sentence; no match
    spans a space, so the matches of sentences joined by spaces are theirs in order)."""
    # Ranking is skipped: only the values are wanted, and ranking costs more than the scan.
    return [value for value in _quoted(matches) if len(value) >= _MIN_FACT_LEN]


def pack_ranked(items: Iterable[tuple[int, int, str]], max_chars: int, sep: str) -> list[str]:
    """The best-ranked items that fit in max_chars, back in their original order."""
    # Items arrive (nearly) in position order and ranks are few: bucketing by rank and sorting
    # each bucket (linear on sorted input) beats sorting thousands of tuples; nothing fits once
    # less than one separator is left, so the scan stops there.
    buckets: dict[int, list[tuple[int, int, str]]] = {}
    for item in items:
        bucket = buckets.get(item[0])
        if bucket is None:
            buckets[item[0]] = [item]
        else:
            bucket.append(item)
    chosen: list[tuple[int, int, str]] = []
    used = 0
    floor = max_chars - len(sep)
    for rank in sorted(buckets):
        if used > floor:
            break
        bucket = buckets[rank]
        bucket.sort()
        for item in bucket:
            if used > floor:
                break
            cost = len(item[2]) + len(sep)
            if used + cost > max_chars:
                continue
            chosen.append(item)
            used += cost
    chosen.sort(key=lambda t: t[1])
    return [value for _, _, value in chosen]


def error_lines(text: str, limit: int = 2, width: int = 120) -> list[str]:
    """The last `limit` lines that report an error (the final one is usually the cause). A long
    text is searched a piece at a time (cut at line breaks) from its end, until enough lines
    are found."""
    if len(text) <= SCAN_CHARS:
        return _error_lines(text, limit, width)
    found: list[str] = []
    for start, end in reversed(list(scan_spans(text, SCAN_CHARS, "\n"))):
        earlier = [ln for ln in _error_lines(text[start:end], limit, width) if ln not in found]
        found = earlier + found
        if len(found) >= limit:
            break
    return found[-limit:]


def _error_lines(text: str, limit: int, width: int) -> list[str]:
    low = text.lower()
    # Case-sensitive matching of the lowered text is several times faster than re.I; lower()
    # keeps positions unless some character changes length (rare: then search the original).
    if len(low) != len(text):
        starts: Iterable[int] = (m.start() for m in _ERROR_LINE.finditer(text))
    else:
        starts = _error_starts(low)
    lines: dict[str, None] = {}
    line_end = -1
    for at in starts:
        if at < line_end:
            continue  # this line is in already
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        line_end = end if end >= 0 else len(text)
        lines[text[start:line_end].strip()] = None
    return [ln[:width] for ln in list(lines)[-limit:]]


def _error_starts(low: str) -> list[int]:
    """Positions in lowered text where ERROR_WORDS matches, ascending (one per match at least).

    Every match starts at an occurrence of a hint word or one letter before one (`keyerror`), so
    the pattern is tried only there: a search from every position of a long text costs ~60 ns
    a character, finding the hints a few."""
    found: set[int] = set()
    for word in ERROR_HINTS:
        at = low.find(word)
        while at >= 0:
            for start in (at, at - 1):
                if start >= 0 and ERROR_WORDS.match(low, start):
                    found.add(start)
                    break
            at = low.find(word, at + 1)
    return sorted(found)


def _id_like(value: str) -> bool:
    return bool(_ID_SHAPE.fullmatch(value)) and bool(
        _THREE_DIGITS.search(value) or _CODE.fullmatch(value)
    )


def _json_items(value: Any) -> dict[tuple[str, str], tuple[int, int]]:
    """(key, scalar) -> (rank, position) for every leaf of a JSON value; id-like keys count too."""
    items: dict[tuple[str, str], tuple[int, int]] = {}
    # Keys and values repeat through a document (`flight_number` in every element): each
    # distinct string is tested once.
    like: dict[str, bool] = {}

    def walk(node: Any, key: str, depth: int) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                name = str(k)
                found = like.get(name)
                if found is None:
                    found = like[name] = _id_like(name)
                if found:
                    items.setdefault((key, name), (0, len(items)))
                walk(v, name, depth + 1)
        elif isinstance(node, list):
            for v in node:
                walk(v, key, depth + 1)
        elif node not in (None, "", False) and not isinstance(node, bool):
            text = str(node)
            found = like.get(text)
            if found is None:
                found = like[text] = _id_like(text)
            rank = 0 if found else (1 if isinstance(node, int | float) else 2 + min(depth, 3))
            items.setdefault((key, text), (rank, len(items)))

    walk(value, "", 0)
    return items


def _json_facts(items: dict[tuple[str, str], tuple[int, int]], max_chars: int) -> str | None:
    """Scalar leaves grouped by key (`flight_number: HAT069, HAT083; price: 121`), ids first."""
    chosen: list[tuple[int, str, str]] = []
    keys_used: set[str] = set()
    used = 0
    for (key, text), (_rank, pos) in sorted(items.items(), key=itemgetter(1)):
        cost = len(text) + 2 + (0 if key in keys_used else len(key) + 4)
        if used + cost > max_chars:
            continue
        keys_used.add(key)
        chosen.append((pos, key, text))
        used += cost
    if not chosen:
        return None
    groups: dict[str, list[str]] = {}
    for _pos, key, text in sorted(chosen):
        groups.setdefault(key, []).append(text)
    return "; ".join(f"{k}: {', '.join(v)}" if k else ", ".join(v) for k, v in groups.items())


@dataclass(frozen=True)
class TextFacts:
    """What fact extraction finds in one text, computed once and packed at any budget."""

    json: Any | None
    """The parsed value when the whole text is a JSON document."""
    ranked: list[tuple[int, int, str]]
    text: str
    """The text analysed (a JSON document's is not kept: its error lines are none)."""
    leaves: dict[tuple[str, str], tuple[int, int]]
    """A JSON document's (key, scalar) -> (rank, position)."""

    @cached_property
    def errors(self) -> list[str]:
        """The text's error lines, found when first wanted: a stub reads only the ranked facts
        of most of the texts it is analysed for."""
        return error_lines(self.text) if self.text else []


def analyze(text: str, memo: FactMemo | None = None) -> TextFacts:
    """The facts of `text` (its JSON leaves, or its ranked facts and error lines); `memo` shares
    work between the analyses of one compaction (same result)."""
    value = parse_json(text)
    if value is not None:
        return TextFacts(value, [], "", _json_items(value))
    return TextFacts(None, _ranked_facts(text, memo), text, {})


def candidates_of(found: TextFacts) -> list[tuple[int, str]]:
    """(rank, fact) pairs of an analysed text in order of appearance; lower ranks matter more."""
    if found.json is not None:
        # In order of position already: each leaf's is how many were found before it.
        return [(rank, fact) for (_key, fact), (rank, _pos) in found.leaves.items()]
    return [(rank, fact) for rank, _pos, fact in found.ranked]


def fact_candidates(text: str) -> list[tuple[int, str]]:
    """(rank, fact) pairs of a text in order of appearance; lower ranks matter more."""
    return candidates_of(analyze(text))


def pack_facts(candidates: Iterable[tuple[int, str]], max_chars: int) -> str:
    """The best-ranked unique facts that fit in max_chars, comma-separated, in original order."""
    unique: dict[str, tuple[int, int, str]] = {}
    for pos, (rank, fact) in enumerate(candidates):
        if fact not in unique:
            unique[fact] = (rank, pos, fact)
    return ", ".join(pack_ranked(unique.values(), max_chars, ", "))


_DIGIT_RUN = re.compile(r"\d+")
# A shape of digit runs (`0`) and number punctuation only: never a tag (see `structural_shapes`).
_NUMERIC_SHAPE = re.compile(r"[0.,/%$€£+-]+")
_ASCII_DIGITS = frozenset("0123456789")
# Structural tags rank after everything else.
_STRUCTURAL_RANK = 9
_STRUCTURAL_KEEP = 2
# Mentions in how many messages set the order within a rank: 3 or more, 2, 1.
_MENTION_TIERS = 3


def fact_shape(fact: str) -> str:
    """What near-identical facts share: digit runs as 0, letters lowered (`D1:12` -> `d0:0`)."""
    return _DIGIT_RUN.sub("0", fact.lower())


def shape_counts(
    group: Sequence[tuple[int, str]], shapes: dict[str, str] | None = None
) -> dict[str, set[str]]:
    """One message's facts that hold a digit (only those can be tags), grouped by shape;
    `shapes` memoizes `fact_shape`."""
    memo: dict[str, str] = {} if shapes is None else shapes
    out: dict[str, set[str]] = {}
    for _rank, fact in group:
        shape = memo.get(fact)
        if shape is None:
            # An ASCII fact without a digit is its own shape, lowered (no regex call).
            if fact.isascii() and _ASCII_DIGITS.isdisjoint(fact):
                shape = memo[fact] = fact.lower()
            else:
                shape = memo[fact] = fact_shape(fact)
        if "0" in shape:
            out.setdefault(shape, set()).add(fact)
    return out


# A structural tag is on at least this many messages (and 2/5 of them): fewer messages have none.
TAG_MESSAGES = 5


def structural_shapes(counts: Sequence[dict[str, set[str]]]) -> frozenset[str]:
    """The shapes of facts that tag messages rather than say something, from each message's
    `shape_counts`: many distinct values (at least 5), one or two per message, on at least 2/5
    of the messages (and 5), and a shape with a letter or a colon: turn ids `D1:1`, `D1:2` …,
    a timestamp per message. A shape of digits and `.,/-` alone is a number, an amount, a
    fraction or a date (`89.3`, `91.1`, `93.5`: a metric told session after session), content
    however regularly it comes."""
    shape_in: dict[str, int] = {}
    shape_most: dict[str, int] = {}
    shape_values: dict[str, set[str]] = {}
    for group in counts:
        for shape, values in group.items():
            shape_in[shape] = shape_in.get(shape, 0) + 1
            shape_most[shape] = max(shape_most.get(shape, 0), len(values))
            shape_values.setdefault(shape, set()).update(values)
    least = max(TAG_MESSAGES, -(-len(counts) * 2 // 5))  # 2/5 rounded up: 5 of 14 are not
    return frozenset(
        shape
        for shape, k in shape_in.items()
        if k >= least
        and shape_most[shape] <= 2
        and len(shape_values[shape]) >= 5
        and not _NUMERIC_SHAPE.fullmatch(shape)
    )


def pack_salient(
    groups: Sequence[Sequence[tuple[int, str]]],
    max_chars: int,
    structural: frozenset[str] | None = None,
    shapes: dict[str, str] | None = None,
) -> str:
    """`pack_facts` over the candidates of several messages, preferring what is specific.

    Facts of a `structural` shape (by default those of these groups, see `structural_shapes`)
    rank last and at most two of them are listed. Facts contained in an already chosen one are
    left out. A fact that several of the messages mention goes first within its rank: it is
    often what they are about, and when they are all folded it is kept nowhere else."""
    memo: dict[str, str] = {} if shapes is None else shapes
    if structural is None:
        structural = structural_shapes([shape_counts(group, memo) for group in groups])
    unique: dict[str, tuple[int, int, str]] = {}
    kept_structural: dict[str, int] = {}
    mentions: dict[str, int] = {}
    pos = 0
    for group in groups:
        for base, fact in group:
            pos += 1
            if fact in unique:
                mentions[fact] += 1
                continue
            mentions[fact] = 1
            rank = base
            if structural:
                shape = memo.get(fact)
                if shape is None:
                    shape = memo[fact] = fact_shape(fact)
                if shape in structural:
                    if kept_structural.get(shape, 0) >= _STRUCTURAL_KEEP:
                        continue
                    kept_structural[shape] = kept_structural.get(shape, 0) + 1
                    rank = _STRUCTURAL_RANK
            unique[fact] = (rank, pos, fact)
    # Within a rank, what several of the messages mention (the file they work on, the person
    # they talk about) goes before what one of them lists once.
    ranked = [
        (rank * _MENTION_TIERS + _MENTION_TIERS - min(mentions[fact], _MENTION_TIERS), pos, fact)
        for rank, pos, fact in unique.values()
    ]
    chosen = pack_ranked(ranked, max_chars, ", ")
    return ", ".join(_without_contained(chosen))


def _without_contained(facts: list[str]) -> list[str]:
    """The facts that no longer chosen fact contains (`Prejudice` beside `Pride and Prejudice`,
    `000` beside `300,000`, `Maria` beside `Maria's`, `GPU` beside `GPUs`: a plural holds its
    singular; `TensorRT` beside `TensorRT?`)."""
    longer = [f for f in facts if " " in f or "," in f]
    owners = {f[:-2] for f in facts if f.endswith(("'s", "es"))}
    owners.update(f[:-1] for f in facts if f.endswith(("s", "?")) and len(f) > 2)
    if not longer and not owners:
        return facts
    return [f for f in facts if f not in owners and not any(f != g and f in g for g in longer)]


def parse_json(text: str) -> Any | None:
    """The JSON value if the whole text is a JSON object or array, else None."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        return None


def facts_within(found: TextFacts, max_chars: int) -> str:
    """An analysed text's facts (error lines first, then ids, paths, numbers), at most max_chars."""
    if found.json is not None:
        return _json_facts(found.leaves, max_chars) or ""
    parts = [ln for ln in found.errors if len(ln) < max_chars // 2]
    budget = max_chars - sum(len(p) + 3 for p in parts)
    facts = pack_ranked(found.ranked, budget, ", ")
    if facts:
        parts.append(", ".join(facts))
    return " | ".join(parts)[:max_chars]


def extract_facts(text: str, max_chars: int) -> str:
    """Only the facts of `text` (error lines first, then ids, paths, numbers), at most max_chars."""
    return facts_within(analyze(text), max_chars)
