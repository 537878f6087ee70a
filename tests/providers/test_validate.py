from __future__ import annotations

from proxy.providers.base import CompactionResult, Message, make_ref_id, ref_marker
from proxy.providers.markers import dropped_marker, short_marker
from proxy.providers.validate import align, check_result, pairing_problems
from tests.providers.build import assistant, system, tool, user, words
from tests.providers.tokens import count_message, make_config

CONFIG = make_config(limit=100_000)


def convo() -> list[Message]:
    return [
        system(),
        user(words(200)),
        assistant(None, "c1"),
        tool("c1", words(300)),
        assistant(words(150)),
        user("and now?"),
        assistant("here."),
    ]


def stub(m: Message) -> tuple[str, Message]:
    ref = make_ref_id([m])
    return ref, {**m, "content": ref_marker(ref, 1, count_message(m), "stubbed") + "\npreview"}


def result(
    messages: list[Message], verbatim: dict[str, list[Message]], covered: int
) -> CompactionResult:
    return CompactionResult(
        messages=messages, source_digest="x", covered_through=covered, verbatim=verbatim
    )


def test_a_correct_stub_and_drop_pass() -> None:
    msgs = convo()
    ref, new_tool = stub(msgs[3])
    drop = make_ref_id(msgs[1:2])
    placeholder = {"role": "user", "content": ref_marker(drop, 1, 200, "dropped")}
    out = [msgs[0], placeholder, msgs[2], new_tool, *msgs[4:]]
    assert check_result(msgs, result(out, {ref: [msgs[3]], drop: [msgs[1]]}, 3), CONFIG) == []


def test_unchanged_result_passes() -> None:
    msgs = convo()
    assert check_result(msgs, result(list(msgs), {}, -1), CONFIG) == []


def test_dropping_a_call_but_keeping_its_result_is_an_orphan() -> None:
    msgs = convo()
    ref = make_ref_id(msgs[2:3])
    out = [*msgs[:2], {"role": "assistant", "content": ref_marker(ref, 1, 9, "dropped")}, *msgs[3:]]
    problems = check_result(msgs, result(out, {ref: msgs[2:3]}, 2), CONFIG)
    assert any("answers no preceding tool call" in p for p in problems)


def test_dropping_a_result_but_keeping_its_call_is_reported() -> None:
    msgs = convo()
    ref = make_ref_id(msgs[3:4])
    out = [*msgs[:3], {"role": "user", "content": ref_marker(ref, 1, 300, "dropped")}, *msgs[4:]]
    problems = check_result(msgs, result(out, {ref: msgs[3:4]}, 3), CONFIG)
    assert "tool call 'c1' has no tool result" in problems


def test_a_clients_own_pairing_mistake_is_not_blamed_on_the_provider() -> None:
    msgs = [user("q"), tool("ghost", "stray"), user(words(100)), assistant("a"), user("z")]
    assert pairing_problems(msgs)
    ref = make_ref_id(msgs[2:4])
    out = [*msgs[:2], {"role": "user", "content": ref_marker(ref, 2, 120, "dropped")}, msgs[4]]
    assert check_result(msgs, result(out, {ref: msgs[2:4]}, 3), CONFIG) == []


def test_rewriting_a_system_message_is_reported_even_with_a_ref() -> None:
    msgs = [system(words(300)), *convo()[1:]]
    ref, new_sys = stub(msgs[0])
    out = [new_sys, *msgs[1:]]
    problems = check_result(msgs, result(out, {ref: [msgs[0]]}, 0), CONFIG)
    assert problems == ["protected message 0 (system) was rewritten or dropped"]


def test_rewriting_the_last_user_message_is_reported() -> None:
    msgs = [*convo()[:5], user(words(300)), assistant("ok")]
    ref, new_user = stub(msgs[5])
    out = [*msgs[:5], new_user, msgs[6]]
    problems = check_result(msgs, result(out, {ref: [msgs[5]]}, 5), CONFIG)
    assert problems == ["protected message 5 (user) was rewritten or dropped"]


