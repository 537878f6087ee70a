"""Fact probes: what a conversation uses next, never what a compactor's extractor recognises.

One filter for every corpus (`probes`): a candidate is a probe when it occurs outside the
protected messages (system/developer, the last user message, the final message) and in none of
them, so a provider that kept only what it must would lose them all. The candidates:

- agent runs (`agent_probes`): the run is cut where the model is about to act (`cut_point`:
  the first assistant turn at or past `CUT_SHARE` of the messages); the history before the cut
  is the request to compact, the turns after it are what the agent does next. Candidates are the
  values the later tool calls pass (scalar arguments; the specific tokens of a shell command or
  edit), the specific tokens the later assistant turns name, and the raw material the corpus
  gives (the files, hunk functions and removed lines of the final patch). A probe is what the
  agent uses next that only the compacted history holds.
- QA chats (`answer_items`): the names, numbers and quoted strings of the annotated answers to
  the question about earlier sessions.
- other chats (`rare_items`): specific items (ids, numbers, dates, URLs in any wrapping, paths,
  quoted strings, names) that occur in at most `RARE` messages: what was said once and matters.

Nothing here reads proxy/text/facts.py: a provider is not scored by its own rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from bench.measure import message_search_text, searchable
from proxy.providers.base import Message
from proxy.providers.units import hard_protected

CUT_SHARE = 0.6
"""Where an agent run is cut: the first assistant turn at or past this share of its messages."""
RARE = 3
"""A chat item is a probe only if it occurs in at most this many messages."""

# URLs: any scheme-less `www.` too; `<https://…>` and markdown `[t](https://…)` lose their
# wrapping in `_trim_url`, parentheses inside a URL are kept when balanced.
_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"'`\]]+")
_QUOTED = re.compile(r"[\"“]([^\"”\n]{3,60})[\"”]")
_EMPHASIS = re.compile(r"(?<![*\w])\*{1,2}([^*\n]{3,60}?)\*{1,2}(?![*\w])")
_NUMBERED = re.compile(r"(?<![\w.-])\$?\d[\w.,:/%-]*\w|(?<![\w.-])\$?\d\b")
# Ids: a word that mixes letters and digits (INV-20931, HAT136, mia_li_3668).
_ID = re.compile(r"(?<![\w.-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]*[A-Za-z0-9]")
_DATE = re.compile(
    r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}(?:, \d{4})?\b"
)
_EXTENSIONS = "py|js|ts|md|json|toml|yml|yaml|txt|sh|cfg|ini|html|css|rs|go|c|h|cpp|java"
_PATH = re.compile(rf"(?<![\w/.-])(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:{_EXTENSIONS})\b")
_NAME = re.compile(r"(?<![\w'])[A-Z][\w'-]+(?: (?:of |the |de |and )?[A-Z][\w'-]+){0,3}")
# A name does not start a sentence: it follows a lower-case word (or a comma) and a space.
_AFTER_WORD = frozenset(f"{c} " for c in "abcdefghijklmnopqrstuvwxyz,;")
_CAPS_WORDS = "I I'm I've I'll I'd OK Ok AI Yes No Oh Hi Hello Thanks The A An It This That Mr Mrs"
_COMMON_CAPS = frozenset(_CAPS_WORDS.split())
# Tokens of code and commands: identifiers, dotted names, paths, numbers.
_TOKEN = re.compile(r"[A-Za-z_][\w.\-/]*[\w]|\d[\w.:\-]*")
_TICKED = re.compile(r"`([^`\n]{3,80})`")
_SHELL_QUOTED = re.compile(r"'([^'\n]{4,80})'|\"([^\"\n]{4,80})\"")


def probes(messages: Sequence[Message], candidates: Iterable[str]) -> list[str]:
    """The candidates that occur outside the protected messages and in none of them."""
    keep = hard_protected(messages)
    inside = searchable([messages[i] for i in sorted(keep)], skip_system=False)
    outside = searchable([m for i, m in enumerate(messages) if i not in keep])
    return sorted({c for c in candidates if c and c in outside and c not in inside})


def _trim_url(url: str) -> str:
    """A URL without the punctuation or unbalanced closing bracket that ends its sentence."""
    while url and url[-1] in ".,;:!?)*_":
        if url[-1] == ")" and url.count("(") >= url.count(")"):
            break
        url = url[:-1]
    return url


def urls(text: str) -> set[str]:
    """The URLs of a text, bare, in `<…>`, in markdown links, with balanced parentheses."""
    return {u for u in (_trim_url(m.group()) for m in _URL.finditer(text)) if len(u) > 8}


def specific_items(text: str) -> set[str]:
    """Ids, numbers, dates, URLs, paths, quoted or emphasised titles and names of a chat text."""
    found = urls(text)
    bare = _URL.sub(" ", text)  # the parts of a URL are not items of their own
    found |= {q.strip() for q in _QUOTED.findall(bare)}
    found |= {e.strip() for e in _EMPHASIS.findall(bare)}
    found |= {n for n in _NUMBERED.findall(bare) if len(n) >= 2}
    found |= {i for i in _ID.findall(bare) if len(i) >= 3}
    found |= set(_DATE.findall(bare))
    found |= {p for p in _PATH.findall(bare) if not p.replace(".", "").replace("/", "").isdigit()}
    found |= {
        m.group()
        for m in _NAME.finditer(bare)
        if bare[m.start() - 2 : m.start()] in _AFTER_WORD
        and m.group().split()[0] not in _COMMON_CAPS
    }
    return {f for f in found if len(f) >= 2}


def rare_items(messages: Sequence[Message], most: int = RARE) -> list[str]:
    """The probes of a chat: its specific items that occur in at most `most` messages."""
    texts = [message_search_text(m) for m in messages if m.get("role") not in ("system",)]
    candidates = specific_items("\n".join(texts))
    rare = [c for c in candidates if sum(1 for t in texts if c in t) <= most]
    return probes(messages, rare)


def answer_items(answers: Iterable[str]) -> set[str]:
    """The names, numbers and quoted strings of free-text answers (an answer's first word,
    capitalized because it starts the answer, is not a name)."""
    found: set[str] = set()
    for answer in answers:
        found |= {n for n in _NUMBERED.findall(answer) if len(n) >= 2}
        found |= {q.strip() for q in _QUOTED.findall(answer)}
        for m in _NAME.finditer(answer):
            words = m.group().split()
            if m.start() == 0 or answer[m.start() - 2 : m.start()] in (". ", "! ", "? "):
                words = words[1:]  # a sentence start: the rest may still be a name
            while words and words[0] in _COMMON_CAPS:
                words = words[1:]
            if words:
                found.add(" ".join(words))
    return {f for f in found if len(f) >= 2}


def _specific_token(token: str) -> bool:
    """Whether a code or command token names something (not a plain word or a small number)."""
    if token.isdigit():
        return len(token) >= 3
    if len(token) < 4:
        return False
    return (
        any(c in token for c in "_./")
        or any(c.isdigit() for c in token)
        or (token[1:] != token[1:].lower() and token[1:] != token[1:].upper())
    )


def code_items(text: str, quoted: bool = True) -> set[str]:
    """The specific tokens and backticked names of code, a command or prose, and (`quoted`:
    code and commands, where quotes are not apostrophes) its quoted strings."""
    tokens = [t.rstrip(".") for t in _TOKEN.findall(text)]
    tokens += [part for t in tokens if "/" in t for part in t.split("/")]  # sed's s/a/b/
    found = {t for t in tokens if _specific_token(t)}
    strings = {t.strip() for t in _TICKED.findall(text)}
    if quoted:
        strings |= {(a or b).strip() for a, b in _SHELL_QUOTED.findall(text)}
    found |= {q for q in strings if " " in q or _specific_token(q)}
    return {f for f in found if len(f) >= 3}


def _scalars(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, list):
        for v in value:
            yield from _scalars(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def call_values(message: Message) -> set[str]:
    """The values a message's tool calls pass: short scalars whole, commands and code by their
    specific tokens."""
    found: set[str] = set()
    for call in message.get("tool_calls") or ():
        raw = (call.get("function") or {}).get("arguments") or ""
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = raw
        for value in _scalars(arguments):
            if len(value) <= 40 and not any(c.isspace() for c in value):
                if any(c.isdigit() or c in "_./-@" for c in value) and len(value) >= 2:
                    found.add(value)
            else:
                found |= code_items(value)
    return found


def cut_point(messages: Sequence[Message], share: float = CUT_SHARE) -> int:
    """Index of the first assistant message at or past `share` of the run (its length if none):
    the request sent just before it is what gets compacted."""
    start = max(2, int(len(messages) * share))
    for i in range(start, len(messages)):
        if messages[i].get("role") == "assistant":
            return i
    return len(messages)


def used_next(after: Sequence[Message]) -> set[str]:
    """What the turns after the cut use: the values of their tool calls and what their assistant
    text names."""
    found: set[str] = set()
    for m in after:
        if m.get("role") == "assistant":
            found |= call_values(m)
            text = m.get("content")
            if isinstance(text, str):
                found |= code_items(text, quoted=False)
    return found


def agent_probes(
    messages: Sequence[Message], extra: Iterable[str] = (), share: float = CUT_SHARE
) -> tuple[list[Message], list[str]]:
    """An agent run cut before an assistant turn, and its probes: what the turns after the cut
    use (and `extra`, e.g. the final patch's lines) that the history before it holds."""
    cut = cut_point(messages, share)
    before = list(messages[:cut])
    return before, probes(before, used_next(messages[cut:]) | set(extra))
