"""The Responses adapter: items to chat units and back, exactly."""

from __future__ import annotations

import json
import struct
from base64 import b64encode
from typing import Any

import orjson

from proxy.dialects.projection import NATIVE, Marks, native
from proxy.dialects.responses import RESPONSES, project
from proxy.providers.base import CompactionResult
from proxy.providers.units import split_units, with_text
from proxy.runtime.digest import message_digest
from proxy.tokens.counter import Tokenizers
from proxy.tokens.media import image_tokens
from tests.api_fakes import FakeResponses
from tests.dialects.conversations import STAND_IN, responses_input

Json = dict[str, Any]


def body(items: list[Json], **extra: Any) -> Json:
    return {"model": "gpt-5", "instructions": "Be kind.", "input": items, **extra}


def sent_input(raw: bytes) -> list[Json]:
    return json.loads(raw)["input"]


def rewritten(items: list[Json], index: int, text: str) -> list[Json]:
    """The input sent when a provider rewrote projected message `index` to `text`."""
    b = body(items)
    messages = RESPONSES.messages(b)
    assert messages is not None
    messages[index] = with_text(messages[index], text)
    return sent_input(RESPONSES.with_messages(b, messages))


def test_a_reasoning_item_its_call_and_the_output_form_one_unit() -> None:
    items = responses_input(FakeResponses(), 2)
    messages = RESPONSES.messages(body(items))
    assert messages is not None
    roles = [m["role"] for m in messages]
    assert roles == ["developer", "user", "assistant", "tool", "assistant", "tool"]
    assistant = messages[2]
    assert [i["type"] for i in native(assistant)["items"]] == ["reasoning", "function_call"]
    assert assistant["tool_calls"][0]["id"] == "call_0"
    assert messages[3]["tool_call_id"] == "call_0"
    units = split_units(messages)
    assert [(u.start, u.end, u.kind) for u in units][2] == (2, 4, "assistant")


def test_unchanged_messages_go_back_as_the_client_items() -> None:
    items = responses_input(FakeResponses(), 4)
    b = body(items, tools=[{"type": "function", "name": "shell", "parameters": {}}], stream=True)
    messages = RESPONSES.messages(b)
    out = json.loads(RESPONSES.with_messages(b, messages))
    assert out["input"] == items
    assert list(out) == list(b)  # every other key, in its order


def test_a_string_input_is_one_user_message() -> None:
    messages = RESPONSES.messages({"model": "gpt-5", "input": "hello"})
    assert messages is not None
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hello")]


def test_a_rewritten_output_keeps_its_item_and_the_reasoning_stays_verbatim() -> None:
    items = responses_input(FakeResponses(), 3)
    b = body(items)
    messages = RESPONSES.messages(b)
    assert messages is not None
    tool = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    messages[tool] = with_text(messages[tool], "[compactd:ref=abcdef1234] cut")
    assistant = messages[tool - 1]
    messages[tool - 1] = with_text(assistant, "shorter")
    out = sent_input(RESPONSES.with_messages(b, messages))
    output = next(i for i in out if i.get("type") == "function_call_output")
    assert output == {**items[4], "output": "[compactd:ref=abcdef1234] cut"}
    assert out[2] == items[2]  # the reasoning item, byte for byte
    # New text in a run that had none goes right after its reasoning, before the call.
    assert out[3] == {"role": "assistant", "content": "shorter"}
    assert out[4] == items[3]


def test_rewritten_assistant_text_replaces_the_output_text_and_clears_annotations() -> None:
    fake = FakeResponses()
    fake.counter = 1
    items = [
        {"role": "user", "content": "hi"},
        fake.reasoning("think"),
        fake.message("a long answer")
        | {
            "content": [
                {
                    "type": "output_text",
                    "text": "a long answer",
                    "annotations": [{"type": "url_citation"}],
                }
            ]
        },
        {"role": "user", "content": "next"},
    ]
    out = rewritten(items, 1, "short")
    assert out[1] == items[1]
    assert out[2]["content"] == [{"type": "output_text", "text": "short", "annotations": []}]
    assert out[2]["id"] == items[2]["id"]


