"""The Messages (Anthropic) adapter: blocks to chat units and back, exactly."""

from __future__ import annotations

import json
from typing import Any

from proxy.dialects.messages import MESSAGES, pending_turn, project
from proxy.dialects.projection import native
from proxy.providers.base import CompactionResult
from proxy.providers.units import with_text
from proxy.runtime.digest import message_digest
from tests.api_fakes import FakeMessages
from tests.dialects.conversations import STAND_IN, messages_history

Json = dict[str, Any]


def body(messages: list[Json], **extra: Any) -> Json:
    return {
        "model": "claude-sonnet-5",
        "max_tokens": 1024,
        "system": "Be kind.",
        "messages": messages,
        **extra,
    }


def sent(raw: bytes) -> list[Json]:
    return json.loads(raw)["messages"]


def test_tool_results_become_tool_messages_after_their_assistant_turn() -> None:
    msgs = messages_history(FakeMessages(), 2)
    msgs.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "?"}]}
    )
    projected = MESSAGES.messages(body(msgs[:-1]))
    assert projected is not None
    assert [m["role"] for m in projected] == ["user", "assistant", "tool", "assistant", "tool"]
    assistant = projected[1]
    assert assistant["tool_calls"][0]["id"] == "toolu_0"
    assert assistant["content"] == "Looking at module 0."
    assert native(assistant)["content"][0]["type"] == "thinking"  # carried, not shown
    # A result answering no tool_use right before it is pinned.
    pinned = MESSAGES.messages(body([msgs[0], msgs[-1]]))
    assert pinned is not None
    assert [m["role"] for m in pinned] == ["user", "system"]


def test_unchanged_messages_go_back_as_the_client_sent_them() -> None:
    msgs = messages_history(FakeMessages(), 3)
    msgs.append({"role": "user", "content": "a plain string turn"})
    b = body(msgs, thinking={"type": "enabled", "budget_tokens": 2000})
    projected = MESSAGES.messages(b)
    out = json.loads(MESSAGES.with_messages(b, projected or []))
    assert out["messages"] == msgs
    assert list(out) == list(b)


def test_a_user_message_with_results_and_text_splits_and_rejoins() -> None:
    fake = FakeMessages()
    msgs = messages_history(fake, 1)
    msgs[-1]["content"].append({"type": "text", "text": "Also check the docs."})
    b = body(msgs)
    projected = MESSAGES.messages(b)
    assert projected is not None
    assert [m["role"] for m in projected] == ["user", "assistant", "tool", "user"]
    assert sent(MESSAGES.with_messages(b, projected)) == msgs


def test_a_rewritten_tool_result_keeps_its_block_and_the_thinking_stays() -> None:
    msgs = messages_history(FakeMessages(), 3)
    b = body(msgs)
    projected = MESSAGES.messages(b)
    assert projected is not None
    projected[2] = with_text(projected[2], "[compactd:ref=abcdef1234] cut")
    projected[1] = with_text(projected[1], "shorter")
    out = sent(MESSAGES.with_messages(b, projected))
    assert out[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_0",
            "content": "[compactd:ref=abcdef1234] cut",
        }
    ]
    assert out[1]["content"][0] == msgs[1]["content"][0]  # thinking and its signature
    assert out[1]["content"][1] == {"type": "text", "text": "shorter"}
    assert out[1]["content"][2] == msgs[1]["content"][2]  # the tool_use


def test_a_stand_in_is_a_user_message_of_its_own() -> None:
    msgs = messages_history(FakeMessages(), 3)
    b = body(msgs)
    projected = MESSAGES.messages(b)
    assert projected is not None
    out = sent(MESSAGES.with_messages(b, [projected[0], STAND_IN, *projected[3:]]))
    text = {"type": "text", "text": "[compactd:ref=abcdef1234 dropped]"}
    assert out[1] == {"role": "user", "content": [text]}
    assert out[2:] == msgs[3:]


def test_breakpoints_stay_out_of_digests_kept_ones_return_lost_ones_move() -> None:
    mark = {"type": "ephemeral"}
    msgs = messages_history(FakeMessages(), 3)
    marked = json.loads(json.dumps(msgs))
    marked[2]["content"][0]["cache_control"] = mark  # on an old tool result
    marked[-1]["content"][0]["cache_control"] = mark  # on the newest
    a, plain = project(body(marked)), project(body(msgs))
    assert a is not None
    assert plain is not None
    assert [message_digest(m) for m in a[0]] == [message_digest(m) for m in plain[0]]
    assert a[1].count() == 2
    b = body(marked)
    assert sent(MESSAGES.with_messages(b, a[0])) == marked
    stand_in = STAND_IN
    out = sent(MESSAGES.with_messages(b, [a[0][0], stand_in, *a[0][3:]]))
    assert out[1]["content"] == [
        {"type": "text", "text": "[compactd:ref=abcdef1234 dropped]", "cache_control": mark}
    ]
    assert out[-1] == marked[-1]
    count = json.dumps(out).count('"cache_control"')
    assert count == 2


