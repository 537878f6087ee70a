"""Every kind of item the issue names, in one over-budget run per API, through the proxy.

Responses: string and part-list messages with `input_image` / `input_file`, function and custom
tool calls, `reasoning` items, a built-in `web_search_call`, assistant text with annotations and
a `compaction` item from an earlier native compaction. Messages: images, a document with
citations enabled, text citing it, `thinking` and `redacted_thinking`, `server_tool_use` with its
`web_search_tool_result`, tool results whose content is blocks. Each run is compacted into a
request its validating fake upstream accepts, every opaque item that is sent is the client's
own, byte for byte, and restore gives back the client's items exactly.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from proxy.store.base import ConversationInfo
from tests.api_fakes import FakeMessages, FakeResponses
from tests.cli.test_cli import run
from tests.dialects.conversations import tool_output
from tests.dialects.harness import KEY, Harness, harness

Json = dict[str, Any]
SMALL = {"default_policy": {"budget_tokens": 6000}}
IMAGE = base64.b64encode(bytes(range(256)) * 4).decode()
SPEC = "The service must answer within 200 ms and retry twice. " * 40


def responses_items(fake: FakeResponses, turns: int) -> list[Json]:
    items: list[Json] = [
        fake.compaction(),
        {"role": "developer", "content": "Be terse."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Make the page match this screenshot and spec."},
                {"type": "input_image", "image_url": f"data:image/png;base64,{IMAGE}"},
                {"type": "input_file", "filename": "spec.txt", "file_data": SPEC},
            ],
        },
    ]
    for t in range(turns):
        fake.counter += 1
        items.append(fake.reasoning(f"step {t}"))
        if t % 5 == 1:
            items.append(
                {
                    "type": "web_search_call",
                    "id": f"ws_{t}",
                    "status": "completed",
                    "action": {"type": "search", "query": f"css grid {t}"},
                }
            )
            text = {
                "type": "output_text",
                "text": f"Found docs for step {t}.",
                "annotations": [
                    {"type": "url_citation", "url": "https://example.com", "start_index": 0}
                ],
            }
            items.append(fake.message("") | {"id": f"msg_ws_{t}", "content": [text]})
            items.append({"role": "user", "content": f"Go on with step {t}."})
            continue
        if t % 2:
            call = {"type": "custom_tool_call", "call_id": f"c_{t}", "name": "apply_patch"}
            items.append({**call, "id": f"ctc_{t}", "input": f"*** Begin Patch {t}"})
            items.append(
                {
                    "type": "custom_tool_call_output",
                    "call_id": f"c_{t}",
                    "output": tool_output(t, 30),
                }
            )
        else:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{t}",
                    "call_id": f"f_{t}",
                    "name": "shell",
                    "arguments": json.dumps({"command": ["rg", f"step{t}"]}),
                }
            )
            items.append(
                {"type": "function_call_output", "call_id": f"f_{t}", "output": tool_output(t, 30)}
            )
    return items


def messages_items(fake: FakeMessages, turns: int) -> list[Json]:
    msgs: list[Json] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Make the page match this screenshot and spec."},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": IMAGE},
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": SPEC},
                    "title": "spec",
                    "citations": {"enabled": True},
                },
            ],
        }
    ]
    for t in range(turns):
        fake.counter += 1
        think = fake.redacted_thinking() if t % 4 == 3 else fake.thinking(f"step {t}")
        blocks: list[Json] = [think]
        if t % 5 == 1:
            blocks += [
                {
                    "type": "server_tool_use",
                    "id": f"srvtoolu_{t}",
                    "name": "web_search",
                    "input": {"query": f"css grid {t}"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": f"srvtoolu_{t}",
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://example.com",
                            "title": "CSS grid",
                            "encrypted_content": f"enc-{t}",
                        }
                    ],
                },
            ]
        if t % 3 == 0:
            cite = {
                "type": "char_location",
                "cited_text": "The service must answer within 200 ms",
                "document_index": 0,
                "document_title": "spec",
                "start_char_index": 0,
                "end_char_index": 37,
            }
            blocks.append({"type": "text", "text": f"Per the spec, step {t}.", "citations": [cite]})
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{t}", "name": "Bash", "input": {"c": f"rg {t}"}}
        )
        msgs.append({"role": "assistant", "content": blocks})
        content: Any = tool_output(t, 30)
        if t % 2:
            content = [{"type": "text", "text": content}]
        msgs.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": content}
                ],
            }
        )
    return msgs


def _opaque(items: list[Json], kinds: set[str]) -> list[str]:
    """Every block or item of these types, serialized, wherever it sits."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("type") in kinds:
                found.append(json.dumps(value, sort_keys=True))
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(items)
    return found