def test_a_rewritten_run_leaves_no_reasoning_item_without_the_item_it_preceded() -> None:
    fake = FakeResponses()
    fake.counter = 1
    first, second = fake.reasoning("look it up"), fake.reasoning("then answer")
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}}
    items = [
        {"role": "user", "content": "How do we deploy?"},
        first,
        fake.message("Searching the runbook first.") | {"id": "msg_a"},
        search,
        second,
        fake.message("Blue-green, with a health check on every node.") | {"id": "msg_b"},
        {"role": "user", "content": "Thanks."},
    ]
    out = rewritten(items, 1, "[compactd:ref=abcdef1234] Blue-green.")
    # The API refuses a reasoning item not followed by the item it belongs to: the run's text
    # went into its first message, so the second reasoning goes with the second message.
    assert [item.get("id") for item in out[1:4]] == [first["id"], "msg_a", "ws_1"]
    assert out[2]["content"][0]["text"] == "[compactd:ref=abcdef1234] Blue-green."
    assert out[4:] == items[6:]


def test_a_stand_in_is_a_plain_message() -> None:
    items = responses_input(FakeResponses(), 3)
    messages = RESPONSES.messages(body(items)) or []
    out = sent_input(RESPONSES.with_messages(body(items), [*messages[:2], STAND_IN, *messages[4:]]))
    text = {"type": "input_text", "text": "[compactd:ref=abcdef1234 dropped]"}
    assert out[2] == {"role": "user", "content": [text]}
    assert out[3:] == items[5:]


def test_what_cannot_be_paired_or_touched_is_pinned() -> None:
    fake = FakeResponses()
    items = [
        fake.compaction(),
        {"type": "item_reference", "id": "msg_old"},
        {"type": "function_call_output", "call_id": "call_ref", "output": "orphan"},
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"role": "user", "content": "no output for c1 here"},
        {"type": "brand_new_item", "payload": "?"},
        {"role": "user", "content": "last"},
    ]
    messages = RESPONSES.messages(body(items))
    assert messages is not None
    assert [m["role"] for m in messages] == [
        "system",
        "system",
        "system",
        "user",
        "system",
        "user",
        "system",
        "user",
    ]


def test_breakpoints_stay_out_of_digests_and_come_back_where_they_were() -> None:
    mark = {"mode": "explicit"}
    part = {"type": "input_text", "text": "a long prompt " * 10}
    with_mark = [{"role": "user", "content": [{**part, "prompt_cache_breakpoint": mark}]}]
    without = [{"role": "user", "content": [part]}]
    a, b = project(body(with_mark)), project(body(without))
    assert a is not None
    assert b is not None
    assert [message_digest(m) for m in a[0]] == [message_digest(m) for m in b[0]]
    assert a[1].count() == 1
    out = sent_input(RESPONSES.with_messages(body(with_mark), a[0]))
    assert out == with_mark


def test_a_lost_breakpoint_moves_to_the_end_of_the_compacted_prefix() -> None:
    mark = {"mode": "explicit", "ttl": "30m"}
    items = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "old", "prompt_cache_breakpoint": mark}],
        },
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": [{"type": "input_text", "text": "new"}]},
    ]
    b = body(items)
    messages = RESPONSES.messages(b)
    assert messages is not None
    stand_in = {"role": "user", "content": "[compactd:ref=abcdef1234 dropped]"}
    out = sent_input(RESPONSES.with_messages(b, [stand_in, messages[2]]))
    assert out[0]["content"] == [
        {
            "type": "input_text",
            "text": "[compactd:ref=abcdef1234 dropped]",
            "prompt_cache_breakpoint": mark,
        }
    ]
    assert out[1] == items[2]


def test_server_side_history_is_never_compacted() -> None:
    assert RESPONSES.history_elsewhere({"previous_response_id": "resp_1", "input": "hi"})
    assert RESPONSES.history_elsewhere({"conversation": "conv_1", "input": "hi"})
    assert not RESPONSES.history_elsewhere({"input": "hi"})


def test_the_pending_call_turn_must_stay_as_it_was() -> None:
    items = responses_input(FakeResponses(), 3)
    messages = RESPONSES.messages(body(items[:-1] if items[-1].get("type") == "message" else items))
    assert messages is not None
    changed = list(messages)
    changed[-2] = with_text(changed[-2], "rewritten")
    result = CompactionResult(messages=changed, source_digest="x", covered_through=len(changed) - 2)
    assert any("pending" in p for p in RESPONSES.problems(messages, result))
    assert RESPONSES.problems(messages, CompactionResult(list(messages), "x")) == []


def test_a_one_for_one_rewrite_must_keep_its_items() -> None:
    items = responses_input(FakeResponses(), 4)
    messages = RESPONSES.messages(body(items))
    assert messages is not None
    changed = list(messages)
    stripped = {k: v for k, v in changed[2].items() if k != NATIVE}
    changed[2] = {**stripped, "content": "[compactd:ref=abcdef1234] x"}
    result = CompactionResult(
        messages=changed,
        source_digest="x",
        covered_through=2,
        verbatim={"abcdef1234": [messages[2]]},
    )
    assert any("without its items" in p for p in RESPONSES.problems(messages, result))


