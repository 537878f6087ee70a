"""What the Responses and Messages adapters share: chat messages that carry their API's own items.

An adapter projects a request's items onto chat messages, the units every provider already knows
(a user message; an assistant message with its tool calls, followed by one `tool` message per
result). Each projected message carries, under `NATIVE`, the API's own items it stands for,
verbatim except for the client's cache breakpoints (`Marks`): those belong to this request, not
to the history, and the client moves them every turn, so they stay out of every digest and are
put back on the way out.

On the way back a projected message that is unchanged goes back as those very items; one a
provider rewrote goes back in the API's own shape, rebuilt from its items, with everything the
projection does not show (reasoning and its encrypted content, thinking blocks and signatures,
built-in tool results, images a rewrite kept) exactly as it was; a stand-in for dropped units
becomes a plain text message. What only the native items carry is counted by `NativeCounter`.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.providers.base import CompactionResult
from proxy.providers.markers import is_written_stand_in
from proxy.providers.units import final_unit_start, message_text
from proxy.providers.validate import align
from proxy.runtime.digest import canonical_message, message_digest
from proxy.tokens.counter import REPLY_PRIMING, TokenCounter
from proxy.tokens.media import image_part_tokens
from proxy.tokens.toolschema import dump

Message = dict[str, Any]

NATIVE = "compactd_native"
"""The key of a projected chat message under which its API's own items travel."""

# String fields whose value is opaque to the model's tokenizer (ciphertext, base64): counted by
# length, at the rate of base64 text, rather than encoded.
_OPAQUE_KEYS = frozenset({"encrypted_content", "data", "signature", "result", "file_data"})
_OPAQUE_CHARS_PER_TOKEN = 4
_SKIPPED_KEYS = frozenset({"id", "call_id", "status", "type", "tool_use_id", "cache_control"})


class Counting(Protocol):
    """What compaction needs of a token counter (`proxy.tokens.counter.TokenCounter` is one)."""

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one message, its overhead included."""

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of a message list, the reply priming included."""


def native(message: Mapping[str, Any]) -> Any:
    """The API items a projected message carries (None for a message a provider made)."""
    return message.get(NATIVE)


def without_native(message: Mapping[str, Any]) -> Message:
    """The chat message as providers and the chat counting rules see it."""
    return {k: v for k, v in message.items() if k != NATIVE}


ImageOf = Callable[[Mapping[str, Any]], "Mapping[str, Any] | None"]
"""The chat `image_url` payload ({"url", "detail"}) of an API object that is an image, or None."""


def opaque_tokens(counter: TokenCounter, value: Any, image: ImageOf | None = None) -> int:
    """A safe-side estimate for an item the projection does not show: its text is encoded,
    ciphertext and base64 counted by length, ids and framing skipped; what `image` names an
    image counts by the model's image rule, as the model reads it (never its base64 as text)."""
    if isinstance(value, str):
        return counter.count_text(value)
    if isinstance(value, Mapping):
        if image is not None and (payload := image(value)) is not None:
            return image_part_tokens(payload, counter.images)
        total = 0
        for key, inner in value.items():
            if key in _SKIPPED_KEYS or inner is None:
                continue
            if key in _OPAQUE_KEYS and isinstance(inner, str):
                total += len(inner) // _OPAQUE_CHARS_PER_TOKEN
            else:
                total += opaque_tokens(counter, inner, image)
        return total
    if isinstance(value, list):
        return sum(opaque_tokens(counter, v, image) for v in value)
    if value is None or isinstance(value, bool):
        return 0
    return counter.count_text(dump(value))


class NativeCounter:
    """Counts projected messages: the projection by the chat rules, plus what only the native
    items carry (`extra`), per message, in a bounded cache keyed by the whole message."""

    def __init__(
        self,
        base: TokenCounter,
        extra: Callable[[TokenCounter, Any], int],
        cache_size: int = 50_000,
    ) -> None:
        self.base = base
        self._extra = extra
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()

    def entries(self) -> int:
        """Per-message counts held."""
        return len(self._cache)

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one projected message."""
        items = message.get(NATIVE)
        if items is None:
            return self.base.count_message(message)
        key = hash(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        value = self.base.count_message(without_native(message)) + self._extra(self.base, items)
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return value

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of a projected message list, the reply priming included."""
        return REPLY_PRIMING + sum(self.count_message(m) for m in messages)

    @property
    def encoding_name(self) -> str:
        """What a history's running counts are kept under (`BodyCache.count`)."""
        return f"native:{self.base.encoding_name}"

    def message_counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Each projected message's tokens."""
        return [self.count_message(m) for m in messages]

    def cached_counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """None: a projected history not known yet is counted (in a thread if long)."""
        del messages
        return None


