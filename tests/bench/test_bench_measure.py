"""bench/measure: a probe is kept in context only with its original surroundings."""

from __future__ import annotations

import json

from bench.measure import Windows, kept_verbatim, searchable, squeezed_text
from proxy.providers.base import Message

PROSE = "Before we start: the invoice number is INV-20931 and it is due on 2024-07-01, so hurry."


def user(text: str) -> Message:
    """A user message."""
    return {"role": "user", "content": text}


def kept(original: list[Message], result: list[Message], fact: str) -> tuple[int, int]:
    """(in context, verbatim) for one fact."""
    windows = Windows(original, [fact])
    return windows.kept(squeezed_text(result)), kept_verbatim([fact], searchable(result))


def test_a_fact_kept_with_its_sentence_is_kept_in_context() -> None:
    original = [user(PROSE), user("thanks")]
    result = [user("[compactd:ref=ab] " + PROSE[10:])]
    assert kept(original, result, "INV-20931") == (1, 1)


def test_a_bare_term_in_a_list_is_verbatim_but_not_in_context() -> None:
    original = [user(PROSE)]
    result = [user("facts: INV-20931, 2024-07-01, invoice")]
    assert kept(original, result, "INV-20931") == (0, 1)
    assert kept(original, result, "2024-07-01") == (0, 1)


def test_less_than_the_full_context_on_one_side_is_not_enough() -> None:
    original = [user(PROSE)]
    # 23 of the 24 non-space characters on the left.
    left = "".join(PROSE[: PROSE.index("INV")].split())[-23:]
    result = [user(left + "INV-20931 and it is due on 2024-07-01, so hurry.")]
    assert kept(original, result, "INV-20931") == (0, 1)


def test_whitespace_is_ignored_so_minified_json_keeps_indented_json() -> None:
    value = {"order": {"id": "W-88123", "items": [1, 2, 3], "status": "pending"}}
    original = [user(json.dumps(value, indent=2)), user("next")]
    result = [user(json.dumps(value, separators=(",", ":")))]
    assert kept(original, result, "W-88123") == (1, 1)


def test_an_occurrence_at_the_start_of_a_message_needs_only_what_follows() -> None:
    original = [user("INV-20931 is the invoice we paid twice last month, refund it")]
    result = [user("INV-20931 is the invoice we paid twice last month")]
    assert kept(original, result, "INV-20931") == (1, 1)
    cut = [user("INV-20931 is the invoice")]
    assert kept(original, cut, "INV-20931") == (0, 1)


def test_any_one_occurrence_with_its_context_is_enough() -> None:
    original = [user("first mention: ticket 4471 in the queue for billing"), user(PROSE)]
    result = [user("ticket 4471 in the queue"), user(PROSE)]
    assert kept(original, result, "INV-20931") == (1, 1)
    assert kept(original, result, "4471") == (0, 1)


def test_a_window_does_not_cross_messages_in_the_original_or_the_result() -> None:
    original = [user("end of one message 31337"), user("start of the next one, long enough")]
    # In the original the probe ends its message: the right context is empty there.
    result = [user("end of one message 31337")]
    assert kept(original, result, "31337") == (1, 1)
    # A result that splits the left context across two messages does not keep it.
    split = [user("end of one"), user("message 31337")]
    assert kept(original, split, "31337") == (0, 1)


def test_tool_call_arguments_are_searched_as_raw_text() -> None:
    arguments = json.dumps({"path": "src/app/models.py", "line": 120}, indent=2)
    call = {"id": "c1", "type": "function", "function": {"name": "open", "arguments": arguments}}
    original: list[Message] = [
        user("go"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    minified = json.dumps({"path": "src/app/models.py", "line": 120}, separators=(",", ":"))
    result: list[Message] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {"name": "open", "arguments": minified}}],
        }
    ]
    assert kept(original, result, "src/app/models.py") == (1, 1)


def test_system_messages_are_not_searched() -> None:
    original = [{"role": "system", "content": PROSE}, user(PROSE)]
    assert kept(original, [{"role": "system", "content": PROSE}], "INV-20931") == (0, 0)