def test_a_change_without_a_ref_is_reported() -> None:
    msgs = convo()
    out = [*msgs[:4], {**msgs[4], "content": "shorter"}, *msgs[5:]]
    problems = check_result(msgs, result(out, {}, 4), CONFIG)
    assert len(problems) == 1
    assert "neither input message 4 unchanged nor a replacement" in problems[0]


def test_verbatim_that_differs_from_the_input_is_reported() -> None:
    msgs = convo()
    ref, new = stub(msgs[4])
    out = [*msgs[:4], new, *msgs[5:]]
    forged = {**msgs[4], "content": "something else"}
    assert check_result(msgs, result(out, {ref: [forged]}, 4), CONFIG)


def test_a_message_that_grows_is_reported() -> None:
    msgs = [user("hi"), assistant("yo"), user("bye")]
    ref = make_ref_id(msgs[1:2])
    out = [msgs[0], {**msgs[1], "content": ref_marker(ref, 1, 2, "stubbed")}, msgs[2]]
    problems = check_result(msgs, result(out, {ref: msgs[1:2]}, 1), CONFIG)
    assert any("grew from" in p for p in problems)


def test_content_type_and_media_must_survive_a_rewrite() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    big = {"role": "user", "content": [{"type": "text", "text": words(400)}, image]}
    msgs = [big, assistant("seen"), user("ok")]
    ref = make_ref_id([big])
    marker = ref_marker(ref, 1, 400, "condensed") + " kept words"
    as_string = [{"role": "user", "content": marker}, *msgs[1:]]
    no_image = [{"role": "user", "content": [{"type": "text", "text": marker}]}, *msgs[1:]]
    assert any(
        "content-part list" in p
        for p in check_result(msgs, result(as_string, {ref: [big]}, 0), CONFIG)
    )
    assert any(
        "lost an image" in p for p in check_result(msgs, result(no_image, {ref: [big]}, 0), CONFIG)
    )


def test_changed_role_or_tool_call_id_is_reported() -> None:
    msgs = convo()
    ref, new_tool = stub(msgs[3])
    out = [*msgs[:3], {**new_tool, "tool_call_id": "c2"}, *msgs[4:]]
    problems = check_result(msgs, result(out, {ref: [msgs[3]]}, 3), CONFIG)
    assert "result message 3 changed its tool_call_id" in problems


def test_covered_through_must_leave_an_unchanged_suffix() -> None:
    msgs = convo()
    ref, new_tool = stub(msgs[3])
    out = [*msgs[:3], new_tool, *msgs[4:]]
    problems = check_result(msgs, result(out, {ref: [msgs[3]]}, 1), CONFIG)
    assert problems == ["the input after covered_through 1 is not an unchanged suffix"]


def test_over_budget_is_reported_unless_the_caller_checks_it_itself() -> None:
    msgs = convo()
    tight = make_config(limit=10, budget=10)
    assert check_result(msgs, result(list(msgs), {}, -1), tight)[0].startswith("result costs")
    assert check_result(msgs, result(list(msgs), {}, -1), tight, check_budget=False) == []


def test_nested_refs_from_a_chain_expand_to_the_original_input() -> None:
    msgs = convo()
    inner, new_tool = stub(msgs[3])
    step1 = [*msgs[:3], new_tool, *msgs[4:]]
    outer = make_ref_id(step1[1:5])
    out = [msgs[0], {"role": "user", "content": ref_marker(outer, 4, 700, "dropped")}, *msgs[5:]]
    verbatim = {inner: [msgs[3]], outer: step1[1:5]}
    assert check_result(msgs, result(out, verbatim, 4), CONFIG) == []


