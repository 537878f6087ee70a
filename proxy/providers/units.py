"""Atomic message units and the messages a compaction must never touch.

A unit is the smallest slice of a conversation that can be dropped without breaking the request:
a user message, an assistant message together with every `tool` result answering its
`tool_calls` (parallel calls included), a lone system/developer message, or an orphan. Agent runs
are often one user message followed by hundreds of tool exchanges, so units are finer than turns.

Standard library only, so third-party providers can build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.providers import canonical
from proxy.providers.base import CompressionConfig, Message
from proxy.providers.markers import ref_marker, refs_in_text

UnitKind = Literal["system", "user", "assistant", "orphan"]

INSTRUCTION_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Unit:
    """Messages `start .. end-1` of a conversation, which stand or fall together."""

    start: int
    end: int
    kind: UnitKind

    def indices(self) -> range:
        """The message indices this unit covers."""
        return range(self.start, self.end)


@dataclass(frozen=True)
class Protection:
    """Which messages a provider may rewrite and which units it may drop."""

    hard: frozenset[int]
    """System/developer messages, the last user message and the final message: never touched."""
    head: frozenset[int]
    """The first `keep_head` messages after the system prefix: the user asked to keep them."""
    recent: frozenset[int]
    """The recency window: kept verbatim unless a provider must relax it to fit at all."""

    def protected(self, index: int, *, relaxed: bool = False) -> bool:
        """Whether message `index` must stay byte-equal (recency window ignored when relaxed)."""
        return index in self.hard or index in self.head or (not relaxed and index in self.recent)


def tool_call_ids(message: Message) -> list[str]:
    """The ids of an assistant message's `tool_calls`, in order."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]


def split_units(messages: Sequence[Message]) -> list[Unit]:
    """Cut a conversation into atomic units, in order, covering every message exactly once."""
    units: list[Unit] = []
    i, n = 0, len(messages)
    while i < n:
        role = messages[i].get("role")
        if role in INSTRUCTION_ROLES:
            units.append(Unit(i, i + 1, "system"))
            i += 1
        elif role == "user":
            units.append(Unit(i, i + 1, "user"))
            i += 1
        elif role == "assistant":
            end = _answers_end(messages, i)
            units.append(Unit(i, end, "assistant"))
            i = end
        else:
            # A tool result with no matching call right before it, or a role we do not know.
            units.append(Unit(i, i + 1, "orphan"))
            i += 1
    return units


def _answers_end(messages: Sequence[Message], i: int) -> int:
    """One past the last tool (or legacy function) result that answers assistant message i."""
    ids = set(tool_call_ids(messages[i]))
    legacy = bool(messages[i].get("function_call"))
    j = i + 1
    while j < len(messages):
        m = messages[j]
        answers = ids and m.get("role") == "tool" and m.get("tool_call_id") in ids
        legacy_answer = legacy and m.get("role") == "function" and j == i + 1
        if not (answers or legacy_answer):
            break
        j += 1
    return j


def last_index(messages: Sequence[Message], role: str) -> int:
    """Index of the last message with this role, or -1."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == role:
            return i
    return -1


def hard_protected(messages: Sequence[Message]) -> frozenset[int]:
    """System/developer messages, the last user message and the final message."""
    keep = {i for i, m in enumerate(messages) if m.get("role") in INSTRUCTION_ROLES}
    last_user = last_index(messages, "user")
    if last_user >= 0:
        keep.add(last_user)
    if messages:
        keep.add(len(messages) - 1)
    return frozenset(keep)


def final_unit_start(messages: Sequence[Message]) -> int:
    """Index of the first message of the final unit: the assistant whose tool calls the final
    results answer, else the final message (0 for no messages)."""
    j = len(messages) - 1
    while j >= 0 and messages[j].get("role") == "tool":
        j -= 1
    if j >= 0 and j < len(messages) - 1 and _answers_end(messages, j) == len(messages):
        return j
    return max(len(messages) - 1, 0)


def final_tool_results(messages: Sequence[Message]) -> frozenset[int]:
    """The tool results that end the conversation (what an agent's next request is waiting on):
    the only hard-protected messages a provider may cut, head and tail, as the last resort."""
    i = len(messages)
    while i > 0 and messages[i - 1].get("role") == "tool":
        i -= 1
    return frozenset(range(i, len(messages)))


def recency_start(messages: Sequence[Message], recency_turns: int) -> int:
    """First index of the recency window: the last `recency_turns` user turns (len if none)."""
    if recency_turns <= 0:
        return len(messages)
    seen = 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            seen += 1
            if seen == recency_turns:
                return i
    # Fewer user turns than the window: everything after the system prefix is recent.
    return head_start(messages)


def head_start(messages: Sequence[Message]) -> int:
    """Index of the first message after the leading system/developer prefix."""
    i = 0
    while i < len(messages) and messages[i].get("role") in INSTRUCTION_ROLES:
        i += 1
    return i


def head_end(units: Sequence[Unit], messages: Sequence[Message], keep_head: int) -> int:
    """One past the last `keep_head` message, widened to a unit boundary so the head stays valid."""
    if keep_head <= 0:
        return head_start(messages)
    end = head_start(messages) + keep_head
    for unit in units:
        if unit.start < end < unit.end:
            return unit.end
    return min(end, len(messages))


def protection(
    messages: Sequence[Message], units: Sequence[Unit], keep_head: int, recency_turns: int
) -> Protection:
    """The hard and soft protected sets of a conversation."""
    hard = hard_protected(messages)
    head = frozenset(range(head_start(messages), head_end(units, messages, keep_head))) - hard
    recent = frozenset(range(recency_start(messages, recency_turns), len(messages))) - hard - head
    return Protection(hard=hard, head=head, recent=recent)


def after_results(messages: Sequence[Message], unit: Unit) -> bool:
    """Whether `unit` is a user message right after a tool result: Anthropic's clients send the
    two as one message (the `tool_result` blocks, then text such as Claude Code's reminders)."""
    return unit.kind == "user" and unit.start > 0 and messages[unit.start - 1].get("role") == "tool"


def drop_units(messages: Sequence[Message], units: Sequence[Unit]) -> list[Unit]:
    """The units a provider drops whole, with a user unit right after tool results joined to
    the unit before it (`after_results`): a stand-in takes both or neither, and a restore gives
    back the one message."""
    out: list[Unit] = []
    for unit in units:
        if out and after_results(messages, unit):
            out[-1] = Unit(out[-1].start, unit.end, out[-1].kind)
        else:
            out.append(unit)
    return out


def droppable(unit: Unit, prot: Protection, *, relaxed: bool = False) -> bool:
    """Whether a whole unit may be dropped: none of its messages is protected."""
    if unit.kind == "system":
        return False
    return not any(prot.protected(i, relaxed=relaxed) for i in unit.indices())


def message_text(message: Message) -> str:
    """The visible text of a message: its string content or its text parts, joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    return ""


def with_text(message: Message, text: str) -> Message:
    """A copy of `message` whose text is `text`, keeping the content type and non-text parts."""
    content = message.get("content")
    new: Message = dict(message)
    if isinstance(content, list):
        others: list[Any] = [
            p for p in content if not (isinstance(p, dict) and p.get("type") == "text")
        ]
        new["content"] = [{"type": "text", "text": text}, *others]
    else:
        new["content"] = text
    return new


def refs_in(message: Message) -> list[str]:
    """Reference ids a message carries in its text, in order of first appearance."""
    return refs_in_text(message_text(message))


def placeholder(
    run: Sequence[Message], tokens: int, note: str = "", ref: str | None = None
) -> tuple[str, Message]:
    """(ref id, the one message standing for a dropped run of whole units, with an optional note
    after its marker; `ref`: the run's ref id when the caller knows it already)."""
    ref = canonical.ref_id(run) if ref is None else ref
    # The run's first role (user or assistant): the placeholder relates to what precedes it
    # exactly as the run did, so turn order stays as valid as the client's own. Never `tool`
    # (it would need a call) nor `system` (it would read as an instruction).
    role = run[0].get("role") if run else "user"
    role = role if role in ("user", "assistant") else "user"
    marker = ref_marker(ref, len(run), tokens, "dropped")
    return ref, {"role": role, "content": f"{marker}\n{note}" if note else marker}


def placeholder_cost(config: CompressionConfig) -> int:
    """An upper bound on what one placeholder costs (for planning before the ref is known)."""
    return config.count_message({"role": "assistant", "content": ref_marker("f" * 10, 999, 10**8)})


def common_suffix(a: Sequence[Message], b: Sequence[Message]) -> int:
    """How many trailing messages two lists share unchanged."""
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[-1 - n] == b[-1 - n]:
        n += 1
    return n
