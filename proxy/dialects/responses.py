"""`POST /v1/responses`: the `input` items as chat messages, and back.

Items are grouped into the units compaction knows:

- a message (`user`, `system`, `developer`; type `message` or an easy message) is one chat
  message, its `input_text` / `input_image` / `input_file` parts as chat parts;
- a run of model-side items (`reasoning`, assistant messages, function / custom / shell / patch /
  computer calls, built-in calls with their results such as `web_search_call`) is one assistant
  message: its text, its calls as `tool_calls`, the rest carried unseen. A reasoning item thus
  always travels with the item it precedes, and a unit is reasoning + call + the call's output;
- each output (`function_call_output` …) answering that run is one `tool` message.

Everything compaction must never touch or cannot pair is projected as a `system` message (the
chat rules keep those verbatim and never drop them): `compaction` items (the upstream's encrypted
summaries, resent verbatim), Codex's `compaction_trigger` (the final input item, asking the
upstream for one compaction item: it stays last, exactly once), item references (and the run
right after a reference to a reasoning item), configuration updates, types this adapter does not
know, an output whose call is not right before it, a call whose output is not right after it.
`instructions`, `tools` and `context_management` are outside the input and never touched; the
first two are counted as the request's fixed cost.

A request that continues server-side history (`previous_response_id`, `conversation`) is
forwarded as it is: only the part of the history it carries is visible, so it is counted, never
compacted (`x-compactd-action: server-history`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.dialects.adapter import Adapter, Way, emit_all, tools_tokens
from proxy.dialects.breakpoints import mark_path
from proxy.dialects.projection import (
    NATIVE,
    Marks,
    Message,
    content_to_chat,
    new_texts,
    opaque_tokens,
    pending_assistant,
    rebuild_parts,
)
from proxy.tokens.counter import TokenCounter
from proxy.tokens.media import image_part_tokens
from proxy.tokens.toolschema import dump

NAME = "responses"
MARK = "prompt_cache_breakpoint"

_CALLS = frozenset(
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
_BUILT_IN = frozenset(
    {
        "file_search_call",
        "web_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
    }
)
_MODEL_SIDE = _CALLS | _BUILT_IN | {"reasoning"}
_OUTPUTS = frozenset(
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
_TEXT_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
    }
)
_MESSAGE_ROLES = frozenset({"user", "system", "developer"})


def _kind(item: Any) -> str:
    """message | model | output | pinned (never touched, never dropped)."""
    kind = item.get("type")
    role = item.get("role")
    if kind in ("message", None) and isinstance(role, str):
        if role == "assistant":
            return "model"
        return "message" if role in _MESSAGE_ROLES else "pinned"
    if kind in _MODEL_SIDE:
        return "model"
    if kind in _OUTPUTS:
        return "output"
    return "pinned"


def _call_id(item: Mapping[str, Any]) -> str:
    """The id a call's output answers it by (an MCP approval request has only its `id`)."""
    value = item.get("id") if item.get("type") == "mcp_approval_request" else item.get("call_id")
    return value if isinstance(value, str) else ""


def _call_ids(item: Mapping[str, Any]) -> set[str]:
    """Every id an output may answer this call by (a local shell output names the call's id)."""
    ids = {_call_id(item)}
    if item.get("type") == "local_shell_call" and isinstance(item.get("id"), str):
        ids.add(item["id"])
    return ids - {""}


def _answers(item: Mapping[str, Any]) -> str | None:
    for key in ("call_id", "approval_request_id", "id"):
        value = item.get(key)
        if isinstance(value, str):
            return value
    return None


@dataclass
class _Group:
    kind: str
    items: list[Any] = field(default_factory=list)


def _groups(items: Sequence[Any]) -> list[_Group]:
    groups: list[_Group] = []
    for item in items:
        kind = _kind(item)
        if kind == "model" and groups and groups[-1].kind == "model":
            groups[-1].items.append(item)
        else:
            groups.append(_Group(kind, [item]))
    _pin_after_reasoning_references(groups)
    _pin_unpaired(groups)
    return groups


