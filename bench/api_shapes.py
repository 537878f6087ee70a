"""Chat sessions in the Responses and Messages shapes, as Codex CLI and Claude Code send them.

Responses: a developer message, user messages with input_text parts, every assistant turn as a
reasoning item (issued by the fake upstream, so its encrypted content is genuine) + an
assistant message + function calls, results as function_call_output. Messages: `system` with a
breakpoint, user messages as text blocks, every assistant turn as a signed thinking block + text
+ tool_use blocks, consecutive results as one user message of tool_result blocks, and the
client's sliding breakpoint on the last block of the last message, thinking enabled. Each
message is converted once per session, so a turn's history is the previous turn's plus new
items, as a client keeps it (bench/session_apis.py, bench/quality_apis.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.session import Session
from proxy.providers.units import message_text
from tests.api_fakes import FakeMessages, FakeResponses

Json = dict[str, Any]
MODEL = {"chat": "gpt-4o", "responses": "gpt-4o", "messages": "claude-sonnet-5"}
MARK = {"type": "ephemeral"}
FIELD = {"chat": "messages", "responses": "input", "messages": "messages"}


@dataclass
class Convert:
    """One session's messages in one API's shape; each message converted once, so a turn's
    history is the previous turn's plus new items, as a client keeps it."""

    api: str
    responses: FakeResponses
    messages: FakeMessages
    done: dict[int, list[Json]] = field(default_factory=dict)

    def history(self, chat: list[Json]) -> list[Json]:
        """The request history for these chat messages."""
        if self.api == "chat":
            return list(chat)
        out: list[Json] = []
        for i, m in enumerate(chat):
            if i not in self.done:
                self.done[i] = self._one(i, m)
            out.extend(self.done[i])
        if self.api == "messages":
            out = _merge_results(out)
        return out

    def _one(self, i: int, m: Json) -> list[Json]:
        role, text = m["role"], message_text(m)
        calls = m.get("tool_calls") or []
        if self.api == "responses":
            if role in ("system", "developer"):
                return [{"type": "message", "role": "developer", "content": [_part(text)]}]
            if role == "user":
                return [{"role": "user", "content": [_part(text)]}]
            if role == "tool":
                return [
                    {"type": "function_call_output", "call_id": m["tool_call_id"], "output": text}
                ]
            self.responses.counter += 1
            items: list[Json] = [self.responses.reasoning(f"turn {i}")]
            if text:
                items.append(self.responses.message(text) | {"id": f"msg_{i}"})
            items += [
                {
                    "type": "function_call",
                    "id": f"fc_{i}_{k}",
                    "call_id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                    "status": "completed",
                }
                for k, c in enumerate(calls)
            ]
            return items
        if role in ("system", "developer"):
            return []  # the body's `system`
        if role == "user":  # blocks, as Claude Code sends them (a breakpoint changes no shape)
            return [{"role": "user", "content": [{"type": "text", "text": text}]}]
        if role == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": text}
            return [{"role": "user", "content": [result]}]
        blocks: list[Json] = [self.messages.thinking(f"turn {i}")]
        if text:
            blocks.append({"type": "text", "text": text})
        blocks += [
            {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": _args(c)}
            for c in calls
        ]
        return [{"role": "assistant", "content": blocks}]

    def body(self, session: Session, chat: list[Json]) -> Json:
        """The request body of one turn."""
        model = MODEL[self.api]
        history = self.history(chat)
        tools = session.tools or []
        if self.api == "chat":
            return {"model": model, "messages": history, **({"tools": tools} if tools else {})}
        fns = [t["function"] for t in tools]
        if self.api == "responses":
            out: Json = {"model": model, "input": history, "store": False}
            if fns:
                out["tools"] = [{"type": "function", **f} for f in fns]
            return out
        system = "\n".join(message_text(m) for m in chat if m["role"] in ("system", "developer"))
        out = {
            "model": model,
            "max_tokens": 4096,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": _with_breakpoint(history),
        }
        if system:
            out["system"] = [{"type": "text", "text": system, "cache_control": MARK}]
        if fns:
            out["tools"] = [
                {
                    "name": f["name"],
                    "description": f.get("description", ""),
                    "input_schema": f["parameters"],
                }
                for f in fns
            ]
        return out


def _part(text: str) -> Json:
    return {"type": "input_text", "text": text}


def _args(call: Json) -> Json:
    try:
        value = orjson.loads(call["function"]["arguments"] or "{}")
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"arguments": call["function"]["arguments"]}


def _is_results(message: Json) -> bool:
    content = message["content"]
    return (
        message["role"] == "user"
        and isinstance(content, list)
        and bool(content)
        and (content[0].get("type") == "tool_result")
    )


def _merge_results(messages: list[Json]) -> list[Json]:
    """Consecutive tool results are one user message, as an agent sends them."""
    out: list[Json] = []
    for m in messages:
        if out and _is_results(m) and _is_results(out[-1]):
            out[-1] = {"role": "user", "content": [*out[-1]["content"], *m["content"]]}
        else:
            out.append(m)
    return out


def _with_breakpoint(messages: list[Json]) -> list[Json]:
    """Claude Code's sliding breakpoint: the last block of the last message."""
    if not messages:
        return messages
    last = dict(messages[-1])
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": MARK}
    last["content"] = blocks
    return [*messages[:-1], last]
