from __future__ import annotations

import copy
import json
import re

import pytest

from proxy.providers.base import REF_PATTERN, Message, OptionError, parse_options
from proxy.providers.trim import TrimOptions, TrimProvider
from proxy.providers.uncompress import uncompress
from proxy.providers.units import message_text
from proxy.providers.validate import check_result
from proxy.text.prose import fact_tokens, facts, paths_in
from tests.providers.build import agent_run, assistant, developer, system, tool, user, words
from tests.providers.tokens import count_message, count_tokens, make_config


def trim(msgs: list[Message], limit: int, **kw: object) -> list[Message]:
    config = make_config(limit=limit, budget=max(limit, count_tokens(msgs)), **kw)  # type: ignore[arg-type]
    result = TrimProvider().compress(msgs, config)
    assert check_result(msgs, result, config) == []
    assert uncompress(result.messages, result.verbatim, recursive=True).messages == msgs
    return result.messages


def tool_session(n: int, size: int = 500) -> list[Message]:
    """n user turns, each one tool exchange and an answer."""
    out = [system()]
    for k in range(n):
        out += [
            user(f"step {k}"),
            assistant(None, f"c{k}"),
            tool(f"c{k}", f"HEAD{k} " + words(size) + f" TAIL{k}"),
            assistant(f"done {k}"),
        ]
    return [*out, user("what next?")]


def test_under_target_returns_the_input_unchanged() -> None:
    msgs = tool_session(2)
    result = TrimProvider().compress(msgs, make_config(limit=10**6))
    assert result.messages == msgs
    assert (result.covered_through, result.verbatim) == (-1, {})


def test_stale_tool_results_are_stubbed_oldest_first_with_a_preview() -> None:
    msgs = tool_session(8)
    out = trim(msgs, count_tokens(msgs) - 300)
    assert message_text(out[3]).startswith("[compactd:ref=")
    assert "stubbed]" in message_text(out[3])
    assert "HEAD0" in message_text(out[3])
    assert "TAIL0" in message_text(out[3])
    assert out[7] == msgs[7]  # the next one was not needed
    assert len(out) == len(msgs)


def test_error_output_is_not_stubbed_as_stale() -> None:
    msgs = tool_session(8)
    msgs[3] = tool("c0", "Traceback (most recent call last):\n" + words(500))
    out = trim(msgs, count_tokens(msgs) - 300)
    assert out[3] == msgs[3]
    assert "stubbed]" in message_text(out[7])


def test_output_whose_file_is_mentioned_later_is_not_stubbed_as_stale() -> None:
    msgs = tool_session(8)
    msgs[3] = tool("c0", "src/auth/session.py\n" + words(500))
    msgs[8] = user("look again at src/auth/session.py")
    out = trim(msgs, count_tokens(msgs) - 300)
    assert out[3] == msgs[3]
    assert "stubbed]" in message_text(out[7])


def test_old_reasoning_is_stripped_and_recent_reasoning_kept() -> None:
    think = "<think>" + words(300) + "</think>"
    msgs = [system()]
    for k in range(6):
        msgs += [user(f"q{k}"), assistant(f"{think}answer {k}", reasoning_content=words(200))]
    msgs.append(user("last"))
    out = trim(msgs, count_tokens(msgs) - 500, extra_config={"stale_min_tokens": 10**6})
    assert message_text(out[2]).endswith("answer 0")
    assert "reasoning stripped" in message_text(out[2])
    assert "reasoning_content" not in out[2]
    assert out[-2] == msgs[-2]


def test_largest_tool_results_are_truncated_first() -> None:
    msgs = [system(), user("go")]
    for k, size in enumerate([300, 2500, 900]):
        msgs += [assistant(None, f"c{k}"), tool(f"c{k}", words(size))]
    msgs += [assistant("summary"), user("thanks")]
    out = trim(
        msgs, count_tokens(msgs) - 1500, recency_turns=0, extra_config={"stale_min_tokens": 10**6}
    )
    assert "truncated]" in message_text(out[5])
    assert out[3] == msgs[3]
    assert out[7] == msgs[7]