def _pin_after_reasoning_references(groups: list[_Group]) -> None:
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


def _pin_unpaired(groups: list[_Group]) -> None:
    """A call whose output is not right after its run, or an output answering no call right
    before it, cannot be dropped or kept apart safely: both stay as they are."""
    i = 0
    while i < len(groups):
        group = groups[i]
        if group.kind == "output":
            group.kind = "pinned"  # not right after the run it answers
            i += 1
            continue
        if group.kind != "model":
            i += 1
            continue
        calls = set().union(*(_call_ids(it) for it in group.items if it.get("type") in _CALLS))
        j = i + 1
        answered: set[str] = set()
        while j < len(groups) and groups[j].kind == "output":
            answer = _answers(groups[j].items[0])
            if answer not in calls:
                break
            answered.add(answer)
            j += 1
        unanswered = [
            it for it in group.items if it.get("type") in _CALLS and not _call_ids(it) & answered
        ]
        if unanswered and j < len(groups):
            for g in groups[i:j]:
                g.kind = "pinned"
        i = j


# --- parts ---------------------------------------------------------------------------------------


def _part_to_chat(part: Any) -> Message | None:
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


def _content_to_chat(content: Any) -> Any:
    return content_to_chat(content, _part_to_chat)


def _text_part(kind: str) -> Any:
    def make(original: Any | None, text: str) -> Any:
        if original is None:
            return {"type": kind, "text": text}
        out = {**original, "text": text}
        if "annotations" in out:
            out["annotations"] = []  # they pointed into the text that was rewritten
        out.pop("logprobs", None)
        return out

    return make


# --- projection ----------------------------------------------------------------------------------


def _project(group_items: list[Any], kind: str) -> Message:
    first = group_items[0]
    if kind == "message":
        return {"role": first["role"], "content": _content_to_chat(first.get("content"))}
    if kind == "output":
        content: Any = ""
        if first.get("type") in _TEXT_OUTPUTS:
            content = _content_to_chat(first.get("output"))
        return {"role": "tool", "tool_call_id": _answers(first) or "", "content": content}
    if kind == "model":
        return _project_model(group_items)
    return {"role": "system", "content": ""}


def _project_model(items: list[Any]) -> Message:
    texts: list[Any] = []
    calls: list[Message] = []
    for item in items:
        kind = item.get("type")
        if _kind(item) == "model" and item.get("role") == "assistant":
            content = item.get("content")
            chat = _content_to_chat(content)
            texts.extend([{"type": "text", "text": chat}] if isinstance(chat, str) else chat)
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
        elif kind == "custom_tool_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "custom",
                    "custom": {"name": item.get("name"), "input": item.get("input")},
                }
            )
        elif kind in _CALLS:
            arguments = {
                k: v for k, v in item.items() if k not in ("id", "call_id", "type", "status")
            }
            calls.append(
                {
                    "id": _call_id(item),
                    "type": "function",
                    "function": {"name": kind, "arguments": dump(arguments)},
                }
            )
    message: Message = {"role": "assistant"}
    if len(texts) == 1 and texts[0].get("type") == "text":
        message["content"] = texts[0]["text"]
    else:
        message["content"] = texts or None
    if calls:
        message["tool_calls"] = calls
    return message


def _project_native(nat: Any) -> Message | None:
    items = nat.get("items") if isinstance(nat, Mapping) else None
    if not isinstance(items, list) or not items:
        return None
    kind = nat.get("kind")
    return _project(items, kind if isinstance(kind, str) else "pinned")


def _strip_marks(item: Any, marks: Marks, index: int, found: list[Any]) -> Any:
    """An item without the breakpoints of its content parts (or its output's parts)."""
    if not isinstance(item, Mapping):
        return item
    for key in ("content", "output"):
        parts = item.get(key)
        if isinstance(parts, list) and any(
            isinstance(p, Mapping) and marks.key in p for p in parts
        ):
            clean = [
                marks.strip(p, (index, k), found) if isinstance(p, Mapping) else p
                for k, p in enumerate(parts)
            ]
            item = {**item, key: clean}
    return item


