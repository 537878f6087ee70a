"""Tiny builders for OpenAI chat messages in provider tests."""

from __future__ import annotations

import json
from typing import Any

from proxy.providers.base import Message


def system(text: str = "You are a careful assistant.") -> Message:
    return {"role": "system", "content": text}


def developer(text: str = "Answer in English.") -> Message:
    return {"role": "developer", "content": text}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str | None, *call_ids: str, **extra: Any) -> Message:
    m: Message = {"role": "assistant", "content": text, **extra}
    if call_ids:
        m["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {
                    "name": "read_file",
                    "arguments": json.dumps({"path": f"src/{cid}.py"}),
                },
            }
            for cid in call_ids
        ]
    return m


def tool(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def words(n: int, seed: str = "lorem") -> str:
    """About n tokens of filler prose without digits or identifiers."""
    vocab = ["alpha", "river", "stone", "quiet", "morning", "garden", "silver", "window"]
    return " ".join(f"{seed if i % 9 == 0 else vocab[i % len(vocab)]}" for i in range(n)) + "."


def agent_run(steps: int, result_tokens: int = 600) -> list[Message]:
    """System, one user request, then `steps` tool exchanges and a final answer."""
    out = [system(), user("Please fix the failing build.")]
    for k in range(steps):
        out.append(assistant(None, f"call_{k}"))
        out.append(tool(f"call_{k}", words(result_tokens, seed=f"chunk{k}")))
    out.append(assistant("Done: the build passes now."))
    return out
