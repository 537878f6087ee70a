"""The engine: keeps whole lines and sentences, newest and most specific first, and fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from hypothesis import given

from proxy.providers import pieces
from proxy.providers.base import REF_PATTERN, CompressionConfig, Message, OptionError
from proxy.providers.engine import EngineOptions, EngineProvider
from proxy.providers.rendering import GAP, kept_text
from proxy.providers.selection import Text
from proxy.providers.uncompress import uncompress
from proxy.providers.units import message_text
from proxy.providers.validate import check_result
from tests.providers.build import agent_run, assistant, system, tool, user, words
from tests.providers.test_properties import SETTINGS, cases, floor
from tests.providers.tokens import count_tokens, make_config

ENGINE = EngineProvider()


def compact(messages: list[Message], share: float) -> tuple[list[Message], CompressionConfig]:
    """The engine's result at `share` of the conversation's tokens, checked valid."""
    return compact_to(messages, int(count_tokens(messages) * share))


def compact_to(messages: list[Message], limit: int) -> tuple[list[Message], CompressionConfig]:
    """The engine's result within `limit` tokens, checked valid, within it and restorable."""
    config = make_config(limit)
    result = ENGINE.compress(messages, config)
    assert check_result(messages, result, config) == []
    assert count_tokens(result.messages) <= config.limit
    restored = uncompress(result.messages, result.verbatim, recursive=True).messages
    assert restored == messages
    return result.messages, config


def sent_text(messages: list[Message]) -> str:
    """Everything the model reads of the compacted messages."""
    return "\n".join(message_text(m) for m in messages)


def file_view(path: str, start: int, lines: int, marker: str = "") -> str:
    """A windowed file view as agents print it: a header and numbered lines."""
    body = [f"[File: {path} ({start + lines} lines total)]"]
    body += [
        f"{start + k}:    value_{start + k} = compute({start + k}){marker}" for k in range(lines)
    ]
    return "\n".join(body)


def test_pieces_tile_the_text_and_cut_long_lines_at_sentences_and_members() -> None:
    prose = "The first sentence is here. " * 20 + "\n"
    data = json.dumps([{"id": f"HAT{k:03d}", "price": k * 10} for k in range(30)])
    text = prose + data + "\nshort line\n"
    spans = pieces.split(text)
    assert "".join(text[s:e] for s, e in spans) == text
    assert all(e - s <= pieces.LONGEST for s, e in spans)
    cut = [text[s:e] for s, e in spans]
    assert any(p.startswith("The first sentence is here.") for p in cut)
    assert all(p.count('{"id"') <= p.count("}") + 1 for p in cut if '"id"' in p)


def test_a_script_inside_a_json_string_is_cut_at_its_escaped_line_breaks() -> None:
    script = "".join(f"value_{k} = compute({k}, scale=2.5)\n" for k in range(40))
    call = "bash " + json.dumps({"command": f"cat <<'EOF' > calc.py\n{script}EOF"})
    text = "Writing the script.\n" + call + "\n"
    spans = pieces.split(text)
    cut = [text[s:e] for s, e in spans]
    assert "".join(cut) == text
    # Each piece is a few whole lines of the script as the JSON string writes them.
    assert any(p == "value_7 = compute(7, scale=2.5)\\n" for p in cut)
    assert all(e - s <= 2 * pieces.LONG_LINE for s, e in spans)


def test_short_lines_fill_the_room_a_long_one_leaves() -> None:
    # The most specific line (28 ids) is too long for the room the floor leaves; the orders
    # after it in the ranking still fit, and are kept instead of leaving the room empty.
    long_line = " ".join(f"ID-{k:04d}" for k in range(28))
    history: list[Message] = [system()]
    for k in range(10):
        history.append(user(f"Order ZX-{k}471 ships to Lisbon. " + words(20, f"chat{k}")))
        history.append(assistant(words(60, f"reply{k}")))
    history += [user(long_line), assistant("Noted."), user("Where do the orders ship?")]
    config = make_config(160)
    result = ENGINE.compress(history, config)
    assert check_result(history, result, config) == []
    sent = sent_text(result.messages)
    assert long_line not in sent
    assert sum(f"Order ZX-{k}471 ships to Lisbon." in sent for k in range(10)) >= 2
    assert 0.75 * config.limit <= count_tokens(result.messages) <= config.limit


