"""Request bodies as the real SDKs serialize them, for an agent session with N tools.

openai-python and anthropic are driven for real (their own serialization, captured by an
httpx MockTransport before anything is sent). openai-node is not a Python package: its bytes
are `JSON.stringify(params)` in the caller's key order, compact since v5 and indented by two
spaces in v4 (`JSON.stringify(body, null, 2)`, core.js); `json.dumps` with those settings gives
the same bytes (checked against openai 4.104 and 7.60 under node 22, tool schemas with
non-ASCII, quotes and U+2028 included). Codex sends Responses bodies from Rust (serde_json,
compact, its struct's field order: model, instructions, input, tools, tool_choice,
parallel_tool_calls, reasoning, store, stream, include, prompt_cache_key).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai

Message = dict[str, Any]
SHAPES = ("openai-python", "openai-node", "openai-node-v4", "anthropic", "codex-responses")
TOOL_COUNTS = (0, 14, 128)


def tool_schema(i: int) -> dict[str, Any]:
    """One function tool as an agent declares it (a few typed parameters, an enum)."""
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Run step {i} of the workflow on a path; returns its output [raw].",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "A file path, e.g. src/[id].ts"},
                    "mode": {"type": "string", "enum": ["read", "write", "list"]},
                    "lines": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["path"],
            },
        },
    }


def _anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}


def _responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {"type": "function", "name": fn["name"], "description": fn["description"],
            "strict": False, "parameters": fn["parameters"]}  # fmt: skip


def _captured(send: Callable[[Any], Any], http_module: Any = httpx) -> bytes:
    """The body an SDK sent, given a client (of the httpx it is built on: anthropic's is
    `httpx2`) whose transport answers every request."""
    seen: list[bytes] = []

    def handle(request: Any) -> Any:
        seen.append(request.content)
        return http_module.Response(200, json={})

    client = http_module.Client(transport=http_module.MockTransport(handle))
    # The reply is not a completion: the SDK raises once the body was sent.
    with client as http, contextlib.suppress(Exception):
        send(http)
    return seen[0]


def openai_python(messages: list[Message], tools: list[dict[str, Any]]) -> bytes:
    """The body `openai.OpenAI().chat.completions.create` sends."""

    def send(http: Any) -> Any:
        client = openai.OpenAI(api_key="sk-shape", base_url="http://sdk/v1", http_client=http)
        extra = {"tools": tools, "tool_choice": "auto"} if tools else {}
        return client.chat.completions.create(
            model="gpt-4.1",
            messages=messages,
            temperature=0.2,
            **extra,  # type: ignore[arg-type]
        )

    return _captured(send)


def anthropic_python(messages: list[Message], tools: list[dict[str, Any]]) -> bytes:
    """The body `anthropic.Anthropic().messages.create` sends (system apart, as it takes it)."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    turns = messages[1:] if system is not None else messages

    def send(http: Any) -> Any:
        client = anthropic.Anthropic(api_key="sk-shape", base_url="http://sdk", http_client=http)
        extra: dict[str, Any] = {"system": system} if system is not None else {}
        if tools:
            extra["tools"] = [_anthropic_tool(t) for t in tools]
        return client.messages.create(
            model="claude-sonnet-4-5", max_tokens=4096, messages=turns, **extra
        )

    return _captured(send, httpx2)


def openai_node(messages: list[Message], tools: list[dict[str, Any]], *, v4: bool = False) -> bytes:
    """The body openai-node sends for `{model, messages, tools, tool_choice}`."""
    body: dict[str, Any] = {"model": "gpt-4.1", "messages": messages}
    if tools:
        body |= {"tools": tools, "tool_choice": "auto"}
    if v4:
        return json.dumps(body, indent=2, ensure_ascii=False).encode()
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def codex_responses(messages: list[Message], tools: list[dict[str, Any]]) -> bytes:
    """The body Codex CLI sends to /v1/responses (instructions apart, the turns as input)."""
    instructions = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    items = [
        {"type": "message", "role": m["role"],
         "content": [{"type": "input_text" if m["role"] == "user" else "output_text",
                      "text": m["content"]}]}
        for m in messages if m["role"] != "system"
    ]  # fmt: skip
    body = {
        "model": "gpt-5-codex",
        "instructions": instructions,
        "input": items,
        "tools": [_responses_tool(t) for t in tools],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def body(shape: str, messages: list[Message], tools: int) -> bytes:
    """The bytes `shape` sends for `messages` with `tools` tool schemas."""
    schemas = [tool_schema(i) for i in range(tools)]
    if shape == "openai-python":
        return openai_python(messages, schemas)
    if shape == "anthropic":
        return anthropic_python(messages, schemas)
    if shape in ("openai-node", "openai-node-v4"):
        return openai_node(messages, schemas, v4=shape.endswith("v4"))
    if shape == "codex-responses":
        return codex_responses(messages, schemas)
    raise ValueError(f"unknown body shape {shape!r}")


def path(shape: str) -> str:
    """The API path the shape's SDK posts to."""
    return {"anthropic": "/v1/messages", "codex-responses": "/v1/responses"}.get(
        shape, "/v1/chat/completions"
    )
