"""Whether a probe survives compaction: verbatim (it appears anywhere) and in context.

A probe is kept *in context* when some occurrence of it in the original messages survives in the
compacted ones together with up to `CONTEXT` non-space characters of its original surroundings
on each side (fewer only where the original message's text ends). Whitespace is ignored
everywhere, so minified and indented JSON, or re-wrapped prose, still count; a window never
crosses a message boundary, in the original or in the result. A bare term in a list of terms is
kept verbatim but not in context: a model cannot tell what it was.

The text searched is each non-system message's text plus the names and raw arguments of its tool
calls (`message_search_text`). Windows are computed once per case (`Windows`); each result is
squeezed once (`squeezed_text`) and every window is a substring test on it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence

from proxy.providers.base import Message
from proxy.providers.units import message_text

CONTEXT = 24
"""Non-space characters of the original surroundings a probe must keep on each side."""
_SPACE = re.compile(r"\s")
_SPACES = re.compile(r"\s+")
# Joins messages in a squeezed text: not whitespace (so it survives squeezing) and never in a
# window, so no window matches across two messages of a result.
_BOUNDARY = "\x00"
INSTRUCTION_ROLES = ("system", "developer")


def message_search_text(message: Message) -> str:
    """A message's text, then the name and raw arguments of each of its tool calls."""
    parts = [message_text(message)]
    for call in message.get("tool_calls") or ():
        function = (call.get("function") if isinstance(call, dict) else None) or {}
        parts.append(str(function.get("name") or ""))
        arguments = function.get("arguments")
        parts.append(arguments if isinstance(arguments, str) else str(arguments or ""))
    return "\n".join(p for p in parts if p)


def searchable(messages: Sequence[Message], skip_system: bool = True) -> str:
    """The search text of the messages (system/developer skipped unless asked), one per line."""
    return "\n".join(
        message_search_text(m)
        for m in messages
        if not (skip_system and m.get("role") in INSTRUCTION_ROLES)
    )


def squeeze(text: str) -> str:
    """`text` without any whitespace."""
    return _SPACES.sub("", text)


def squeezed_text(messages: Sequence[Message]) -> str:
    """The squeezed search text of the non-system messages, message boundaries marked."""
    return _BOUNDARY.join(
        squeeze(message_search_text(m)) for m in messages if m.get("role") not in INSTRUCTION_ROLES
    )


class _Squeezed:
    """One message's search text with its squeezed form, made once for all its probes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.spaces = [m.start() for m in _SPACE.finditer(text)]
        self.flat = squeeze(text)

    def windows(self, probe: str, context: int) -> set[str]:
        """The squeezed windows of every occurrence of `probe` in the text."""
        out: set[str] = set()
        width = len(squeeze(probe))
        start = self.text.find(probe)
        while start >= 0:
            at = start - bisect.bisect_left(self.spaces, start)  # the occurrence, squeezed
            out.add(self.flat[max(0, at - context) : at + width + context])
            start = self.text.find(probe, start + 1)
        return out


class Windows:
    """Each probe's windows (squeezed occurrence plus context) in the original messages."""

    def __init__(
        self, messages: Sequence[Message], facts: Iterable[str], context: int = CONTEXT
    ) -> None:
        texts = [message_search_text(m) for m in messages if m.get("role") not in INSTRUCTION_ROLES]
        squeezed: dict[int, _Squeezed] = {}  # only the messages that hold some probe
        self.windows: dict[str, tuple[str, ...]] = {}
        for fact in facts:
            found: set[str] = set()
            for i, text in enumerate(texts):
                if fact in text:
                    found |= squeezed.setdefault(i, _Squeezed(text)).windows(fact, context)
            self.windows[fact] = tuple(sorted(found))
        self.flat = {fact: squeeze(fact) for fact in self.windows}

    def kept(self, squeezed: str) -> int:
        """How many probes keep some window in `squeezed` (a `squeezed_text` of a result)."""
        n = 0
        for fact, windows in self.windows.items():
            flat = self.flat[fact]
            if flat and flat in squeezed and any(w in squeezed for w in windows):
                n += 1
        return n


def kept_verbatim(facts: Iterable[str], text: str) -> int:
    """How many facts appear anywhere in `text` (a `searchable` of a result)."""
    return sum(1 for f in facts if f in text)