def test_the_assistant_turn_a_pending_result_continues_must_not_change() -> None:
    msgs = messages_history(FakeMessages(), 3)
    msgs[-1]["content"].append({"type": "text", "text": "and then?"})
    projected = MESSAGES.messages(body(msgs))
    assert projected is not None
    j = pending_turn(projected)
    assert j is not None
    assert projected[j]["role"] == "assistant"
    changed = list(projected)
    changed[j] = with_text(changed[j], "rewritten")
    result = CompactionResult(messages=changed, source_digest="x", covered_through=j)
    assert MESSAGES.problems(projected, result)
    assert MESSAGES.problems(projected, CompactionResult(list(projected), "x")) == []


def test_system_and_tools_are_the_fixed_cost() -> None:
    from proxy.tokens.counter import Tokenizers

    base = Tokenizers(encodings=["o200k_base"]).counter("o200k_base")
    tool = {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
    small = MESSAGES.fixed_tokens(base, body([]))
    large = MESSAGES.fixed_tokens(
        base, body([], tools=[tool], system=[{"type": "text", "text": "long " * 100}])
    )
    assert large > small + 100


def test_text_and_content_documents_count_as_their_text() -> None:
    from proxy.tokens.counter import Tokenizers

    base = Tokenizers(encodings=["o200k_base"]).counter("o200k_base")
    counter = MESSAGES.counter(base)
    text = " ".join(f"Fact {i}: the thing weighs {i * 7} grams." for i in range(2000))
    sources = [
        {"type": "text", "media_type": "text/plain", "data": text},
        {"type": "content", "content": [{"type": "text", "text": text}]},
    ]
    for source in sources:
        document = {"type": "document", "source": source, "title": "notes"}
        asked = [{"role": "user", "content": [document, {"type": "text", "text": "Sum up."}]}]
        use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [document]}
        read = [
            {"role": "user", "content": "Read the notes."},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
        for msgs in (asked, read):
            projected = MESSAGES.messages(body(msgs))
            assert projected is not None
            assert counter.count_messages(projected) >= base.count_text(text), source["type"]


def test_images_in_pinned_messages_count_as_images_not_as_their_base64() -> None:
    import struct
    from base64 import b64encode

    from proxy.tokens.counter import Tokenizers
    from proxy.tokens.media import IMAGE_UNKNOWN, image_tokens

    counter = MESSAGES.counter(Tokenizers(encodings=["o200k_base"]).counter("o200k_base"))
    ihdr = struct.pack(">IIBBBBB", 1280, 800, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + bytes(range(256)) * 400
    data = {"type": "base64", "media_type": "image/png", "data": b64encode(png).decode()}

    def cost(source: Json) -> int:
        # A result whose tool_use is not right before it: pinned, kept verbatim, still counted.
        image = {"type": "image", "source": source}
        result = {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
        messages = MESSAGES.messages(body([{"role": "user", "content": [result]}])) or []
        assert native(messages[0])["kind"] == "pinned"
        return counter.count_messages(messages)

    remote = cost({"type": "url", "url": "https://example.com/shot.png"})
    assert cost(data) - remote == image_tokens(1280, 800) - IMAGE_UNKNOWN


def test_a_claude_image_counts_by_anthropics_pixel_rule_not_openais_tiles() -> None:
    import struct
    from base64 import b64encode

    from proxy.tokens.budget import ModelTable
    from proxy.tokens.counter import Tokenizers

    info = ModelTable.load().lookup("claude-sonnet-4-5")
    counter = MESSAGES.counter(Tokenizers(encodings=["o200k_base"]).for_model(info))
    ihdr = struct.pack(">IIBBBBB", 1280, 800, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0" * 64
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64encode(png).decode()},
    }
    text = {"type": "text", "text": "what is on the screen?"}

    def cost(content: list[Json]) -> int:
        return counter.count_messages(
            MESSAGES.messages(body([{"role": "user", "content": content}])) or []
        )

    # Anthropic: (1280 x 800) / 750 = 1365.3 (the tile rule said 85 + 6 x 170 = 1105). A URL
    # image counts as the largest size Claude keeps unscaled, 784x1568: 1640.
    assert cost([text, image]) - cost([text]) == 1366
    remote = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert cost([text, remote]) - cost([text]) == 1640


def test_a_history_of_repeated_messages_goes_back_as_it_came() -> None:
    # Every repeat of a message is matched to its own original, in order: the way back looked
    # each one up from the first repeat (8 s of the event loop for 49,000 such messages).
    request = body([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 300)
    projected = MESSAGES.messages(request)
    assert projected is not None
    sent = MESSAGES.with_messages(request, projected[:10] + projected[-100:])
    assert json.loads(sent)["messages"] == request["messages"][:10] + request["messages"][-100:]
