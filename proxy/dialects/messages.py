"""`POST /v1/messages` (Anthropic): the `messages` as chat messages, and back.

Each Anthropic message becomes the chat messages compaction knows:

- an assistant message is one assistant chat message: its text, its `tool_use` blocks as
  `tool_calls`; `thinking` / `redacted_thinking` (with their signatures), `server_tool_use`
  with its results, MCP blocks and anything else travel unseen and come back untouched;
- a user message is one `tool` message per `tool_result` block (answering the `tool_use` of
  the assistant message right before it) and one user message per run of other blocks (text,
  images, documents, search results), in the order the client sent them;
- a `system`-role message, a tool result answering no `tool_use` right before it, a `tool_use`
  whose result is not in the next message, and a role this adapter does not know are projected
  as `system` messages: kept verbatim, never dropped;
- the assistant message holding the last `compaction` block (the upstream's own summary, sent
  back with its signature) is kept verbatim with the tool results answering it, and everything
  before it is `superseded`: the API drops those blocks, so they are kept as they are and count
  nothing (`context_management` itself is outside `messages`, never touched).

`system` and `tools` are outside `messages`: never touched, counted as the fixed cost. The
assistant turn that a pending tool result continues (the last user message answers its
`tool_use`) is never altered, so its thinking blocks reach the model as they were issued.

On the way back, consecutive projections of one original message form that message again; a
stand-in for dropped messages is a user text message of its own (Anthropic merges consecutive
same-role turns, and a user stand-in never splits a tool call from its result nor puts text
before the thinking of an assistant turn). Cache breakpoints are handled by `Breakpoints`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.dialects.adapter import Adapter, Current, Way, emit_all, tools_tokens
from proxy.dialects.breakpoints import mark_path
from proxy.dialects.incremental import Incremental, Projected
from proxy.dialects.messages_pieces import SUPERSEDED, has_compaction, split_pieces
from proxy.dialects.projection import (
    NATIVE,
    Marks,
    Message,
    content_to_chat,
    native,
    new_texts,
    opaque_tokens,
    rebuild_parts,
)
from proxy.tokens.counter import TokenCounter
from proxy.tokens.media import file_data_tokens
from proxy.tokens.toolschema import dump

NAME = "messages"
MARK = "cache_control"
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


def _block_to_chat(block: Any) -> Message | None:
    """The chat part a content block shows, or None for a block only the API reads."""
    if not isinstance(block, Mapping):
        return None
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    if kind == "image":
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data') or ''}"
        else:
            url = str(source.get("url") or f"file:{source.get('file_id') or ''}")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "document":
        data = source.get("data") or source.get("url") or source.get("file_id") or ""
        if not isinstance(data, str):
            data = dump(data)
        name = block.get("title") if isinstance(block.get("title"), str) else ""
        return {"type": "file", "file": {"filename": name, "file_data": data}}
    return None


def _content_to_chat(content: Any) -> Any:
    return content_to_chat(content, _block_to_chat)


def _image_of(block: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """An image block's chat payload, to count it by the model's image rule wherever it is."""
    part = _block_to_chat(block) if block.get("type") == "image" else None
    return part["image_url"] if part is not None else None


def _text_block(original: Any | None, text: str) -> Any:
    if original is None:
        return {"type": "text", "text": text}
    out = {**original, "text": text}
    out.pop("citations", None)  # they cited the text that was rewritten
    return out


# --- projection ----------------------------------------------------------------------------------


def _project(nat: Mapping[str, Any]) -> Message:
    kind = nat.get("kind")
    content = nat.get("content")
    if kind == "user":
        return {"role": "user", "content": _content_to_chat(content)}
    if kind == "tool":
        block = content[0] if isinstance(content, list) and content else {}
        return {
            "role": "tool",
            "tool_call_id": block.get("tool_use_id") or "",
            "content": _content_to_chat(block.get("content", "")),
        }
    if kind == "assistant":
        return _project_assistant(content)
    return {"role": "system", "content": ""}


def _project_assistant(content: Any) -> Message:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[Message] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": orjson.dumps(block.get("input")).decode(),
                    },
                }
            )
    message: Message = {"role": "assistant"}
    if len(texts) == 1:
        message["content"] = texts[0]
    else:
        message["content"] = [{"type": "text", "text": t} for t in texts] or None
    if calls:
        message["tool_calls"] = calls
    return message


def _project_native(nat: Any) -> Message | None:
    return _project(nat) if isinstance(nat, Mapping) else None


def _strip(block: Any, marks: Marks, path: tuple[int, ...], found: list[Any]) -> Any:
    """A block without its breakpoint (and those inside a tool result's content)."""
    if not isinstance(block, Mapping):
        return block
    block = marks.strip(block, path, found)
    inner = block.get("content")
    has_marks = isinstance(inner, list) and any(
        isinstance(b, Mapping) and marks.key in b for b in inner
    )
    if block.get("type") == "tool_result" and has_marks:
        clean = [
            marks.strip(b, (*path, k), found) if isinstance(b, Mapping) else b
            for k, b in enumerate(inner)
        ]
        block = {**block, "content": clean}
    return block


def project(body: Mapping[str, Any]) -> tuple[list[Message], Marks] | None:
    """The body's messages as projected chat messages and the client's breakpoints, or None."""
    raw = body.get("messages")
    projected = project_items(raw) if isinstance(raw, list) else None
    return None if projected is None else (projected.messages, projected.marks)


def project_items(raw: Sequence[Any]) -> Projected | None:
    """Messages as projected chat messages, with where their pass may start again."""
    split = split_pieces(raw)
    if split is None:
        return None
    pieces, stops = split
    marks = Marks(MARK)
    out: list[Message] = []
    for piece in pieces:
        found: list[Any] = []
        content = piece.content
        if isinstance(content, list):
            content = [_strip(b, marks, (k,), found) for k, b in enumerate(content)]
        nat = {"kind": piece.kind, "role": piece.role, "content": content, "start": piece.start}
        message = _project(nat)
        message[NATIVE] = nat
        out.append(message)
        marks.per_message.append(found)
    compacted = [p.origin for p in pieces if p.kind == "pinned" and has_compaction(p.content)]
    reach = compacted[-1] if compacted else -1
    return Projected(out, marks, [p.origin for p in pieces], stops, reach)


def _cost(counter: TokenCounter, nat: Any) -> int:
    """What a projected message costs beyond its projection: the blocks it does not show."""
    if not isinstance(nat, Mapping):
        return 0
    content = nat.get("content")
    if nat.get("kind") == SUPERSEDED:
        return 0
    if nat.get("kind") == "pinned":
        return opaque_tokens(counter, content, _image_of)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "thinking":
            total += counter.count_text(str(block.get("thinking") or ""))
        elif kind == "tool_result":
            inner = block.get("content")
            if isinstance(inner, list):
                total += sum(
                    opaque_tokens(counter, b)
                    if _block_to_chat(b) is None
                    else _document_text(counter, b)
                    for b in inner
                )
        elif kind not in ("text", "tool_use") and _block_to_chat(block) is None:
            total += opaque_tokens(counter, block)
        else:
            total += _document_text(counter, block)
    return total


def _document_text(counter: TokenCounter, block: Any) -> int:
    """A plain-text or content document's text: its projection, a file counted by its size as
    base64 is, counts the first at a fraction of its tokens and the second not at all."""
    source = block.get("source") if isinstance(block, Mapping) else None
    if not isinstance(source, Mapping) or block.get("type") != "document":
        return 0
    data = source.get("data")
    if source.get("type") == "text" and isinstance(data, str):
        return max(0, counter.count_text(data) - file_data_tokens(data))
    if source.get("type") == "content":
        return opaque_tokens(counter, source.get("content"))
    return 0


def _rebuild(message: Message, nat: Mapping[str, Any]) -> Any:
    """The content of a projection a provider rewrote, in the Messages API's shape."""
    kind = nat.get("kind")
    content = nat.get("content")
    new = message.get("content")
    if kind == "user":
        if isinstance(content, list):
            return rebuild_parts(content, new, _block_to_chat, _text_block)
        return "\n".join(new_texts(new))
    if kind == "tool" and isinstance(content, list) and content:
        block = dict(content[0])
        inner = block.get("content")
        if isinstance(inner, list):
            block["content"] = rebuild_parts(inner, new, _block_to_chat, _text_block)
        else:
            block["content"] = "\n".join(new_texts(new))
        return [block]
    if kind == "assistant":
        if not isinstance(content, list):
            return "\n".join(new_texts(new))
        blocks = rebuild_parts(content, new, _block_to_chat, _text_block)
        calls = {c.get("id"): c for c in message.get("tool_calls") or [] if isinstance(c, dict)}
        return [_updated_use(b, calls) for b in blocks]
    return content


def _updated_use(block: Any, calls: Mapping[Any, Message]) -> Any:
    """A `tool_use` block with the input its projection's arguments now hold (if they parse)."""
    if not isinstance(block, Mapping) or block.get("type") != "tool_use":
        return block
    call = calls.get(block.get("id"))
    arguments = ((call or {}).get("function") or {}).get("arguments")
    if not isinstance(arguments, str):
        return block
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return block
    if not isinstance(value, dict) or value == block.get("input"):
        return block
    return {**block, "input": value}


def _place(items: list[Any], key: str, value: Any) -> bool:
    """Put a moved breakpoint on the last block of these that may carry one."""
    for i in range(len(items) - 1, -1, -1):
        block = items[i]
        if isinstance(block, Mapping) and block.get("type") not in _UNCACHEABLE:
            if block.get("type") == "text" and not block.get("text"):
                continue  # an empty text block may not carry a breakpoint
            mark_path(items, (i,), key, value)
            return True
    return False


def pending_turn(messages: Sequence[Message]) -> int | None:
    """The projected assistant message that the last user message's tool results continue."""
    i = len(messages) - 1
    while i >= 0 and messages[i].get("role") != "assistant":
        nat = native(messages[i])
        if not isinstance(nat, Mapping) or nat.get("role") != "user":
            return None
        if nat.get("kind") == "tool" and nat.get("start"):
            return i - 1 if i > 0 and messages[i - 1].get("role") == "assistant" else None
        if nat.get("start"):
            return None
        i -= 1
    return None


def _fixed(counter: TokenCounter, body: Mapping[str, Any]) -> int:
    """`system` and `tools`."""
    total = tools_tokens(counter, body.get("tools"), _chat_tool)
    system = body.get("system")
    if isinstance(system, list):
        texts = [b.get("text") for b in system if isinstance(b, Mapping)]
        system = "\n".join(t for t in texts if isinstance(t, str))
    if isinstance(system, str) and system:
        total += counter.count_message({"role": "system", "content": system})
    return total


def _piece_items(nat: Any) -> list[Any]:
    content = nat["content"]
    return [_text_block(None, content)] if isinstance(content, str) else list(content)


def _rebuilt_items(message: Message, nat: Any) -> list[Any]:
    content = _rebuild(message, nat)
    return [_text_block(None, content)] if isinstance(content, str) else list(content)


def _stand_in(message: Message) -> list[Any]:
    return [{"type": "text", "text": "\n".join(new_texts(message.get("content")))}]


def _emit(current: Current | None, messages: Sequence[Message], tail: int) -> list[Any]:
    """`messages` rebuilt from the projections that go upstream: each projection's blocks
    join the message of the projection before it, unless it opens a message (its original
    did, it follows a stand-in, or its role differs); a stand-in is a user message."""
    return _joined(emit_all(_WAY, current, messages, tail), [])


def _continued(
    current: Current | None, messages: Sequence[Message], tail: int, last: Message
) -> list[Any]:
    """`_emit`'s messages after `last`, the last message of those before them (a replayed
    checkpoint's), which the first of them joins: `last` with their blocks, then the rest."""
    return _joined(emit_all(_WAY, current, messages, tail), [dict(last)])


def _joined(emitted: list[tuple[Message, list[Any], bool]], out: list[Message]) -> list[Any]:
    after_stand_in = False
    for m, blocks, kept in emitted:
        nat = native(m)
        stand_in, after_stand_in = after_stand_in, nat is None
        role = _role(nat)
        # What follows a stand-in opens a message of its own: a restore then projects the
        # stand-in alone, and expands it without swallowing its neighbour.
        start = nat is None or bool(nat.get("start")) or stand_in
        # Only the client's own messages keep a string: what compactd made is blocks whether or
        # not a breakpoint moves onto it, so its bytes do not change with the client's breakpoints.
        content: Any = blocks
        if kept and nat is not None and isinstance(nat["content"], str) and MARK not in blocks[0]:
            content = blocks[0]["text"]
        if start or not out or out[-1]["role"] != role:
            out.append({"role": role, "content": content})
            continue
        last = out[-1]
        last["content"] = [*_as_blocks(last["content"]), *_as_blocks(content)]
    return out


def _role(nat: Any) -> str:
    """The role of the message a projection goes out in (a stand-in: user)."""
    return (nat.get("role") if nat is not None else None) or "user"


def _opens(before: Message, message: Message) -> bool:
    """Whether `message` opens a message of its own after `before` (see `_emit`)."""
    nat, prev = native(message), native(before)
    return nat is None or bool(nat.get("start")) or prev is None or _role(prev) != _role(nat)


def _as_blocks(content: Any) -> list[Any]:
    return [_text_block(None, content)] if isinstance(content, str) else list(content)


def _chat_tool(tool: Mapping[str, Any]) -> Message | None:
    """A client tool in the chat shape the tool-schema count knows (server tools: None)."""
    if not isinstance(tool.get("name"), str) or "input_schema" not in tool:
        return None
    fn: Message = {"name": tool["name"], "parameters": tool.get("input_schema")}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _may_start(items: Sequence[Any], c: int) -> bool:
    """Anywhere the pairing pass stops (`Projected.reach` covers compaction blocks)."""
    del items, c
    return True


_WAY = Way(project, _project_native, _piece_items, _rebuilt_items, _stand_in, MARK, 300, _place)
INCREMENTAL = Incremental(NAME, "messages", project_items, _may_start)
"""The Messages API's projection, reusing the last turn's."""
MESSAGES = Adapter(
    NAME,
    "messages",
    project,
    _cost,
    pending_turn,
    _fixed,
    _emit,
    _opens,
    INCREMENTAL,
    continued=_continued,
)
"""The Anthropic Messages API adapter (a `proxy.dialects.chat.Dialect`)."""
