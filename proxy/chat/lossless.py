"""The lossless tier (policy `lossless = true`): rewrites that lose no information.

Applied to every request of such a policy before anything else, including requests under their
trigger, so it saves tokens on models whose window is never reached:

- a tool result that is pretty-printed JSON is minified (only when it parses, has no duplicate
  keys, and its minified form parses back to the same value); so are a tool call's arguments;
- ANSI escape sequences and trailing whitespace are stripped from tool results, and a run of
  three or more identical non-blank lines keeps its first line and a count;
- a tool result identical to an earlier one of the same request (at least `DEDUP_MIN_CHARS`) is
  replaced by a reference to the first: `[compactd:ref=<id> identical to the output of <call>]`.

Only tool results and assistant tool-call arguments are rewritten: never system, developer or
user messages (the protected ones, and a user message that is last now is not last later, so
rewriting it then would change bytes the cache already holds).

Cache stability. A message's form depends only on the message and the messages before it, which
a client only ever appends to: the same message maps to the same bytes on every turn. A
compaction works on these forms, so a message it keeps, and the prefix it replays later, are the
same forms; `proxy.chat.checkpoint.compaction_for` records each rewritten message under its ref (the
id of its original), with the original stored like any other, so a restore gives back the exact
original whether the message was kept, summarized or dropped. Forms outside every checkpoint are
recomputed from the client's own message on each turn, and their originals are stored before the
first request that sends them goes out (`proxy.chat.persist`, `StoredForms`), so every ref a
request carries resolves from the store; it resolves from the request itself too
(`Lossless.originals`, what the expand tool reads first).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.providers.base import Message, make_ref_id
from proxy.providers.markers import identical_marker

DEDUP_MIN_CHARS = 256
"""Shorter duplicates stay: the reference would cost about as much as the text."""
RUN_MIN = 3
"""Identical lines in a row that are collapsed to one and a count."""
CACHE_SIZE = 20_000
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_TRAILING = re.compile(r"[ \t]+$", re.MULTILINE)
_TOOL_ROLES = frozenset({"tool", "function"})


@dataclass(frozen=True)
class Lossless:
    """A request's messages in their lossless forms, one for one."""

    messages: list[Message]
    refs: tuple[str | None, ...]
    """Per message: the ref id its form is recorded under, None if sent as the client sent it."""
    originals: dict[str, Message] = field(default_factory=dict)
    """Ref id -> the client's own message."""

    @property
    def changed(self) -> bool:
        return bool(self.originals)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        msg = "a duplicate key"
        raise ValueError(msg)
    return out


def minify_json(text: str) -> str | None:
    """The minified form of a pretty-printed JSON object or array, or None if it is not one,
    would not read back as the same value, or is minified already."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{" or ("\n" not in stripped and ", " not in stripped):
        return None
    try:
        value = json.loads(stripped, object_pairs_hook=_no_duplicates)
        out = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        same = json.loads(out, object_pairs_hook=_no_duplicates) == value
    except (ValueError, RecursionError):
        return None
    return out if same and len(out) < len(text) else None


def collapse_runs(text: str) -> str:
    """Runs of `RUN_MIN` or more identical non-blank lines: the first line and a count."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i + 1
        while j < len(lines) and lines[j] == lines[i]:
            j += 1
        out.append(lines[i])
        if j - i >= RUN_MIN and lines[i].strip():
            out.append(f"[the line above repeated {j - i - 1} more times]")
        else:
            out.extend(lines[i + 1 : j])
        i = j
    return "\n".join(out)


def clean_text(text: str) -> str:
    """A tool result's text in its lossless form (unchanged text if nothing applies)."""
    minified = minify_json(text)
    if minified is not None:
        return minified
    out = _ANSI.sub("", text) if "\x1b" in text else text
    out = _TRAILING.sub("", out)
    return collapse_runs(out) if "\n" in out else out