async def test_every_responses_item_kind_is_compacted_validly_and_restored(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        items = responses_items(h.responses, 30)
        body = {"model": "gpt-5", "instructions": "You are Codex.", "input": items}
        sent = await h.compacted("responses", body)
        assert sent[0] == items[0]  # the compaction item: first, as it was
        assert sent[1] == items[1]  # the developer message, never touched
        opaque = {"reasoning", "compaction", "web_search_call"}
        assert set(_opaque(sent, opaque)) <= set(_opaque(items, opaque))
        assert sent[-2:] == items[-2:]  # the pending call and its output
        restored = await h.uncompress({"api": "responses", "input": sent})
        assert restored.status_code == 200, restored.text
        assert restored.json()["input"] == items
        assert restored.json()["missing_ids"] == []


async def test_every_messages_block_kind_is_compacted_validly_and_restored(tmp_path) -> None:
    async with harness(tmp_path, **SMALL) as h:
        msgs = messages_items(h.messages, 30)
        body = {
            "model": "claude-sonnet-5",
            "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": msgs,
        }
        sent = await h.compacted("messages", body)
        assert sent[0] == msgs[0]  # the prompt with its image and document, whole
        opaque = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"}
        assert set(_opaque(sent, opaque)) <= set(_opaque(msgs, opaque))
        assert sent[-2:] == msgs[-2:]  # the pending turn, thinking first, and its result
        restored = await h.uncompress({"api": "messages", "messages": sent})
        assert restored.status_code == 200, restored.text
        assert restored.json()["messages"] == msgs
        assert restored.json()["missing_ids"] == []


async def _compacted_conversation(h: Harness, api: str) -> tuple[list[Json], ConversationInfo]:
    """A 30-turn conversation of `api`, compacted: the client's items and its listing."""
    if api == "responses":
        original = responses_items(h.responses, 30)
        body = {"model": "gpt-5", "instructions": "You are Codex.", "input": original}
    else:
        original = messages_items(h.messages, 30)
        body = {"model": "claude-sonnet-5", "max_tokens": 2048, "messages": original}
    await h.compacted(api, body)
    [listed] = await h.services.store.list_conversations(None)
    return original, listed


def _assert_the_clients_own(out: Json, api: str, original: list[Json]) -> list[Json]:
    """The restored items of a restore's JSON, checked to be the client's own (not compactd's
    projection of them), as many as the checkpoint covers."""
    assert out["api"] == api
    assert out["missing_ids"] == []
    restored: list[Json] = out["input" if api == "responses" else "messages"]
    assert 0 < len(restored) < len(original)
    assert restored == original[: len(restored)]
    return restored


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_compactd_restore_prints_the_apis_own_items_as_the_client_sent_them(
    tmp_path, api: str
) -> None:
    async with harness(tmp_path, **SMALL) as h:
        original, listed = await _compacted_conversation(h, api)
    conv = listed.conversation
    result = run("restore", conv, data=tmp_path / "data")
    assert result.returncode == 0, result.stderr
    _assert_the_clients_own(json.loads(result.stdout), api, original)


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_the_conversation_api_and_the_inspector_download_give_the_apis_own_items(
    tmp_path, api: str
) -> None:
    field = "input" if api == "responses" else "messages"
    async with harness(tmp_path, **SMALL) as h:
        original, listed = await _compacted_conversation(h, api)
        path = f"/compactd/v1/conversations/{listed.conversation}"
        auth = {"authorization": f"Bearer {KEY}"}
        got = (await h.client.get(path, headers=auth)).json()
        view = (await h.client.get(f"{path}/inspect", headers=auth)).json()
    # GET: the originals as the client sent them, in its API's shape, as `compactd restore` gives.
    restored = _assert_the_clients_own(got, api, original)
    assert all(isinstance(cp[field], list) for cp in got["checkpoints"])
    assert "compactd_native" not in json.dumps(got)
    # The inspector's download of the latest checkpoint is those same items.
    assert view["api"] == api
    latest = view["checkpoints"][-1]
    assert latest["restored"] == {field: restored}
    assert "compactd_native" not in json.dumps([cp["restored"] for cp in view["checkpoints"]])