def project(body: Mapping[str, Any]) -> tuple[list[Message], Marks] | None:
    """The body's input as projected chat messages and the client's breakpoints, or None."""
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not all(isinstance(i, dict) for i in raw):
        return None
    marks = Marks(MARK)
    messages: list[Message] = []
    for group in _groups(raw):
        found: list[Any] = []
        marks.per_message.append(found)
        items = [_strip_marks(it, marks, k, found) for k, it in enumerate(group.items)]
        messages.append(
            {**_project(items, group.kind), NATIVE: {"kind": group.kind, "items": items}}
        )
    return messages, marks


def _cost(counter: TokenCounter, nat: Any) -> int:
    """What a projected message costs beyond its projection: the items it does not show."""
    if not isinstance(nat, Mapping):
        return 0
    items: list[Any] = nat.get("items") or []
    if nat.get("kind") == "pinned":
        # Nothing of it is shown: every item as the model reads it, its images as images.
        return sum(_unseen_tokens(counter, it) for it in items)
    total = 0
    for item in items:
        kind = item.get("type")
        if kind == "reasoning" or kind in _BUILT_IN:
            total += _unseen_tokens(counter, item)
        elif nat.get("kind") == "output" and kind not in _TEXT_OUTPUTS:
            total += opaque_tokens(counter, item.get("output"), _image_of)
    return total


def _unseen_tokens(counter: TokenCounter, item: Any) -> int:
    """An item the projection does not show. Sent back (for an edit), a generated image is the
    model's input as any image is (its format is read from its bytes, whatever the URL says)."""
    if (
        isinstance(item, Mapping)
        and item.get("type") == "image_generation_call"
        and isinstance(item.get("result"), str)
    ):
        image = {"url": f"data:image/png;base64,{item['result']}"}
        rest = {k: v for k, v in item.items() if k != "result"}
        return image_part_tokens(image, counter.images) + opaque_tokens(counter, rest)
    return opaque_tokens(counter, item, _image_of)


