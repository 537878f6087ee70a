"""A third-party provider written for chat works on all three APIs unchanged.

The example plugin of tests/plugins (it shortens long `tool` messages, nothing else) is loaded
from its source and registered as it would be through its entry point; the same policy then
compacts a Chat Completions, a Responses and a Messages request, each accepted by its validating
fake upstream, and each restores to the client's own items.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.providers.base import ContextProvider
from proxy.providers.registry import ProviderRegistry
from tests.dialects.conversations import messages_history, responses_input, tool_output
from tests.dialects.harness import Harness, harness

PLUGIN = Path(__file__).parent.parent / "plugins" / "example_provider"
Json = dict[str, Any]


def example_provider() -> type[ContextProvider]:
    path = PLUGIN / "compactd_example_provider" / "__init__.py"
    spec = importlib.util.spec_from_file_location("example_provider_by_path", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls: type[ContextProvider] = module.ShortToolResults
    return cls


def chat_messages(turns: int) -> list[Json]:
    msgs: list[Json] = [{"role": "user", "content": "Fix the failing tests in src/."}]
    for t in range(turns):
        call = {
            "id": f"call_{t}",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"cmd": f"grep mod{t}"})},
        }
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{t}", "content": tool_output(t, 40)})
    return msgs


async def over_budget(h: Harness, api: str) -> tuple[Any, Any, list[Json], Json]:
    """Send an agent run over its budget in this API's shape: (response, its fake upstream,
    the client's history, the body to restore what was sent)."""
    if api == "chat.completions":
        original = chat_messages(30)
        response = await h.chat({"model": "gpt-5", "messages": original})
        return response, h.responses, original, {"messages": h.responses.last.json()["messages"]}
    if api == "responses":
        original = responses_input(h.responses, 30)
        response = await h.create({"model": "gpt-5", "input": original, "store": False})
        return (
            response,
            h.responses,
            original,
            {"api": api, "input": h.responses.last.json()["input"]},
        )
    original = messages_history(h.messages, 30)
    body = {"model": "claude-sonnet-5", "max_tokens": 1024, "messages": original}
    response = await h.message(body)
    return (
        response,
        h.messages,
        original,
        {"api": api, "messages": h.messages.last.json()["messages"]},
    )


APIS = ["chat.completions", "responses", "messages"]


@pytest.mark.parametrize("api", APIS)
async def test_a_chat_provider_compacts_every_api_validly_and_reversibly(tmp_path, api) -> None:
    registry = ProviderRegistry()
    registry.register("short-tools", example_provider())
    policy = {
        "providers": ["short-tools"],
        "budget_tokens": 8000,
        "options": {"short-tools": {"keep_chars": 100}},
    }
    async with harness(tmp_path, registry, default_policy=policy) as h:
        response, fake, original, restore = await over_budget(h, api)
        field = "input" if api == "responses" else "messages"
        sent = restore[field]
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-action"] == "compacted"
        assert response.headers["x-compactd-provider"] == "short-tools"
        assert response.headers["x-compactd-api"] == api
        assert fake.refused == []
        assert "shortened" in json.dumps(sent)
        assert len(sent) == len(original)  # one for one: only the long results changed
        restored = await h.uncompress(restore)
        assert restored.status_code == 200, restored.text
        assert restored.json()[field] == original
        assert restored.json()["missing_ids"] == []
        assert h.metric("compactd_requests_total", action="compacted", api=api) == 1


@pytest.mark.parametrize("api", APIS)
async def test_shadow_mode_forwards_the_clients_bytes_on_every_api(tmp_path, api) -> None:
    policy = {"mode": "shadow", "budget_tokens": 4000}
    async with harness(tmp_path, default_policy=policy) as h:
        response, fake, _, _ = await over_budget(h, api)
        assert response.status_code == 200, response.text
        assert response.headers["x-compactd-action"] == "shadow"
        assert response.headers["x-compactd-shadow-action"] == "compacted"
        assert int(response.headers["x-compactd-tokens-after"]) < int(
            response.headers["x-compactd-tokens-before"]
        )
        assert fake.last.body == h.sent[-1]  # what the client sent, byte for byte
