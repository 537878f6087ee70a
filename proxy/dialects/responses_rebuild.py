"""A Responses projection a provider rewrote, back in the API's own items.

A rewritten message keeps every item its projection does not show (reasoning and its encrypted
content above all) exactly as it was; a stand-in for dropped units is a user message of its own;
a breakpoint that moves goes on the last input part of the items it lands on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.dialects.breakpoints import mark_path
from proxy.dialects.projection import Message, new_texts, rebuild_parts
from proxy.dialects.responses_items import TEXT_OUTPUTS, part_to_chat


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


def rebuild(message: Message, nat: Mapping[str, Any]) -> list[Any]:
    """The items of a projected message a provider rewrote, in the API's own shape."""
    items: list[Any] = nat["items"]
    kind = nat.get("kind")
    content = message.get("content")
    if kind == "message":
        item = dict(items[0])
        if isinstance(item.get("content"), list):
            item["content"] = rebuild_parts(
                item["content"], content, part_to_chat, _text_part("input_text")
            )
        else:
            item["content"] = "\n".join(t for t in new_texts(content))
        return [item]
    if kind == "output":
        item = dict(items[0])
        if item.get("type") in TEXT_OUTPUTS:
            if isinstance(item.get("output"), list):
                item["output"] = rebuild_parts(
                    item["output"], content, part_to_chat, _text_part("input_text")
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
                rebuilt = rebuild_parts(parts, content, part_to_chat, _text_part("output_text"))
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


def stand_in(message: Message) -> list[Any]:
    """A stand-in for dropped units: a user message of its own. Never merged into a model run
    (a restore projects it alone again), never between a reasoning item and what follows it.
    Its text is an input part whether or not a breakpoint moves onto it, so its bytes do not
    change from turn to turn with the client's breakpoints."""
    text = "\n".join(new_texts(message.get("content")))
    return [{"role": "user", "content": [{"type": "input_text", "text": text}]}]


_INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})


def place(items: list[Any], key: str, value: Any) -> bool:
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