def _clean_content(content: Any) -> Any:
    if isinstance(content, str):
        return clean_text(content)
    if isinstance(content, list):
        return [
            {**p, "text": clean_text(p["text"])}
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            else p
            for p in content
        ]
    return content


def _clean_calls(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        minified = minify_json(args) if isinstance(args, str) else None
        if minified is None or not isinstance(fn, dict):
            out.append(call)
        else:
            out.append({**call, "function": {**fn, "arguments": minified}})
    return out


def clean_message(message: Message) -> Message | None:
    """The message's own lossless form, or None if it goes as it is (duplicates aside)."""
    role = message.get("role")
    if role in _TOOL_ROLES and "content" in message:
        content = _clean_content(message["content"])
        if content != message["content"]:
            return {**message, "content": content}
    elif role == "assistant" and message.get("tool_calls"):
        calls = _clean_calls(message["tool_calls"])
        if calls != message["tool_calls"]:
            return {**message, "tool_calls": calls}
    return None


def _output_key(message: Message) -> str | None:
    """What identifies a tool result's output for deduplication; None if too small to bother."""
    if message.get("role") not in _TOOL_ROLES:
        return None
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    if len(text) < DEDUP_MIN_CHARS:
        return None
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def duplicate_form(message: Message, first: Message, ref: str) -> Message:
    """A repeated tool output: a reference to its own original, naming the first occurrence."""
    call = first.get("tool_call_id") or first.get("name")
    where = f"the output of {call}" if isinstance(call, str) and call else "an earlier tool output"
    return {**message, "content": identical_marker(ref, where)}


@dataclass
class _Known:
    form: Message | None
    key: str | None


class LosslessTier:
    """Computes lossless forms; each message's own form is computed once (by digest)."""

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self.cache_size = cache_size
        self._known: OrderedDict[str, _Known] = OrderedDict()

    def entries(self) -> int:
        """Messages whose forms are held."""
        return len(self._known)

    def _lookup(self, digest: str, message: Message) -> _Known:
        known = self._known.get(digest)
        if known is None:
            known = _Known(clean_message(message), _output_key(message))
            self._known[digest] = known
            if len(self._known) > self.cache_size:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(digest)
        return known

    def apply(self, messages: Sequence[Message], digests: Sequence[str]) -> Lossless:
        """The lossless forms of `messages` (whose digests are `digests`)."""
        out: list[Message] = []
        refs: list[str | None] = []
        originals: dict[str, Message] = {}
        first: dict[str, Message] = {}
        for message, digest in zip(messages, digests, strict=True):
            known = self._lookup(digest, message)
            form = known.form
            if known.key is not None:
                earlier = first.setdefault(known.key, message)
                if earlier is not message:
                    form = duplicate_form(message, earlier, make_ref_id([message]))
            if form is None:
                out.append(message)
                refs.append(None)
                continue
            ref = make_ref_id([message])
            out.append(form)
            refs.append(ref)
            originals[ref] = message
        return Lossless(out, tuple(refs), originals)


STORED_SECONDS = 600.0
"""How long a worker trusts that a form's original is in the store before writing it again (so
a purged or expired conversation gets its originals back within this long)."""


class StoredForms:
    """Which forms' originals this worker wrote, and when: each is written once, not per turn."""

    def __init__(self, size: int = CACHE_SIZE * 5, seconds: float = STORED_SECONDS) -> None:
        self.size = size
        self.seconds = seconds
        self._at: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def entries(self) -> int:
        """Forms whose write time is held."""
        return len(self._at)

    def due(self, tenant: str, conversation: str, ref: str, now: float) -> bool:
        """Whether this form's original has to be written (again)."""
        at = self._at.get((tenant, conversation, ref))
        return at is None or now - at >= self.seconds

    def written(self, tenant: str, conversation: str, refs: Sequence[str], now: float) -> None:
        for ref in refs:
            key = (tenant, conversation, ref)
            self._at[key] = now
            self._at.move_to_end(key)
        while len(self._at) > self.size:
            self._at.popitem(last=False)