def test_long_prose_is_condensed_keeping_code_paths_numbers_and_paragraphs() -> None:
    prose = " ".join(
        f"This is filler sentence {chr(97 + k % 26)} without facts." for k in range(60)
    )
    code = "```python\ndef handler(event):\n    return 42\n```"
    text = (
        f"{prose}\n\nThe fix lives in src/app/handler.py and returns 42 now.\n\n{code}\n\n{prose}"
    )
    msgs = [system(), user("explain"), assistant(text), user("and?"), assistant("ok"), user("bye")]
    out = trim(msgs, count_tokens(msgs) - 300, recency_turns=1)
    condensed = message_text(out[2])
    assert "condensed]" in condensed
    assert code in condensed
    assert "src/app/handler.py" in condensed
    assert "\n\n" in condensed
    assert count_message(out[2]) < count_message(msgs[2])


def test_oldest_units_are_dropped_as_one_placeholder_with_tool_pairs_whole() -> None:
    msgs = tool_session(6, size=150)
    out = trim(
        msgs,
        count_tokens(msgs) // 2,
        extra_config={"stale_min_tokens": 10**6, "preview_chars": 10**6},
    )
    assert out[0] == msgs[0]
    assert out[1]["role"] == "user"
    assert "dropped]" in message_text(out[1])
    assert sum(1 for m in out if "dropped]" in message_text(m)) == 1
    assert out[-1] == msgs[-1]