@dataclass(frozen=True)
class Scaled:
    """A counter whose counts are multiplied by a model's calibration ratio (per message, rounded
    up, so a rewrite that costs less unscaled never costs more scaled)."""

    inner: Counting
    ratio: float

    def count_message(self, message: Mapping[str, Any]) -> int:
        """The inner count, scaled."""
        return math.ceil(self.inner.count_message(message) * self.ratio)

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Scaled per message, the reply priming included."""
        return REPLY_PRIMING + sum(self.count_message(m) for m in messages)


# --- cache breakpoints --------------------------------------------------------------------------

Path = tuple[int, ...]
"""Where a breakpoint sits inside a projected message's native items (item/block, part ...)."""

_TTL_SECONDS = {"5m": 300, "30m": 1800, "1h": 3600, "12h": 43200}


def ttl_seconds(value: Any, default: int) -> int:
    """A breakpoint's lifetime in seconds (its `ttl`, else the API's default)."""
    ttl = value.get("ttl") if isinstance(value, Mapping) else None
    return _TTL_SECONDS.get(ttl, default) if isinstance(ttl, str) else default


@dataclass
class Marks:
    """The client's cache breakpoints of one request, per projected message: where, and what."""

    key: str
    """The field that carries a breakpoint (`cache_control`, `prompt_cache_breakpoint`)."""
    per_message: list[list[tuple[Path, Any]]] = field(default_factory=list)

    def strip(self, part: Mapping[str, Any], path: Path, found: list[tuple[Path, Any]]) -> Any:
        """`part` without its breakpoint (a copy only when it has one), recording it."""
        if self.key not in part:
            return part
        found.append((path, part[self.key]))
        return {k: v for k, v in part.items() if k != self.key}

    def count(self) -> int:
        """Breakpoints in the request's messages."""
        return sum(len(m) for m in self.per_message)


def put_mark(container: list[Any], path: Path, key: str, value: Any) -> None:
    """Set `key` on the part at `path` inside `container` (parts on the way copied, never the
    originals, which are the client's parsed body or a stored checkpoint)."""
    index, rest = path[0], path[1:]
    part = dict(container[index])
    if rest:
        inner_key = "content" if "content" in part else "output"
        inner = list(part[inner_key])
        put_mark(inner, rest, key, value)
        part[inner_key] = inner
    else:
        part[key] = value
    container[index] = part


# --- the way back -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One message of what goes upstream, against the request's own projection."""

    message: Message
    original: int | None
    """Index of the request's projected message it is, unchanged; None: rewritten or made."""


def match_originals(sent: Sequence[Message], current: Sequence[Message]) -> list[Sent]:
    """Which sent messages are the request's own projected messages, unchanged, in order (by
    digest: a replayed checkpoint's copy of an original is the original)."""
    if not sent:
        return []
    positions: dict[str, list[int]] = {}
    for j, message in enumerate(current):
        positions.setdefault(message_digest(message), []).append(j)
    out: list[Sent] = []
    floor = 0
    for message in sent:
        found = None
        if NATIVE in message:
            # The first position at or after floor (a repeated message has many: not a scan).
            at = positions.get(message_digest(message), [])
            k = bisect.bisect_left(at, floor)
            found = at[k] if k < len(at) else None
        if found is not None:
            floor = found + 1
        out.append(Sent(message, found))
    return out


def is_unchanged(message: Mapping[str, Any], project: Callable[[Any], Message | None]) -> bool:
    """Whether a projected message is still exactly the projection of the items it carries."""
    items = message.get(NATIVE)
    if items is None:
        return False
    again = project(items)
    return again is not None and canonical_message(again) == canonical_message(
        without_native(message)
    )


