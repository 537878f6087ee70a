from __future__ import annotations

from proxy.providers.units import (
    Unit,
    droppable,
    hard_protected,
    message_text,
    placeholder,
    protection,
    recency_start,
    refs_in,
    split_units,
    with_text,
)
from tests.providers.build import assistant, developer, system, tool, user


def test_assistant_unit_holds_all_its_parallel_tool_results() -> None:
    msgs = [
        system(),
        user("q"),
        assistant(None, "a", "b"),
        tool("b", "rb"),
        tool("a", "ra"),
        user("next"),
    ]
    assert split_units(msgs) == [
        Unit(0, 1, "system"),
        Unit(1, 2, "user"),
        Unit(2, 5, "assistant"),
        Unit(5, 6, "user"),
    ]


def test_tool_result_without_matching_call_is_its_own_orphan_unit() -> None:
    msgs = [user("q"), assistant(None, "a"), tool("a", "ok"), tool("zzz", "stray")]
    assert split_units(msgs)[-1] == Unit(3, 4, "orphan")


def test_units_cover_every_message_once_in_order() -> None:
    msgs = [developer(), user("q"), assistant("x"), tool("none", "?"), assistant(None, "c")]
    units = split_units(msgs)
    assert [i for u in units for i in u.indices()] == list(range(len(msgs)))


def test_legacy_function_result_stays_with_its_function_call() -> None:
    call = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}
    msgs = [user("q"), call, {"role": "function", "name": "f", "content": "42"}]
    assert split_units(msgs)[1] == Unit(1, 3, "assistant")


def test_hard_protection_is_instructions_last_user_and_final_message() -> None:
    msgs = [
        system(),
        user("a"),
        assistant("b"),
        developer(),
        user("c"),
        assistant(None, "t"),
        tool("t", "r"),
    ]
    assert hard_protected(msgs) == {0, 3, 4, 6}


def test_recency_window_counts_user_turns_not_messages() -> None:
    msgs = [
        system(),
        user("1"),
        assistant("a"),
        user("2"),
        assistant(None, "t"),
        tool("t", "r"),
        user("3"),
    ]
    assert recency_start(msgs, 2) == 3
    assert recency_start(msgs, 0) == len(msgs)
    assert recency_start(msgs, 9) == 1  # fewer turns than the window: all but the system prefix


def test_keep_head_widens_to_a_unit_boundary() -> None:
    msgs = [
        system(),
        user("q"),
        assistant(None, "a", "b"),
        tool("a", "1"),
        tool("b", "2"),
        user("z"),
    ]
    prot = protection(msgs, split_units(msgs), keep_head=2, recency_turns=0)
    assert prot.head == {1, 2, 3, 4}


def test_unit_with_protected_message_is_not_droppable_but_relaxing_opens_recency() -> None:
    msgs = [system(), user("1"), assistant("a"), user("2"), assistant("b")]
    units = split_units(msgs)
    prot = protection(msgs, units, keep_head=0, recency_turns=2)
    assert [droppable(u, prot) for u in units] == [False] * 5
    assert [droppable(u, prot, relaxed=True) for u in units] == [False, True, True, False, False]


def test_with_text_keeps_content_parts_and_media() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    m = {"role": "user", "content": [{"type": "text", "text": "look"}, image]}
    out = with_text(m, "short")
    assert out["content"] == [{"type": "text", "text": "short"}, image]
    assert m["content"][0]["text"] == "look"  # the input is not mutated
    assert message_text(out) == "short"


def test_refs_in_lists_each_reference_once_in_order() -> None:
    m = user("[compactd:ref=abcdef12 … x] and [compactd:ref=0011223344 … y] [compactd:ref=abcdef12")
    assert refs_in(m) == ["abcdef12", "0011223344"]


def test_placeholder_takes_the_first_dropped_role_but_never_tool_or_system() -> None:
    ref, stand_in = placeholder([assistant("a"), user("b")], 50)
    assert stand_in["role"] == "assistant"
    assert refs_in(stand_in) == [ref]
    assert placeholder([tool("x", "r")], 9)[1]["role"] == "user"
