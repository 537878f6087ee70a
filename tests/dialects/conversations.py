"""Agent conversations in the Responses and Messages shapes, issued by the fake upstreams (so
their reasoning, thinking and signatures are the upstream's own)."""

from __future__ import annotations

import json
from typing import Any

from tests.api_fakes import FakeMessages, FakeResponses

Json = dict[str, Any]
STAND_IN: Json = {"role": "assistant", "content": "[compactd:ref=abcdef1234 dropped]"}
"""What a provider puts in place of dropped units."""


def tool_output(turn: int, size: int) -> str:
    lines = [
        f"src/mod{turn}/file{k}.py:{k * 7}: def handler_{turn}_{k}(x): return x"
        for k in range(size)
    ]
    return "\n".join(lines)


def responses_input(fake: FakeResponses, turns: int, *, size: int = 40) -> list[Json]:
    """A Codex-like run: one user prompt, then reasoning + a call + its output per turn."""
    items: list[Json] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be terse."}],
        },
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "Fix the failing tests in src/."}],
        },
    ]
    for t in range(turns):
        fake.counter += 1
        items.append(fake.reasoning(f"I should look at module {t} next."))
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{t}",
                "call_id": f"call_{t}",
                "name": "shell",
                "arguments": json.dumps({"command": ["grep", "-rn", f"mod{t}", "src"]}),
                "status": "completed",
            }
        )
        items.append(
            {"type": "function_call_output", "call_id": f"call_{t}", "output": tool_output(t, size)}
        )
        if t % 3 == 2:
            items.append(fake.message(f"Module {t} looks fine; moving on.") | {"id": f"msg_{t}"})
    return items


def messages_history(fake: FakeMessages, turns: int, *, size: int = 40) -> list[Json]:
    """A Claude Code-like run: a user prompt, then thinking + text + tool_use / tool_result."""
    msgs: list[Json] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing tests in src/."}]}
    ]
    for t in range(turns):
        fake.counter += 1
        msgs.append(
            {
                "role": "assistant",
                "content": [
                    fake.thinking(f"Module {t} is next."),
                    {"type": "text", "text": f"Looking at module {t}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{t}",
                        "name": "Bash",
                        "input": {"command": f"grep -rn mod{t} src"},
                    },
                ],
            }
        )
        msgs.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{t}",
                        "content": tool_output(t, size),
                    }
                ],
            }
        )
    return msgs