def _image_of(part: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """An `input_image` part's or a computer-use screenshot's chat payload: the model's image
    rule counts it, as the model sees it (never its base64 as text)."""
    if part.get("type") not in ("input_image", "computer_screenshot"):
        return None
    image = _part_to_chat({**part, "type": "input_image"})
    return image["image_url"] if image is not None else None


def _rebuild(message: Message, nat: Mapping[str, Any]) -> list[Any]:
    """The items of a projected message a provider rewrote, in the API's own shape."""
    items: list[Any] = nat["items"]
    kind = nat.get("kind")
    content = message.get("content")
    if kind == "message":
        item = dict(items[0])
        if isinstance(item.get("content"), list):
            item["content"] = rebuild_parts(
                item["content"], content, _part_to_chat, _text_part("input_text")
            )
        else:
            item["content"] = "\n".join(t for t in new_texts(content))
        return [item]
    if kind == "output":
        item = dict(items[0])
        if item.get("type") in _TEXT_OUTPUTS:
            if isinstance(item.get("output"), list):
                item["output"] = rebuild_parts(
                    item["output"], content, _part_to_chat, _text_part("input_text")
                )
            else:
                item["output"] = "\n".join(new_texts(content))
        return [item]
    if kind == "model":
        return _rebuild_model(message, items)
    return list(items)


def _rebuild_model(message: Message, items: list[Any]) -> list[Any]:
    """A model-side run: its text where its first assistant message was, calls updated where a
    provider changed their arguments, everything else (reasoning above all) as it was. An
    assistant message that goes (its text now lives in the first) takes the reasoning right
    before it along: the API refuses a reasoning item not followed by the item it belongs to."""
    content = message.get("content")
    text = "\n".join(new_texts(content))
    calls = {c.get("id"): c for c in message.get("tool_calls") or [] if isinstance(c, dict)}
    out: list[Any] = []
    placed = False
    for item in items:
        if item.get("role") != "assistant":
            out.append(_updated_call(item, calls))
            continue
        kept = None
        if not placed:
            placed = True
            parts = item.get("content")
            if isinstance(parts, list):
                rebuilt = rebuild_parts(parts, content, _part_to_chat, _text_part("output_text"))
                kept = {**item, "content": rebuilt} if rebuilt else None
            elif text:
                kept = {**item, "content": text}
        if kept is not None:
            out.append(kept)
            continue
        while out and out[-1].get("type") == "reasoning":
            out.pop()
    if not placed and text:
        out.insert(_first_visible(out), {"role": "assistant", "content": text})
    return out


def _updated_call(item: Any, calls: Mapping[Any, Message]) -> Any:
    """A call item with the arguments (or custom input) its projection now has."""
    call = calls.get(item.get("call_id"))
    if call is None:
        return item
    if item.get("type") == "function_call":
        arguments = (call.get("function") or {}).get("arguments")
        if arguments != item.get("arguments"):
            return {**item, "arguments": arguments}
    elif item.get("type") == "custom_tool_call":
        value = (call.get("custom") or {}).get("input")
        if value != item.get("input"):
            return {**item, "input": value}
    return item


def _first_visible(items: list[Any]) -> int:
    """Where new assistant text goes in a run that had none: after its leading reasoning."""
    i = 0
    while i < len(items) and items[i].get("type") == "reasoning":
        i += 1
    return i


def _stand_in(message: Message) -> list[Any]:
    """A stand-in for dropped units: a user message of its own. Never merged into a model run
    (a restore projects it alone again), never between a reasoning item and what follows it.
    Its text is an input part whether or not a breakpoint moves onto it, so its bytes do not
    change from turn to turn with the client's breakpoints."""
    text = "\n".join(new_texts(message.get("content")))
    return [{"role": "user", "content": [{"type": "input_text", "text": text}]}]


def _native_items(nat: Any) -> list[Any]:
    return list(nat["items"])


def _history(body: Mapping[str, Any]) -> bool:
    """Whether the conversation continues server-side history the request does not carry."""
    return bool(body.get("previous_response_id")) or bool(body.get("conversation"))


def _fixed(counter: TokenCounter, body: Mapping[str, Any]) -> int:
    """`instructions`, `tools` and a `text.format` JSON schema."""
    total = tools_tokens(counter, body.get("tools"), _chat_tool)
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        total += counter.count_message({"role": "system", "content": instructions})
    elif instructions:
        total += counter.count_text(dump(instructions))
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        total += counter.count_text(dump(fmt.get("schema")))
    return total


def _emit(body: Mapping[str, Any], messages: Sequence[Message]) -> list[Any]:
    """`input` rebuilt: originals as they were, rewrites in the API's shape, the client's
    breakpoints where they were (see `Breakpoints`)."""
    return [item for _, items, _ in emit_all(_WAY, body, messages) for item in items]


_INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})


def _place(items: list[Any], key: str, value: Any) -> bool:
    """Put a moved breakpoint on the last input part of these items (a user stand-in's text
    becomes one); False where no part may carry one (model output)."""
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        for field_name in ("content", "output"):
            parts = item.get(field_name)
            if isinstance(parts, list):
                for k in range(len(parts) - 1, -1, -1):
                    part = parts[k]
                    if isinstance(part, Mapping) and part.get("type") in _INPUT_PARTS:
                        mark_path(items, (i, k), key, value)
                        return True
    return False


def _chat_tool(tool: Mapping[str, Any]) -> Message | None:
    """A Responses function tool in the chat shape the tool-schema count knows."""
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        return None
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


_WAY = Way(project, _project_native, _native_items, _rebuild, _stand_in, MARK, 1800, _place)
RESPONSES = Adapter(NAME, "input", project, _cost, pending_assistant, _fixed, _emit, _history)
"""The Responses API adapter (a `proxy.dialects.chat.Dialect`)."""