def content_to_chat(content: Any, to_chat: Callable[[Any], Message | None]) -> Any:
    """An API's content (a string or parts) as chat content: the parts the projection shows."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return [c for c in (to_chat(p) for p in content) if c is not None]
    return ""


def new_texts(content: Any) -> list[str]:
    """The text a rewritten message's content holds, as the pieces a provider left."""
    if isinstance(content, str):
        return [content] if content else []
    if isinstance(content, list):
        return [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
    return []


def kept_media(content: Any) -> list[Any]:
    """The non-text parts a rewritten message's content still holds (images, files, refusals)."""
    if not isinstance(content, list):
        return []
    return [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")]


def rebuild_parts(
    parts: Sequence[Any],
    content: Any,
    to_chat: Callable[[Any], Message | None],
    text_part: Callable[[Any | None, str], Any],
) -> list[Any]:
    """An API content list rewritten as a provider rewrote its projection.

    Parts the projection does not show are kept where they were; a shown non-text part is kept
    if the rewrite kept it; the rewritten text replaces the text parts, in the first one's place
    (`text_part(original_part_or_None, text)` builds it in the API's shape).
    """
    texts = new_texts(content)
    media = kept_media(content)
    joined = "\n".join(texts)
    out: list[Any] = []
    placed = False
    for part in parts:
        chat = to_chat(part)
        if chat is None:
            out.append(part)
        elif chat.get("type") == "text":
            if not placed and texts:
                out.append(text_part(part, joined))
                placed = True
        elif chat in media:
            out.append(part)
    if not placed and texts:
        out.insert(0, text_part(None, joined))
    return out


# --- what providers must not do on these APIs -------------------------------------------------


def pending_assistant(messages: Sequence[Message]) -> int | None:
    """The assistant message whose tool calls the final tool results answer (the turn a pending
    tool result continues), if the conversation ends that way."""
    j = final_unit_start(messages)
    if j < len(messages) - 1 and messages[j].get("role") == "assistant":
        return j
    return None


def repair_result(
    original: Sequence[Message], result: CompactionResult, pending: int | None
) -> CompactionResult:
    """A provider's result with what it must not change on these APIs put back, where it can
    be: the assistant turn a pending tool result continues, rewritten one for one, goes back
    to the original (its reasoning or thinking must reach the model as issued); a one-for-one
    rewrite that lost its items gets them back. What cannot be put back (the pending turn
    folded into a stand-in) is left for `native_problems` to report."""
    alignment = align(original, result.messages, result.verbatim)
    if isinstance(alignment, str):
        return result
    messages = list(result.messages)
    for pos, ((start, end), refs) in enumerate(zip(alignment.spans, alignment.refs, strict=True)):
        if not refs or end - start != 1:
            continue
        if start == pending:
            messages[pos] = original[start]
        elif not _stands_in(messages[pos], refs, original[start]) and native(
            messages[pos]
        ) != native(original[start]):
            messages[pos] = {**messages[pos], NATIVE: original[start][NATIVE]}
    if messages == result.messages:
        return result
    return dataclasses.replace(result, messages=messages)


def _stands_in(new: Message, refs: Sequence[str], old: Message) -> bool:
    """Whether `new` carries a "dropped" marker its provider wrote for `old` (a marker quoted
    from the client's own text does not make a rewrite a stand-in)."""
    return is_written_stand_in(message_text(new), refs, message_text(old))


def native_problems(
    original: Sequence[Message], result: Sequence[Message], verbatim: Any, pending: int | None
) -> list[str]:
    """Invariants of the API adapters that the chat validator cannot see.

    The assistant turn a pending tool result continues (`pending`) stays as it is, at the same
    distance from the end (its reasoning or thinking must reach the model exactly as it was
    issued), and a message rewritten one for one keeps the items its projection does not show
    (so they are never lost in a rewrite).
    """
    problems: list[str] = []
    if pending is not None:
        tail = len(original) - pending
        if len(result) < tail or result[len(result) - tail] != original[pending]:
            problems.append(f"the assistant turn {pending} a pending tool result continues changed")
    alignment = align(original, result, verbatim)
    if isinstance(alignment, str):
        return problems  # the chat validator reports it
    for pos, ((start, end), refs) in enumerate(zip(alignment.spans, alignment.refs, strict=True)):
        if not refs or end - start != 1:
            continue
        new = result[pos]
        if _stands_in(new, refs, original[start]):
            continue
        if native(new) != native(original[start]):
            problems.append(f"result message {pos} rewrote message {start} without its items")
    return problems