def test_an_agent_run_fits_and_the_newest_outputs_stay_whole() -> None:
    messages = agent_run(20, result_tokens=300)
    out, _ = compact(messages, 0.5)
    newest = [m for m in messages if m.get("role") == "tool"][-3:]
    for message in newest:
        assert message in out, "the working set is kept verbatim"


def test_a_specific_line_the_last_question_asks_about_is_kept_over_filler() -> None:
    history: list[Message] = [system()]
    for k in range(12):
        history.append(user(words(120, f"chat{k}")))
        history.append(assistant(words(120, f"reply{k}")))
    history.insert(3, user("My booking reference is ZX81-4471 for the Lisbon flight."))
    history.insert(4, assistant("Noted: booking ZX81-4471, Lisbon."))
    history.append(user("Which booking reference did I give you for Lisbon?"))
    out, _ = compact(history, 0.25)
    assert "My booking reference is ZX81-4471 for the Lisbon flight." in sent_text(out)


def test_when_what_must_stay_takes_most_of_the_target_the_working_set_leaves_room() -> None:
    # The last user message takes most of the target. The working set is a fifth of the room
    # left, not of the target (which was all the room: only the newest lines were kept, as
    # dropping the oldest messages would), so the specific line said first still fits.
    history: list[Message] = [
        system(),
        user("My booking reference is ZX81-4471 for the Lisbon flight."),
        assistant("Noted."),
    ]
    for k in range(8):
        history += [user(words(50, f"chat{k}")), assistant(words(50, f"reply{k}"))]
    history.append(user(f"The itinerary: {words(600, 'trip')} Which booking reference was it?"))
    out, _ = compact_to(history, 780)
    assert "My booking reference is ZX81-4471 for the Lisbon flight." in sent_text(out)


def test_a_working_set_is_never_more_than_its_share_of_the_room() -> None:
    # A short chat with little room: the message before the question is larger than a fifth of
    # the room, so it is no working set (it was: one piece straddling the share was taken whole)
    # and competes on value like the rest; the older figures the question asks about win.
    history: list[Message] = [
        system(),
        user("Launch week: 22K MAU, up from 15K."),
        assistant(words(30, "reply")),
        user("Reliability matters most to us now, and the budget for the next quarter is open."),
        user("How have our app metrics changed since the launch?"),
    ]
    out, _ = compact_to(history, 78)
    assert "Launch week: 22K MAU, up from 15K." in sent_text(out)


def test_what_the_final_output_repeats_takes_no_room_from_the_working_set() -> None:
    # The newest view ends with an error banner that the final output repeats word for word.
    # The working set skips the banner (the final output carries it) and holds the view's
    # last lines, which would otherwise lose to the older outputs' ids.
    banner = "\n".join(
        f"Note {k}: your edit was not applied; fix the command and try again." for k in range(12)
    )
    messages: list[Message] = [system(), user("Fix compute in src/calc.py.")]
    for k in range(6):
        ids = (f"ID-{k}{j:03d} ORD-{k}{j:03d}X REF-{j}{k:03d}" for j in range(40))
        messages += [assistant(None, f"c{k}"), tool(f"c{k}", "\n".join(ids))]
    messages += [
        assistant(None, "c6"),
        tool("c6", file_view("src/calc.py", 700, 30) + "\n" + banner),
    ]
    messages += [assistant(None, "c7"), tool("c7", banner)]
    out, _ = compact(messages, 0.1)
    sent = sent_text(out)
    for line in (726, 727, 728, 729):
        assert f"{line}:    value_{line} = compute({line})" in sent