def test_counting_includes_what_only_the_items_carry() -> None:
    from proxy.tokens.counter import Tokenizers

    base = Tokenizers(encodings=["o200k_base"]).counter("o200k_base")
    counter = RESPONSES.counter(base)
    fake = FakeResponses()
    fake.counter = 1
    plain = {"role": "user", "content": "x"}
    with_reasoning = [
        plain,
        fake.reasoning("a long thought " * 50),
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ]
    without = [plain, with_reasoning[2], with_reasoning[3]]
    a = counter.count_messages(RESPONSES.messages(body(with_reasoning)) or [])
    b = counter.count_messages(RESPONSES.messages(body(without)) or [])
    assert a - b >= 100
    assert RESPONSES.fixed_tokens(
        base,
        body([], tools=[{"type": "function", "name": "shell", "parameters": {"type": "object"}}]),
    ) > RESPONSES.fixed_tokens(base, body([]))
    assert orjson.dumps(Marks("k").per_message) == b"[]"


def _png(width: int, height: int) -> str:
    """A PNG's base64: its header, then ~100 KB that tiktoken would make ~60k tokens of."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + bytes(range(256)) * 400
    return b64encode(png).decode()


def test_a_computer_screenshot_counts_as_an_image_not_as_its_base64() -> None:
    base = Tokenizers(encodings=["o200k_base"]).counter("o200k_base")
    counter = RESPONSES.counter(base)
    shot = {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{_png(1280, 800)}"}
    call = {"type": "computer_call", "call_id": "c", "action": {"type": "screenshot"}}

    def cost(output: Json) -> int:
        output_item = {"type": "computer_call_output", "call_id": "c", "output": output}
        items = [{"role": "user", "content": "open settings"}, call, output_item]
        return counter.count_messages(RESPONSES.messages(body(items)) or [])

    # The model sees a screenshot as an image: the tile rule, as for an `input_image`.
    without = cost({"type": "computer_screenshot", "file_id": "file-1", "detail": "low"})
    assert cost(shot) - without == image_tokens(1280, 800) - 85


def test_a_generated_image_counts_as_an_image_not_as_its_base64() -> None:
    base = Tokenizers(encodings=["o200k_base"]).counter("o200k_base")
    counter = RESPONSES.counter(base)
    fake = FakeResponses()
    fake.counter = 1

    def cost(result: str | None) -> int:
        call = {"type": "image_generation_call", "id": "ig_1", "status": "completed"}
        items = [
            {"role": "user", "content": "Draw a cat."},
            fake.reasoning("draw"),
            {**call, "result": result},
            fake.message("Here it is."),
            {"role": "user", "content": "Now make it blue."},
        ]
        return counter.count_messages(RESPONSES.messages(body(items)) or [])

    # Sent back for an edit, the image is the model's input as any image is: the tile rule.
    assert cost(_png(1024, 1024)) - cost(None) == image_tokens(1024, 1024)


def test_images_in_pinned_items_count_as_images_not_as_their_base64() -> None:
    base = Tokenizers(encodings=["o200k_base"]).counter("o200k_base")
    counter = RESPONSES.counter(base)
    png = f"data:image/png;base64,{_png(1280, 800)}"

    def cost(shot: Json, part: Json, generated: str | None) -> int:
        # Outputs whose calls are not right before them, and a run whose call is never
        # answered: pinned, kept verbatim, and counted as what the model reads.
        items = [
            {"role": "user", "content": "open settings"},
            {"type": "computer_call_output", "call_id": "c", "output": shot},
            {"type": "function_call_output", "call_id": "f", "output": [part]},
            {"type": "function_call", "call_id": "g", "name": "draw", "arguments": "{}"},
            {"type": "image_generation_call", "id": "ig_1", "result": generated},
            {"role": "user", "content": "go on"},
        ]
        messages = RESPONSES.messages(body(items)) or []
        assert [native(m)["kind"] for m in messages[1:4]] == ["pinned"] * 3
        return counter.count_messages(messages)

    low = {"file_id": "file-1", "detail": "low"}
    shot, part = {"type": "computer_screenshot"}, {"type": "input_image"}
    with_images = cost({**shot, "image_url": png}, {**part, "image_url": png}, _png(1024, 1024))
    without = cost({**shot, **low}, {**part, **low}, None)
    assert with_images - without == 2 * (image_tokens(1280, 800) - 85) + image_tokens(1024, 1024)