def test_a_summary_quoting_an_inner_marker_is_not_counted_twice() -> None:
    msgs = convo()
    inner, new_tool = stub(msgs[3])
    step1 = [*msgs[:3], new_tool, *msgs[4:]]
    outer = make_ref_id(step1[1:5])
    text = f"{ref_marker(outer, 4, 700)} summary mentions {new_tool['content']}"
    out = [msgs[0], {"role": "user", "content": text}, *msgs[5:]]
    verbatim = {inner: [msgs[3]], outer: step1[1:5]}
    assert check_result(msgs, result(out, verbatim, 4), CONFIG) == []


def test_a_message_that_stands_for_several_must_be_plain_user_or_assistant() -> None:
    msgs = convo()
    ref = make_ref_id(msgs[1:5])
    out = [msgs[0], {"role": "system", "content": ref_marker(ref, 4, 700, "dropped")}, *msgs[5:]]
    problems = check_result(msgs, result(out, {ref: msgs[1:5]}, 4), CONFIG)
    assert any("not a plain user/assistant" in p for p in problems)


def test_a_dropped_marker_stands_in_for_a_message_whatever_its_shape() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    big = {"role": "user", "content": [{"type": "text", "text": words(400)}, image]}
    msgs = [big, assistant("seen"), user("ok")]
    ref = make_ref_id([big])
    out = [{"role": "user", "content": ref_marker(ref, 1, 400, "dropped")}, *msgs[1:]]
    assert check_result(msgs, result(out, {ref: [big]}, 0), CONFIG) == []


def test_a_dropped_stand_in_must_itself_be_a_plain_user_or_assistant_message() -> None:
    msgs = [user("q"), tool("ghost", words(300)), user("z")]
    ref = make_ref_id(msgs[1:2])
    as_tool = {
        "role": "tool",
        "tool_call_id": "ghost",
        "content": ref_marker(ref, 1, 300, "dropped"),
    }
    as_user = {"role": "user", "content": ref_marker(ref, 1, 300, "dropped") + "\nfacts: x1"}
    problems = check_result(msgs, result([msgs[0], as_tool, msgs[2]], {ref: msgs[1:2]}, 1), CONFIG)
    assert any("not a plain user/assistant" in p for p in problems)
    assert (
        check_result(msgs, result([msgs[0], as_user, msgs[2]], {ref: msgs[1:2]}, 1), CONFIG) == []
    )


def test_align_says_which_input_messages_each_result_message_and_ref_stands_for() -> None:
    msgs = convo()
    inner, new_tool = stub(msgs[3])
    step1 = [*msgs[:3], new_tool, *msgs[4:]]
    outer = make_ref_id(step1[1:5])
    text = f"{ref_marker(outer, 4, 700)} summary mentions {new_tool['content']}"
    out = [msgs[0], {"role": "user", "content": text}, *msgs[5:]]
    found = align(msgs, out, {inner: [msgs[3]], outer: step1[1:5]})
    assert not isinstance(found, str)
    assert found.spans == [(0, 1), (1, 5), (5, 6), (6, 7)]
    assert found.refs == [(), (outer,), (), ()]
    assert found.ref_spans == {outer: (1, 5), inner: (3, 4)}


def test_align_names_the_first_message_that_stands_for_nothing() -> None:
    msgs = convo()
    found = align(msgs, [msgs[0], user("made up"), *msgs[2:]], {})
    assert isinstance(found, str)
    assert found.startswith("result message 1 ")


def test_a_final_tool_result_may_be_cut_in_place_but_never_folded_away() -> None:
    messages = [system(), user("go"), assistant(None, "c1"), tool("c1", "x " * 500)]
    ref = make_ref_id(messages[3:])
    cut = {**messages[3], "content": f"{short_marker(ref)}\nx x x"}
    ok = CompactionResult([*messages[:3], cut], "", 3, {ref: messages[3:]})
    assert check_result(messages, ok, make_config(10_000)) == []
    pair = make_ref_id(messages[2:])
    folded = {"role": "assistant", "content": dropped_marker(pair)}
    bad = CompactionResult([*messages[:2], folded], "", 3, {pair: messages[2:]})
    assert any("final tool result" in p for p in check_result(messages, bad, make_config(10_000)))
