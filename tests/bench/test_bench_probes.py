"""bench/probes: probes are what the conversation uses next, never in protected messages."""

from __future__ import annotations

import json

from bench.probes import (
    agent_probes,
    answer_items,
    call_values,
    code_items,
    cut_point,
    probes,
    rare_items,
    specific_items,
    urls,
)
from proxy.providers.base import Message


def call(i: int, **arguments: object) -> Message:
    """An assistant message with one tool call."""
    function = {"name": "bash", "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"c{i}", "type": "function", "function": function}],
    }


def result(i: int, text: str) -> Message:
    """The tool result of call `i`."""
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def chat(script: str) -> list[Message]:
    """Messages from `role: text` lines."""
    return [
        {"role": role, "content": text}
        for role, text in (line.split(": ", 1) for line in script.strip().splitlines())
    ]


def test_probes_are_facts_found_only_outside_the_protected_messages() -> None:
    messages = chat("""
system: Agent for Paris.
user: I flew to Lisbon on 2024-05-02 with Ana.
assistant: Noted, Lisbon and Ana.
user: Where did I fly, and with whom was it? Ana?
""")
    # Paris is in the system prompt and Ana in the last user message: neither can be lost.
    assert probes(messages, ["Paris", "Lisbon", "2024-05-02", "Ana", "Tokyo"]) == [
        "2024-05-02",
        "Lisbon",
    ]


def test_urls_in_any_wrapping_come_out_whole() -> None:
    text = (
        "Read <https://example.org/guide> first, then "
        "[Lambda](https://en.wikipedia.org/wiki/Lambda_(function)) and "
        "https://docs.python.org/3/library/re.html. Also (see www.rust-lang.org/learn)."
    )
    assert urls(text) == {
        "https://example.org/guide",
        "https://en.wikipedia.org/wiki/Lambda_(function)",
        "https://docs.python.org/3/library/re.html",
        "www.rust-lang.org/learn",
    }


def test_specific_items_are_ids_dates_paths_titles_and_names() -> None:
    text = (
        "Order INV-20931 ships on March 3, 2024 to Green Meadow Park; the config is in "
        "conf/app.toml and *The Pragmatic Programmer* is on the list, by Andrew Hunt."
    )
    found = specific_items(text)
    assert {
        "INV-20931",
        "March 3, 2024",
        "conf/app.toml",
        "The Pragmatic Programmer",
        "Green Meadow Park",
        "Andrew Hunt",
    } <= found
    assert "Order" not in found  # a sentence start is not a name


def test_chat_probes_are_items_said_in_at_most_three_messages_outside_the_protected() -> None:
    messages = chat("""
system: Chat about books.
user: I loved Dune by Frank Herbert, and Ana said the same.
assistant: Frank Herbert wrote six Dune novels; Ana agrees.
user: Frank Herbert again: my copy is from 1965.
assistant: Frank Herbert, yes. Ana has the 1965 one?
user: Ana asks: which one first? See https://dune.fandom.com/wiki/Dune_(novel)
""")
    found = rare_items(messages)
    assert "1965" in found
    assert "Frank Herbert" not in found  # in four messages: not rare
    assert "https://dune.fandom.com/wiki/Dune_(novel)" not in found  # in the last user message
    assert not any(f == "Ana" for f in found)  # named in the last user message


def test_answer_items_drop_the_word_that_starts_an_answer() -> None:
    assert answer_items(['Lives in Oslo since 2019. Works at "Blue Fjord"']) == {
        "Oslo",
        "2019",
        "Blue Fjord",
    }


def test_commands_give_their_paths_names_line_numbers_and_quoted_patterns() -> None:
    found = code_items("sed -n '583,600p' django/db/models/query.py | grep -n 'def _filter_or'")
    assert {"django/db/models/query.py", "583,600p", "def _filter_or"} <= found
    assert "sed" not in found
    assert "grep" not in found
    assert call_values(call(1, reservation_id="ZFA04Y", cabin="economy", amount=122)) == {
        "ZFA04Y",
        "122",
    }


def test_an_agent_run_is_cut_before_an_assistant_turn_and_probed_with_what_follows() -> None:
    messages: list[Message] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug in pkg/mod.py."},
        call(1, command="grep -rn compute_total pkg"),
        result(1, "pkg/mod.py:10: def compute_total(items, rate_limit_7):"),
        call(2, command="cat pkg/helpers.py"),
        result(2, "def load_prices(path): return PRICE_TABLE_V2[path]"),
        call(3, command="grep -n PRICE_TABLE_V2 pkg/mod.py"),
        result(3, "12: PRICE_TABLE_V2 = {}"),
        call(4, command="sed -i 's/rate_limit_7/rate_limit_8/' pkg/mod.py"),
        result(4, "done"),
        {"role": "assistant", "content": "Fixed `compute_total` and `load_prices`."},
    ]
    assert cut_point(messages) == 6
    before, found = agent_probes(messages, ["def compute_total(items, rate_limit_7):"])
    assert before == messages[:6]
    # Used after the cut and held only by the history before it:
    assert "PRICE_TABLE_V2" not in found  # in the final message of the cut run: protected
    assert "rate_limit_7" in found
    assert "compute_total" in found
    assert "def compute_total(items, rate_limit_7):" in found
    assert "pkg/mod.py" not in found  # in the task (the last user message): protected
    assert "rate_limit_8" not in found  # only after the cut
