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

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.dialects.adapter import Adapter, Current, Way, emit_all, tools_tokens
from proxy.dialects.incremental import Incremental, Projected
from proxy.dialects.projection import (
    NATIVE,
    Marks,
    Message,
    opaque_tokens,
    pending_assistant,
)
from proxy.dialects.responses_items import (
    BUILT_IN,
    CALLS,
    TEXT_OUTPUTS,
    answers,
    call_id,
    content_as_chat,
    groups,
    kind_of,
    part_to_chat,
)
from proxy.dialects.responses_rebuild import place, rebuild, stand_in
from proxy.tokens.counter import TokenCounter
from proxy.tokens.media import image_part_tokens
from proxy.tokens.toolschema import dump

NAME = "responses"
MARK = "prompt_cache_breakpoint"

# --- projection ----------------------------------------------------------------------------------


def _project(group_items: list[Any], kind: str) -> Message:
    first = group_items[0]
    if kind == "message":
        return {"role": first["role"], "content": content_as_chat(first.get("content"))}
    if kind == "output":
        content: Any = ""
        if first.get("type") in TEXT_OUTPUTS:
            content = content_as_chat(first.get("output"))
        return {"role": "tool", "tool_call_id": answers(first) or "", "content": content}
    if kind == "model":
        return _project_model(group_items)
    return {"role": "system", "content": ""}


def _project_model(items: list[Any]) -> Message:
    texts: list[Any] = []
    calls: list[Message] = []
    for item in items:
        kind = item.get("type")
        if kind_of(item) == "model" and item.get("role") == "assistant":
            content = item.get("content")
            chat = content_as_chat(content)
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
        elif kind in CALLS:
            arguments = {
                k: v for k, v in item.items() if k not in ("id", "call_id", "type", "status")
            }
            calls.append(
                {
                    "id": call_id(item),
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
    projected = project_items(raw) if isinstance(raw, list) else None
    return None if projected is None else (projected.messages, projected.marks)


def project_items(raw: Sequence[Any]) -> Projected | None:
    """Input items as projected chat messages, with where their pass may start again."""
    if not all(isinstance(i, dict) for i in raw):
        return None
    marks = Marks(MARK)
    messages: list[Message] = []
    units, stops = groups(raw)
    for group in units:
        found: list[Any] = []
        marks.per_message.append(found)
        items = [_strip_marks(it, marks, k, found) for k, it in enumerate(group.items)]
        messages.append(
            {**_project(items, group.kind), NATIVE: {"kind": group.kind, "items": items}}
        )
    return Projected(messages, marks, [g.start for g in units], stops)


def _may_start(items: Sequence[Any], c: int) -> bool:
    """Not right after a reference to a stored reasoning item: the run it belongs to is
    pinned for it (`_pin_after_reasoning_references`), which a pass from `c` would not see."""
    last = items[c - 1] if c > 0 else None
    return not (
        isinstance(last, Mapping)
        and last.get("type") == "item_reference"
        and str(last.get("id")).startswith("rs_")
    )


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
        if kind == "reasoning" or kind in BUILT_IN:
            total += _unseen_tokens(counter, item)
        elif nat.get("kind") == "output" and kind not in TEXT_OUTPUTS:
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
    image = part_to_chat({**part, "type": "input_image"})
    return image["image_url"] if image is not None else None


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


def _emit(current: Current | None, messages: Sequence[Message], tail: int) -> list[Any]:
    """`input` rebuilt: originals as they were, rewrites in the API's shape, the client's
    breakpoints where they were (see `Breakpoints`)."""
    return [item for _, items, _ in emit_all(_WAY, current, messages, tail) for item in items]


def _opens(before: Message, message: Message) -> bool:
    """Always: every message goes out as items of its own."""
    del before, message
    return True


def _chat_tool(tool: Mapping[str, Any]) -> Message | None:
    """A Responses function tool in the chat shape the tool-schema count knows."""
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        return None
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


INCREMENTAL = Incremental(NAME, "input", project_items, _may_start)
"""The Responses API's projection, reusing the last turn's."""
_WAY = Way(project, _project_native, _native_items, rebuild, stand_in, MARK, 1800, place)
RESPONSES = Adapter(
    NAME,
    "input",
    project,
    _cost,
    pending_assistant,
    _fixed,
    _emit,
    _opens,
    INCREMENTAL,
    _history,
)
"""The Responses API adapter (a `proxy.dialects.chat.Dialect`)."""