def test_a_title_someone_gave_in_quotes_outlives_filler() -> None:
    # Nothing in the line is an id, a number or a capitalized name: only the quotes say that
    # "glass orchard" is a name someone gave, said once. It outlives newer plain filler.
    history: list[Message] = [system()]
    seeds = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heath", "inlet"]
    for seed in [*seeds, "juniper"]:
        history += [user(words(40, seed)), assistant(words(40, seed + "s"))]
    history.insert(11, user('we settled on a name: the working title is "glass orchard" for now.'))
    history.append(user("what did we call it?"))
    out, _ = compact(history, 0.1)
    assert 'the working title is "glass orchard" for now.' in sent_text(out)


def test_a_file_region_viewed_again_later_is_cut_where_it_was_seen_first() -> None:
    messages: list[Message] = [system(), user("Fix compute in src/calc.py.")]
    for k in range(6):
        messages.append(assistant(None, f"c{k}"))
        messages.append(tool(f"c{k}", file_view("src/calc.py", 100, 60)))
        messages.append(assistant(words(40, f"step{k}")))
    messages.append(user("Now change line 130."))
    out, _ = compact(messages, 0.25)
    assert messages[-3] in out, "the newest view stays whole"
    older = sent_text(out[: out.index(messages[-3])])
    assert older.count("130:    value_130 = compute(130)") <= 2, "older copies go first"
    for k in range(6):
        assert f"step{k}" in sent_text(out), "what was said once outlives what was repeated"


def test_kept_text_is_whole_lines_never_a_list_of_terms() -> None:
    messages = agent_run(12, result_tokens=400)
    for k, m in enumerate(messages):
        if m.get("role") == "tool":
            messages[k] = {**m, "content": file_view(f"src/mod_{k}.py", 1, 80)}
    originals = {line for m in messages for line in message_text(m).splitlines()}
    originals |= {
        f"{c['function']['name']} {c['function']['arguments']}"
        for m in messages
        for c in m.get("tool_calls") or ()
    }
    out, _ = compact(messages, 0.3)
    labels = ("tool: ", "user: ", "assistant: ")
    for m in out:
        if m in messages:
            continue
        for written in message_text(m).splitlines():
            line = written.split(": ", 1)[1] if written.startswith(labels) else written
            if REF_PATTERN.search(line) or line == GAP.strip() or not line.strip():
                continue
            assert line in originals or line.strip(" …") in originals, line
        assert "facts:" not in message_text(m)


def test_a_gap_between_kept_lines_costs_one_ellipsis() -> None:
    body = "".join(f"line {k}: nothing to see here at all\n" for k in range(12))
    spans = pieces.split(body)
    text = Text(0, body, spans, array("d", [10.0] * len(spans)), array("d"), bytearray(), 0.0)
    text.kept[:] = bytes(k in (0, 5, 6, 11) for k in range(len(spans)))
    kept = kept_text(text).splitlines()
    assert kept[0] == "line 0: nothing to see here at all"
    assert kept[1:4] == [
        GAP.strip(),
        "line 5: nothing to see here at all",
        "line 6: nothing to see here at all",
    ]
    assert kept[4:] == [GAP.strip(), "line 11: nothing to see here at all"]
    # Inside a line, the gap is an ellipsis between the kept sentences.
    prose = "The first sentence is long enough to stand alone here. " * 8
    spans = pieces.split(prose)
    text = Text(0, prose, spans, array("d", [10.0] * len(spans)), array("d"), bytearray(), 0.0)
    text.kept[0] = text.kept[-1] = True
    assert " … " in kept_text(text)
    assert "\n" not in kept_text(text)


