"""The Responses API's input items: their kinds, and how they form the units compaction knows.

See `proxy.dialects.responses` for the units; this module says which item is which (a message,
a model-side item, an output answering a call, something pinned), which call an output answers,
groups the items into units and pins what cannot be paired, and shows an item's content parts
as chat parts.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.dialects.projection import Message, content_to_chat

CALLS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_approval_request",
        "tool_search_call",
        "program",
    }
)
BUILT_IN = frozenset(
    {
        "file_search_call",
        "web_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
    }
)
MODEL_SIDE = CALLS | BUILT_IN | {"reasoning"}
OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "computer_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "mcp_approval_response",
        "tool_search_output",
        "program_output",
    }
)
# Outputs whose `output` is text (or input parts) a provider may shorten; others stay whole.
TEXT_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    }
)
_MESSAGE_ROLES = frozenset({"user", "system", "developer"})


def kind_of(item: Any) -> str:
    """message | model | output | pinned (never touched, never dropped)."""
    kind = item.get("type")
    role = item.get("role")
    if kind in ("message", None) and isinstance(role, str):
        if role == "assistant":
            return "model"
        return "message" if role in _MESSAGE_ROLES else "pinned"
    if kind in MODEL_SIDE:
        return "model"
    if kind in OUTPUTS:
        return "output"
    return "pinned"


def call_id(item: Mapping[str, Any]) -> str:
    """The id a call's output answers it by (an MCP approval request has only its `id`)."""
    value = item.get("id") if item.get("type") == "mcp_approval_request" else item.get("call_id")
    return value if isinstance(value, str) else ""


def call_ids(item: Mapping[str, Any]) -> set[str]:
    """Every id an output may answer this call by (a local shell output names the call's id)."""
    ids = {call_id(item)}
    if item.get("type") == "local_shell_call" and isinstance(item.get("id"), str):
        ids.add(item["id"])
    return ids - {""}


def answers(item: Mapping[str, Any]) -> str | None:
    """The id of the call an output answers, if it names one."""
    for key in ("call_id", "approval_request_id", "id"):
        value = item.get(key)
        if isinstance(value, str):
            return value
    return None


@dataclass
class Group:
    """One unit: its kind (see `kind_of`) and its items."""

    kind: str
    start: int
    """The index of its first item."""
    items: list[Any] = field(default_factory=list)


def groups(items: Sequence[Any]) -> tuple[list[Group], list[int]]:
    """The units, and where the pairing pass may start again (see `_pin_unpaired`)."""
    groups: list[Group] = []
    for i, item in enumerate(items):
        kind = kind_of(item)
        if kind == "model" and groups and groups[-1].kind == "model":
            groups[-1].items.append(item)
        else:
            groups.append(Group(kind, i, [item]))
    _pin_after_reasoning_references(groups)
    return groups, _pin_unpaired(groups)


def _pin_after_reasoning_references(groups: list[Group]) -> None:
    """A reference to a stored reasoning item (`rs_...`) is pinned, so the run right after it,
    the item that reasoning belongs to, is too: the API refuses reasoning not followed by it."""
    for before, group in itertools.pairwise(groups):
        last = before.items[-1]
        if (
            group.kind == "model"
            and last.get("type") == "item_reference"
            and str(last.get("id")).startswith("rs_")
        ):
            group.kind = "pinned"


def _pin_unpaired(groups: list[Group]) -> list[int]:
    """A call whose output is not right after its run, or an output answering no call right
    before it, cannot be dropped or kept apart safely: both stay as they are.

    Returns every group the pass stops at: what it decided before one depends on no group
    after it, and from one it goes on as a pass over the groups from there would
    (`proxy.dialects.incremental`)."""
    stops: list[int] = []
    i = 0
    while i < len(groups):
        stops.append(i)
        group = groups[i]
        if group.kind == "output":
            group.kind = "pinned"  # not right after the run it answers
            i += 1
            continue
        if group.kind != "model":
            i += 1
            continue
        calls = set().union(*(call_ids(it) for it in group.items if it.get("type") in CALLS))
        j = i + 1
        answered: set[str] = set()
        while j < len(groups) and groups[j].kind == "output":
            answer = answers(groups[j].items[0])
            if answer not in calls:
                break
            answered.add(answer)
            j += 1
        unanswered = [
            it for it in group.items if it.get("type") in CALLS and not call_ids(it) & answered
        ]
        if unanswered and j < len(groups):
            for g in groups[i:j]:
                g.kind = "pinned"
        i = j
    return stops


def part_to_chat(part: Any) -> Message | None:
    """The chat part a content part shows, or None for one only the API reads."""
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url") or f"file:{part.get('file_id') or ''}"
        image: Message = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        data = part.get("file_data") or part.get("file_url") or part.get("file_id") or ""
        return {"type": "file", "file": {"filename": part.get("filename") or "", "file_data": data}}
    return None


def content_as_chat(content: Any) -> Any:
    """Content (a string or parts) as chat content: the parts the projection shows."""
    return content_to_chat(content, part_to_chat)