def test_an_agent_run_with_one_user_message_still_fits() -> None:
    msgs = agent_run(40)
    out = trim(msgs, count_tokens(msgs) // 10)
    assert count_tokens(out) <= count_tokens(msgs) // 10
    assert out[:2] == msgs[:2]
    assert out[-1] == msgs[-1]


def test_everything_that_can_fit_fits_even_with_a_huge_final_tool_exchange() -> None:
    msgs = [system(), user("go"), assistant(words(2000)), user("now read it")]
    msgs += [assistant(None, "a", "b"), tool("a", words(3000)), tool("b", words(100))]
    floor = count_tokens([msgs[0], msgs[3], msgs[4], msgs[6]])
    out = trim(msgs, floor + 150)
    assert count_tokens(out) <= floor + 150


def test_system_and_developer_messages_are_never_touched() -> None:
    msgs = [system(words(3000)), developer(words(1000)), user("hi"), assistant("hello"), user("q")]
    config = make_config(limit=200, budget=10**6)
    result = TrimProvider().compress(msgs, config)
    assert result.messages[:2] == msgs[:2]
    assert check_result(msgs, result, config) == []


def test_keep_head_is_never_dropped_or_rewritten() -> None:
    msgs = tool_session(6)
    out = trim(msgs, count_tokens(msgs) // 4, keep_head=3)
    assert out[:4] == msgs[:4]


def test_same_input_gives_the_same_bytes_and_the_input_is_not_mutated() -> None:
    msgs = tool_session(6)
    msgs[6] = assistant("<think>" + words(400) + "</think>ok")
    before = copy.deepcopy(msgs)
    config = make_config(limit=count_tokens(msgs) // 3)
    a = TrimProvider().compress(msgs, config)
    b = TrimProvider().compress(copy.deepcopy(msgs), config)
    assert json.dumps(a.messages, ensure_ascii=False) == json.dumps(b.messages, ensure_ascii=False)
    assert a.verbatim == b.verbatim
    assert msgs == before


def test_content_part_tool_results_stay_content_part_lists() -> None:
    msgs = tool_session(6)
    msgs[3] = {**msgs[3], "content": [{"type": "text", "text": words(800)}]}
    out = trim(msgs, count_tokens(msgs) - 500)
    assert isinstance(out[3]["content"], list)
    assert REF_PATTERN.search(out[3]["content"][0]["text"])


def test_options_are_validated() -> None:
    got = parse_options(TrimOptions, {"condense_roles": ["assistant", "user"]})
    assert got.condense_roles == ("assistant", "user")
    assert parse_options(TrimOptions, {"prose_keep_ratio": 1}).prose_keep_ratio == 1.0
    with pytest.raises(OptionError, match="stale_tokens: unknown option"):
        parse_options(TrimOptions, {"stale_tokens": 5})
    with pytest.raises(OptionError, match="preview_chars: must be an integer, not '400'"):
        parse_options(TrimOptions, {"preview_chars": "400"})
    with pytest.raises(OptionError, match=r"prose_keep_ratio: must be > 0, not 0\.0"):
        parse_options(TrimOptions, {"prose_keep_ratio": 0})


def test_a_placeholder_lists_the_ids_and_numbers_of_what_it_dropped() -> None:
    msgs = [system(), user("My user id is mia_li_3668 and I booked HAT136 on 2024-05-20.")]
    msgs += [
        assistant(words(300)),
        user(words(300)),
        assistant(words(300)),
        user("book it"),
        assistant("ok"),
    ]
    # Nothing to condense (filler prose would be condensed before anything is dropped).
    no_condense = {"prose_min_tokens": 10_000}
    out = trim(msgs, count_tokens(msgs) // 3, recency_turns=1, extra_config=no_condense)
    placeholder = message_text(out[1])
    assert "dropped]" in placeholder
    assert "mia_li_3668" in placeholder
    assert "HAT136" in placeholder


def test_a_cut_tool_result_lists_the_facts_of_its_cut_middle() -> None:
    record = json.dumps({"note": words(400), "reservation_id": "9MRJD4", "tail": words(400)})
    msgs = [
        system(),
        user("go"),
        assistant(None, "c"),
        tool("c", record),
        assistant("ok"),
        user("next"),
    ]
    out = trim(msgs, count_tokens(msgs) - 400, recency_turns=0)
    assert "truncated" in message_text(out[3]) or "stubbed" in message_text(out[3])
    assert "9MRJD4" in message_text(out[3])


def test_facts_prefer_names_then_the_latest_when_space_is_short() -> None:
    tokens = fact_tokens("order 12345 by user_1 then 67890 by user_2 at src/app.py")
    assert facts(tokens, 1000) == "12345, user_1, 67890, user_2, src/app.py"
    assert facts(tokens, 24) == "user_2, src/app.py"
    assert facts(tokens, 1000, exclude="user_1 12345") == "67890, user_2, src/app.py"
    assert facts(fact_tokens("paid $1,234.50."), 100) == "$1,234.50"


def test_paths_are_found_in_prose_and_json() -> None:
    text = 'edit src/app/main.py and ./a/b.txt; {"path": "lib/x.py"} not http://x.com/a/b'
    assert paths_in(text) == {"src/app/main.py", "./a/b.txt", "lib/x.py"}


def test_a_request_with_room_only_for_a_short_marker_still_fits() -> None:
    msgs = [system(), user(words(120)), assistant(words(120)), user("ok"), assistant(words(60))]
    msgs.append(user("and now?"))
    # The system message, the last user message and one `[compactd:ref=…]` message: no room
    # for the full marker (`… 4 messages, N tokens dropped]`), nor any fact list.
    floor = count_tokens([msgs[0], msgs[-1]])
    out = trim(msgs, floor + 20)
    assert count_tokens(out) <= floor + 20
    assert len(out) == 3
    assert out[0] == msgs[0]
    assert out[-1] == msgs[-1]
    assert out[1]["role"] == "user"
    assert re.fullmatch(r"\[compactd:ref=[0-9a-f]{10}\]", message_text(out[1]))


def test_a_single_message_dropped_with_a_short_marker_keeps_its_shape() -> None:
    first: Message = {"role": "user", "content": [{"type": "text", "text": words(200)}]}
    msgs = [system(), first, user("go on")]
    floor = count_tokens([msgs[0], msgs[2]])
    out = trim(msgs, floor + 20)
    assert count_tokens(out) <= floor + 20
    assert isinstance(out[1]["content"], list)
    assert message_text(out[1]).startswith("[compactd:ref=")
    assert "dropped" not in message_text(out[1])


def test_when_nothing_can_fit_the_fuller_placeholders_are_kept() -> None:
    msgs = [system(words(500)), user(words(120)), assistant(words(120)), user("and now?")]
    config = make_config(limit=100, budget=10**6)
    result = TrimProvider().compress(msgs, config)
    assert check_result(msgs, result, config) == []
    assert "2 messages, " in message_text(result.messages[1])
    assert "tokens dropped]" in message_text(result.messages[1])


def test_a_final_tool_result_is_cut_as_the_last_resort_so_a_feasible_request_fits() -> None:
    log = "\n".join(f"line {n}: read src/mod.py value {n * 7}" for n in range(2000))
    msgs = [system(), user("Fix the failing test in src/mod.py.")]
    msgs += [assistant("THOUGHT: look.", "c0"), tool("c0", words(500))]
    msgs += [assistant("THOUGHT: read it.", "c1"), tool("c1", log)]
    budget = count_tokens(msgs[:2]) + 300
    out = trim(msgs, budget)  # checks validity and that uncompress restores the input
    assert count_tokens(out) <= budget
    final = out[-1]
    assert final["role"] == "tool"
    assert final["tool_call_id"] == "c1"
    assert message_text(final).startswith("[compactd:ref=")  # cut, and stored by reference
    assert "line 0: read src/mod.py" in message_text(final)  # head kept


def test_a_placeholder_keeps_the_names_a_chat_it_dropped_was_about() -> None:
    msgs = [system(), user("We moved from Boston to San Diego last spring, near Balboa Park.")]
    msgs += [assistant(words(200)), user(words(200)), assistant(words(200))]
    msgs += [user("Where do we live now?")]
    no_condense = {"prose_min_tokens": 10_000}
    out = trim(msgs, count_tokens(msgs) // 3, recency_turns=1, extra_config=no_condense)
    placeholder = message_text(out[1])
    assert "dropped]" in placeholder
    assert "San Diego" in placeholder
    assert "Balboa Park" in placeholder


def test_long_user_prose_is_condensed_before_whole_turns_are_dropped() -> None:
    walk = "On a grey morning we walked to the harbour and talked for a long while about boats."
    story = " ".join([walk] * 15 + ["On day 7 we saw the whale."] + [walk] * 15)
    msgs = [system(), user(story), assistant("Lovely."), user("And then?"), assistant("Go on.")]
    msgs += [user("What did we do on day 7?")]
    out = trim(msgs, count_tokens(msgs) * 2 // 3, recency_turns=1)
    assert "condensed]" in message_text(out[1])
    assert "day 7" in message_text(out[1])
    assert not any("dropped]" in message_text(m) for m in out)


def test_a_final_tool_result_is_cut_to_its_marker_when_head_and_tail_would_not_fit() -> None:
    msgs = [system(), user("Fix the failing test in src/mod.py. " + words(300))]
    msgs += [assistant("THOUGHT: look around. " + words(200), "c0"), tool("c0", words(500))]
    msgs += [assistant("THOUGHT: read it. " + words(100), "c1"), tool("c1", words(400))]
    # What is left when everything that may go has gone: a short stub for the first exchange,
    # the final call's message and its result each with a short marker only.
    marker = "[compactd:ref=0123456789]"
    bare = [msgs[0], msgs[1], assistant(marker), {**msgs[4], "content": marker}]
    bare.append({**msgs[5], "content": marker})
    budget = count_tokens(bare) + 3  # room for no head or tail at all
    out = trim(msgs, budget)
    assert count_tokens(out) <= budget
    assert out[-1]["tool_call_id"] == "c1"
    assert re.fullmatch(r"\[compactd:ref=[0-9a-f]{10}\]", message_text(out[-1]))
    assert out[-2]["tool_calls"] == msgs[4]["tool_calls"]