def test_a_speakers_consecutive_lines_in_a_stand_in_share_one_label() -> None:
    # Notes a user left over several messages, in a row: the stand-in names the speaker once.
    history: list[Message] = [system()]
    history += [
        user(f"Note {k}: order ZX-{k}471 ships to Lisbon by the slow freight train.\n" + words(30))
        for k in range(12)
    ]
    history += [user("Which orders ship to Lisbon?")]
    out, _ = compact(history, 0.5)
    stand_in = next(m for m in out if REF_PATTERN.search(message_text(m)))
    lines = message_text(stand_in).splitlines()[1:]
    notes = [line for line in lines if "ships to Lisbon" in line]
    assert len(notes) >= 3
    assert [line for line in lines if line.startswith("user: ")] == notes[:1]


def test_an_id_what_stays_holds_gives_way_to_one_nobody_else_holds() -> None:
    # Room for one of two notes: the newer names the ticket the last question asks about (the
    # question carries that id), the older an invoice nothing else names. The invoice stays.
    history: list[Message] = [system()]
    history += [
        user("Invoice INV-2002 for the printer on floor two is still unpaid.\n" + words(40)),
        assistant(words(40, "reply")),
        user("Ticket TK-1001 for the printer on floor two is still open.\n" + words(40)),
        assistant(words(40, "answer")),
    ]
    for _ in range(3):
        history += [user(words(40, "chat")), assistant(words(40, "talk"))]
    history.append(user("What is the status of ticket TK-1001?"))
    sent = sent_text(compact(history, 0.16)[0])
    assert "Invoice INV-2002 for the printer on floor two is still unpaid." in sent
    assert "Ticket TK-1001 for the printer" not in sent


def test_a_feasible_request_whose_final_result_is_huge_fits_by_cutting_it_last() -> None:
    messages: list[Message] = [system(), user("Read the log.")]
    messages.append(assistant(None, "c0"))
    messages.append(tool("c0", words(3000, "log")))
    config = make_config(1200)
    result = ENGINE.compress(messages, config)
    assert check_result(messages, result, config) == []
    assert count_tokens(result.messages) <= config.budget
    assert result.messages[-1]["tool_call_id"] == "c0"


def test_the_result_uses_most_of_the_target() -> None:
    messages = agent_run(30, result_tokens=200)
    out, config = compact(messages, 0.5)
    assert count_tokens(out) >= 0.9 * config.limit


def test_unknown_options_are_rejected_at_start_up() -> None:
    ENGINE.check_options({"working_set": 0.3})
    with pytest.raises(OptionError, match="workingset"):
        ENGINE.check_options({"workingset": 0.3})
    with pytest.raises(OptionError, match="working_set"):
        ENGINE.check_options({"working_set": 0.0})
    assert EngineOptions().working_set == 0.2


@SETTINGS
@given(case=cases())
def test_the_engine_fits_every_case_that_can_fit(
    case: tuple[list[Message], CompressionConfig],
) -> None:
    msgs, config = case
    if floor(msgs, config) > config.limit:
        return
    result = ENGINE.compress(msgs, config)
    assert check_result(msgs, result, config) == []
    assert count_tokens(result.messages) <= config.limit


_SAME_BYTES_IN_ANY_WORKER = """
import hashlib, json
from proxy.providers.engine import EngineProvider
from tests.providers.build import agent_run, assistant, user, words
from tests.providers.tokens import count_tokens, make_config
messages = agent_run(16, result_tokens=300)
for k in range(6):
    messages.insert(2, user(f"Ship order ZX-{k}4471 to Lisbon via DHL, ref INV/{k}/2024. " + words(60)))
    messages.insert(3, assistant(f"Noted ZX-{k}4471 for Lisbon (INV/{k}/2024)."))
result = EngineProvider().compress(messages, make_config(count_tokens(messages) // 3))
print(hashlib.sha256(json.dumps(result.messages, sort_keys=True).encode()).hexdigest())
"""


def test_workers_with_different_hash_seeds_send_the_same_bytes() -> None:
    # Every worker must replay and re-compact alike: nothing a set's order (which the string
    # hash seed decides) may reach the result.
    digests = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SAME_BYTES_IN_ANY_WORKER],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests
