"""Request bodies as the real SDKs serialize them, for an agent session with N tools.

openai-python and anthropic are driven for real (their own serialization, captured by an
httpx MockTransport before anything is sent). openai-node is not a Python package: its bytes
are `JSON.stringify(params)` in the caller's key order, compact since v5 and indented by two
spaces in v4 (`JSON.stringify(body, null, 2)`, core.js); `json.dumps` with those settings gives
the same bytes (checked against openai 4.104 and 7.60 under node 22, tool schemas with
non-ASCII, quotes and U+2028 included). Codex sends Responses bodies from Rust (serde_json,
compact, its struct's field order: model, instructions, input, tools, tool_choice,
parallel_tool_calls, reasoning, store, stream, include, prompt_cache_key).

Two agent shapes turn the same session into what the agents send mid-run: `claude-code` (the
anthropic TS SDK's `JSON.stringify`: system blocks with `cache_control`, every reply a text and
a `tool_use`, every later user turn its `tool_result`, the newest two messages marked with
`cache_control` as Claude Code marks them each turn) and `codex-cli` (every reply a `reasoning`
item with encrypted content, an assistant message and a `function_call`, every later user turn
its `function_call_output`).
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
SHAPES = (
    "openai-python",
    "openai-node",
    "openai-node-v4",
    "anthropic",
    "codex-responses",
    "claude-code",
    "codex-cli",
)
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
    return _codex_body(instructions, items, tools)


def _codex_body(instructions: str, items: list[Message], tools: list[dict[str, Any]]) -> bytes:
    """Codex's request around its input items (serde_json: compact, its struct's order)."""
    return _js({
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
    })  # fmt: skip


def _js(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def claude_code(messages: list[Message], tools: list[dict[str, Any]]) -> bytes:
    """The body Claude Code sends mid-run (see the module doc)."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    turns = [m for m in messages if m["role"] != "system"]
    out: list[Message] = []
    for i, m in enumerate(turns):
        if m["role"] == "assistant":
            use = {"type": "tool_use", "id": f"toolu_{i:05d}", "name": "Bash",
                   "input": {"command": f"run step {i}"}}  # fmt: skip
            out.append(
                {"role": "assistant", "content": [{"type": "text", "text": m["content"]}, use]}
            )
        elif i > 0:
            result = {"type": "tool_result", "tool_use_id": f"toolu_{i - 1:05d}",
                      "content": m["content"]}  # fmt: skip
            out.append({"role": "user", "content": [result]})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    for m in out[-2:]:
        m["content"][-1] = {**m["content"][-1], "cache_control": {"type": "ephemeral"}}
    marked = {"type": "ephemeral"}
    return _js({
        "model": "claude-sonnet-4-5",
        "messages": out,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": marked},
            {"type": "text", "text": system, "cache_control": marked},
        ],
        "tools": [_anthropic_tool(t) for t in tools],
        "metadata": {"user_id": "user_0123456789abcdef_account__session_0199a1b2"},
        "max_tokens": 32000,
        "stream": True,
    })  # fmt: skip


def codex_cli(messages: list[Message], tools: list[dict[str, Any]]) -> bytes:
    """The body Codex CLI sends mid-run (see the module doc)."""
    instructions = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    items: list[Message] = []
    for i, m in enumerate(m for m in messages if m["role"] != "system"):
        if m["role"] == "assistant":
            items += [
                {"type": "reasoning", "id": f"rs_{i:05d}",
                 "summary": [{"type": "summary_text", "text": f"**Step {i}**"}],
                 "content": None, "encrypted_content": f"gAAAAB{i:05d}" + "Zm9v" * 150},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": m["content"]}]},
                {"type": "function_call", "name": "shell", "call_id": f"call_{i:05d}",
                 "arguments": json.dumps({"command": ["bash", "-lc", f"step {i}"]})},
            ]  # fmt: skip
        elif i > 0:
            items.append({"type": "function_call_output", "call_id": f"call_{i - 1:05d}",
                          "output": m["content"]})  # fmt: skip
        else:
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": m["content"]}]})  # fmt: skip
    return _codex_body(instructions, items, tools)


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
    if shape == "claude-code":
        return claude_code(messages, schemas)
    if shape == "codex-cli":
        return codex_cli(messages, schemas)
    raise ValueError(f"unknown body shape {shape!r}")


def path(shape: str) -> str:
    """The API path the shape's SDK posts to."""
    paths = {"anthropic": "/v1/messages", "claude-code": "/v1/messages"}
    paths |= {"codex-responses": "/v1/responses", "codex-cli": "/v1/responses"}
    return paths.get(shape, "/v1/chat/completions")


def field_of(shape: str) -> str:
    """The body field that holds the shape's history."""
    return "input" if path(shape) == "/v1/responses" else "messages"
