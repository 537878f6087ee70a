"""The reference marker a compacted message carries: its forms and patterns, defined here only.

Standard library only; `proxy.providers.base` re-exports it for plugins. Three forms:

- full: `[compactd:ref=c7f3a9d2e1 … 3 messages, 2,104 tokens summarized]` (any verb);
- short: `[compactd:ref=c7f3a9d2e1]`, the cheapest a rewrite can carry when a budget is tight;
- dropped: `[compactd:ref=c7f3a9d2e1 dropped]`, the cheapest stand-in for whole messages.

Two more say where a marker's text came from, outside the providers: the lossless tier's
`[compactd:ref=<id> identical to the output of <call>]` (a repeated tool output) and the expand
tool's `[compactd:ref=<id> expanded: 2 message(s)]` (the heading of what it brings back).

A marker whose verb is "dropped" (the full form with that verb, or the dropped form) says the
message stands in for whole messages: the validator then checks only that it is a plain
user/assistant message, not that it keeps the shape of what it replaced. Every other marker on a
one-for-one replacement promises the original's role, tool identity and content type.
"""

from __future__ import annotations

import re
from collections.abc import Collection

REF_ID = r"[0-9a-f]{6,32}"
"""What a reference id looks like: lowercase hex (providers use 10 characters)."""

REF_PATTERN = re.compile(rf"\[compactd:ref=({REF_ID})\b")
"""Finds the reference ids that compacted messages carry in their text."""

DROPPED_PATTERN = re.compile(rf"\[compactd:ref={REF_ID}\b[^\]\n]*\bdropped\]")
"""Matches a marker that stands in for whole dropped messages (full or dropped form)."""


def ref_marker(ref_id: str, n_messages: int, tokens: int, verb: str = "summarized") -> str:
    """The full marker, e.g. `[compactd:ref=c7f3a9d2e1 … 3 messages, 2,104 tokens summarized]`."""
    noun = "message" if n_messages == 1 else "messages"
    return f"[compactd:ref={ref_id} … {n_messages} {noun}, {tokens:,} tokens {verb}]"


def short_marker(ref_id: str) -> str:
    """The short marker `[compactd:ref=<id>]`: a rewrite that keeps its original's shape."""
    return f"[compactd:ref={ref_id}]"


def dropped_marker(ref_id: str) -> str:
    """The dropped marker `[compactd:ref=<id> dropped]`: a plain stand-in for whole messages."""
    return f"[compactd:ref={ref_id} dropped]"


def identical_marker(ref_id: str, where: str) -> str:
    """The lossless tier's form of a repeated output: `[compactd:ref=<id> identical to …]`."""
    return f"[compactd:ref={ref_id} identical to {where}]"


def expanded_marker(ref_id: str, n_messages: int) -> str:
    """The heading of the expand tool's answer: `[compactd:ref=<id> expanded: n message(s)]`."""
    return f"[compactd:ref={ref_id} expanded: {n_messages} message(s)]"


def refs_in_text(text: str) -> list[str]:
    """Reference ids in a text, once each, in order of first appearance."""
    return list(dict.fromkeys(REF_PATTERN.findall(text)))


def is_stand_in(text: str) -> bool:
    """Whether a text carries a marker saying it stands in for whole dropped messages."""
    return DROPPED_PATTERN.search(text) is not None


def is_written_stand_in(text: str, refs: Collection[str], replaced: str) -> bool:
    """Whether a rewrite's text carries a "dropped" marker its provider wrote: one naming a ref
    of this very replacement (`refs`) that the text it replaces (`replaced`) did not already
    hold. A client's text can quote a marker; it cannot name the ref of its own content (a
    digest of it), so a forged one never waives the shape check of a one-for-one rewrite."""
    for found in DROPPED_PATTERN.finditer(text):
        ref = REF_PATTERN.match(found.group())
        if ref is not None and ref.group(1) in refs and found.group() not in replaced:
            return True
    return False
