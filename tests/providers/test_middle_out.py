from __future__ import annotations

from proxy.providers.base import REF_PATTERN, Message
from proxy.providers.middle_out import MiddleOutProvider, middle_first
from proxy.providers.uncompress import uncompress
from proxy.providers.units import Unit, message_text
from proxy.providers.validate import check_result
from tests.providers.build import agent_run, assistant, system, tool, user, words
from tests.providers.tokens import count_tokens, make_config


def middle_out(msgs: list[Message], limit: int) -> list[Message]:
    config = make_config(limit=limit, budget=max(limit, count_tokens(msgs)))
    result = MiddleOutProvider().compress(msgs, config)
    assert check_result(msgs, result, config) == []
    assert uncompress(result.messages, result.verbatim).messages == msgs
    return result.messages


def test_units_are_ordered_from_the_middle_outwards() -> None:
    units = [Unit(i, i + 1, "user") for i in range(5)]
    assert [u.start for u in middle_first(units)] == [2, 3, 1, 4, 0]


def test_the_middle_goes_first_and_head_and_tail_stay() -> None:
    msgs = [system()]
    for k in range(10):
        msgs += [user(f"question {k} " + words(100)), assistant(f"answer {k} " + words(100))]
    out = middle_out(msgs, count_tokens(msgs) - 500)
    assert out[:3] == msgs[:3]
    assert out[-3:] == msgs[-3:]
    dropped = [m for m in out if "dropped]" in message_text(m)]
    assert len(dropped) == 1
    assert "question 5" not in " ".join(message_text(m) for m in out)


def test_tool_exchanges_are_dropped_whole() -> None:
    msgs = agent_run(10)
    out = middle_out(msgs, count_tokens(msgs) // 2)
    calls = {c["id"] for m in out for c in m.get("tool_calls", [])}
    answered = {m["tool_call_id"] for m in out if m["role"] == "tool"}
    assert calls == answered
    assert len(out) < len(msgs)


def test_protected_messages_survive_even_when_the_target_is_unreachable() -> None:
    msgs = [
        system(words(500)),
        user("a " + words(300)),
        assistant(None, "t"),
        tool("t", words(300)),
        assistant("Read it."),
        user("last"),
    ]
    out = middle_out(msgs, 10)
    assert out[0] == msgs[0]
    assert out[-1] == msgs[-1]
    assert len(out) == 3


def test_a_user_message_right_after_tool_results_goes_with_them() -> None:
    # Anthropic's clients send the results and the text after them as one message: a stand-in
    # takes both or neither. Here the text is the last user message, so the exchange stays.
    msgs = [
        system(),
        user("a " + words(300)),
        assistant(None, "t"),
        tool("t", words(300)),
        user("last"),
    ]
    out = middle_out(msgs, count_tokens(msgs) // 2)
    assert out[0] == msgs[0]
    assert out[2:] == msgs[2:]
    assert REF_PATTERN.search(out[1]["content"])


def test_under_target_nothing_changes() -> None:
    msgs = agent_run(3)
    assert middle_out(msgs, 10**6) == msgs
