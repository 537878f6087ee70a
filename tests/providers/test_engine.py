"""The engine provider: fits the target, stays valid, keeps what matters, same bytes every time."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import cast

import pytest
from hypothesis import given

from proxy.providers import engine, engine_forms, engine_plan
from proxy.providers.base import REF_PATTERN, CompactionResult, CompressionConfig, Message
from proxy.providers.engine import EngineOptions, EngineProvider
from proxy.providers.engine_forms import Form, Forms, FormSettings
from proxy.providers.engine_plan import Plan
from proxy.providers.facts import fact_items
from proxy.providers.markers import is_stand_in
from proxy.providers.uncompress import uncompress
from proxy.providers.units import message_text
from proxy.providers.validate import check_result
from tests.providers.build import agent_run, assistant, developer, system, tool, user, words
from tests.providers.test_properties import SETTINGS, cases, floor
from tests.providers.tokens import count_message, count_tokens, make_config

CODE = "```python\ndef warm_cache(user_id):\n    return lookup(user_id)\n```"


def chat(turns: int) -> list[Message]:
    """System, developer, then user/assistant turns with prose, facts and code."""
    out = [system(), developer()]
    for k in range(turns):
        out.append(user(f"Turn {k}: please look at src/mod_{k}.py. " + words(120, f"u{k}")))
        out.append(
            assistant(
                f"Sure! The bug is in src/mod_{k}.py where handler_{k} reads KEY_{k}. "
                + words(200, f"a{k}")
                + f"\n\n{CODE}\n\nLet me know if you need anything else."
            )
        )
    out.append(user("Now run the tests please."))
    return out


def compress(messages: list[Message], limit: int, **extra: object) -> CompactionResult:
    result = EngineProvider().compress(messages, make_config(limit, extra_config=extra))
    assert isinstance(result, CompactionResult)
    return result


def test_a_request_under_target_comes_back_unchanged() -> None:
    messages = chat(3)
    result = compress(messages, count_tokens(messages) + 10)
    assert result.messages == messages
    assert result.covered_through == -1
    assert result.verbatim == {}


@pytest.mark.parametrize("fraction", [0.7, 0.5, 0.25, 0.1])
def test_result_fits_and_is_valid_whenever_the_protected_messages_fit(fraction: float) -> None:
    messages = chat(8)
    limit = int(count_tokens(messages) * fraction)
    result = compress(messages, limit)
    assert count_tokens(result.messages) <= limit
    assert check_result(messages, result, make_config(limit)) == []


def test_parallel_tool_results_keep_their_own_messages_and_ids() -> None:
    messages = [system(), user("Read three files.")]
    messages.append(assistant(None, "call_a", "call_b", "call_c"))
    for cid in ("call_a", "call_b", "call_c"):
        messages.append(tool(cid, words(300, cid)))
    messages += [assistant("Read them."), user("Summarize them."), assistant("ok")]
    limit = int(count_tokens(messages) * 0.5)
    result = compress(messages, limit)
    tool_ids = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert tool_ids == ["call_a", "call_b", "call_c"]
    assert check_result(messages, result, make_config(limit)) == []


def test_agent_runs_drop_whole_tool_exchanges_only() -> None:
    messages = agent_run(30)
    limit = int(count_tokens(messages) * 0.2)
    result = compress(messages, limit)
    assert count_tokens(result.messages) <= limit
    assert check_result(messages, result, make_config(limit)) == []


def test_system_and_developer_messages_are_never_touched() -> None:
    messages = chat(6)
    messages.insert(5, developer("Mid-conversation instruction. " + words(300)))
    result = compress(messages, int(count_tokens(messages) * 0.5))
    kept = [m for m in result.messages if m["role"] in ("system", "developer")]
    assert kept == [m for m in messages if m["role"] in ("system", "developer")]


def test_preserve_option_protects_more_roles() -> None:
    messages = chat(6)
    result = compress(messages, int(count_tokens(messages) * 0.6), preserve=["system", "user"])
    assert [m for m in result.messages if m["role"] == "user"] == [
        m for m in messages if m["role"] == "user"
    ]


def test_same_input_gives_the_same_bytes() -> None:
    messages = chat(8)
    limit = int(count_tokens(messages) * 0.4)
    first = json.dumps(compress(messages, limit).messages)
    assert all(json.dumps(compress(messages, limit).messages) == first for _ in range(3))


def test_every_replacement_names_its_originals_and_uncompress_restores_them() -> None:
    messages = chat(8)
    result = compress(messages, int(count_tokens(messages) * 0.3))
    text = "\n".join(message_text(m) for m in result.messages)
    assert set(result.verbatim) <= set(REF_PATTERN.findall(text))
    assert uncompress(result.messages, result.verbatim, recursive=True).messages == messages


def test_code_is_kept_verbatim_when_prose_is_summarized() -> None:
    messages = chat(8)
    result = compress(messages, int(count_tokens(messages) * 0.8))
    summarized = [m for m in result.messages if "summarized]" in message_text(m)]
    assert summarized
    assert any(CODE in message_text(m) for m in summarized)


def test_the_recency_window_stays_verbatim_when_older_turns_suffice() -> None:
    messages = chat(8)
    result = compress(messages, int(count_tokens(messages) * 0.85))
    assert result.messages[-5:] == messages[-5:]


def test_content_part_lists_stay_lists_and_keep_their_images() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = chat(6)
    messages[2] = {"role": "user", "content": [{"type": "text", "text": words(400)}, image]}
    limit = count_tokens(messages) - 150  # the oldest message (the one with the image) summarized
    result = compress(messages, limit)
    rewritten = result.messages[2]
    assert rewritten != messages[2]
    assert isinstance(rewritten["content"], list)
    assert image in rewritten["content"]
    assert check_result(messages, result, make_config(limit)) == []


def test_an_exact_duplicate_points_at_its_later_copy() -> None:
    log = "\n".join(f"line {k}: value_{k} = {k * 7}" for k in range(40))
    messages = [system(), user(log), assistant("Noted."), user(log), assistant("Same again.")]
    messages += [user("What changed?")]
    result = compress(messages, count_tokens(messages) - 200)
    assert message_text(result.messages[1]).count("Same text as a later user message") == 1
    assert result.messages[3] == messages[3]


def test_fuzzy_duplicates_list_the_lines_only_the_older_copy_has() -> None:
    old = "\n".join(f"row {k}: status ok" for k in range(30)) + "\nrow 99: FAILED"
    new = "\n".join(f"row {k}: status ok" for k in range(30)) + "\nrow 42: passed"
    messages = [system(), user(old), assistant("Seen."), user(new), assistant("Seen.")]
    messages += [user("Any failures left?")]
    result = compress(messages, count_tokens(messages) - 100, fuzzy_dedup=True)
    text = message_text(result.messages[1])
    assert "the same lines as a later user message" in text
    assert "row 99: FAILED" in text


def test_no_rewritten_message_costs_more_than_its_original() -> None:
    messages = chat(8)
    limit = int(count_tokens(messages) * 0.3)
    result = compress(messages, limit)
    assert not [p for p in check_result(messages, result, make_config(limit)) if "grew" in p]


def test_consecutive_user_messages_merge_only_with_the_same_name() -> None:
    messages = [system()]
    for k in range(4):
        messages.append(user(f"Note {k} about src/n{k}.py. " + words(150, f"n{k}")))
    messages.append({"role": "user", "name": "console", "content": "$ make\n" + words(150)})
    messages += [assistant("ok"), user("go on"), assistant("done")]
    limit = int(count_tokens(messages) * 0.5)
    result = compress(messages, limit)
    merged = [m for m in result.messages if " messages, " in message_text(m)]
    assert len(merged) == 1
    assert "name" not in merged[0]
    assert [m["name"] for m in result.messages if "name" in m] == ["console"]
    assert check_result(messages, result, make_config(limit)) == []


def test_forced_convergence_leaves_short_markers_to_fit() -> None:
    messages = agent_run(12, result_tokens=300)
    protected = count_tokens([messages[0], messages[1], messages[-1]])
    limit = protected + 40
    result = compress(messages, limit)
    assert count_tokens(result.messages) <= limit
    assert any(message_text(m).startswith("[compactd:ref=") for m in result.messages)


def test_unknown_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="fuzzy_treshold"):
        EngineOptions.from_extra({"fuzzy_treshold": 0.5})


@SETTINGS
@given(case=cases())
def test_engine_fits_every_generated_case_that_can_fit(
    case: tuple[list[Message], CompressionConfig],
) -> None:
    msgs, config = case
    if floor(msgs, config) > config.limit:
        return
    result = EngineProvider().compress(msgs, config)
    assert isinstance(result, CompactionResult)
    assert config.count_tokens(result.messages) <= config.limit


def test_a_forced_stub_for_an_orphan_tool_result_is_a_valid_stand_in() -> None:
    # Regression: the forced stub of a lone orphan `tool` message was an assistant message with
    # the short marker, which the validator reads as a rewrite that changed its role.
    messages = [user("hi"), tool("ghost", words(300, "r")), user("ok")]
    config = make_config(35, keep_head=1, recency_turns=0)
    result = EngineProvider().compress(messages, config)
    assert isinstance(result, CompactionResult)
    assert check_result(messages, result, config, check_budget=False) == []
    assert result.messages[1]["role"] == "assistant"
    assert is_stand_in(message_text(result.messages[1]))
    assert uncompress(result.messages, result.verbatim).messages == messages


def _log(k: int, lines: int = 120) -> str:
    return "\n".join(f"line {n}: step {k} read src/mod_{k}.py value {n * k}" for n in range(lines))


def _agent(steps: int) -> list[Message]:
    out = [system(), user("Fix the failing test in src/mod_0.py.")]
    for k in range(steps):
        out.append(assistant(f"THOUGHT: look at step {k}.", f"c{k}"))
        out.append(tool(f"c{k}", _log(k)))
    return out


def test_stale_tool_outputs_are_masked_first_keeping_head_and_tail() -> None:
    messages = _agent(8)
    total = count_tokens(messages)
    result = compress(messages, int(total * 0.8))
    assert check_result(messages, result, make_config(int(total * 0.8))) == []
    cut = ("tokens masked]", "tokens truncated]")
    masked = [m for m in result.messages if any(v in message_text(m) for v in cut)]
    assert masked, "the cheapest loss is masking stale tool outputs"
    first = message_text(masked[0])
    step = first.split("line 0: step ", 1)[1].split()[0]  # the head survives
    assert f"line 119: step {step}" in first  # and the tail
    # The output of the file the task names is relevant to it: it is masked last.
    assert step != "0"
    # The agent's own steps stay verbatim while tool outputs are masked.
    assert all(m in result.messages for m in messages if m["role"] == "assistant")


def test_a_final_tool_result_is_cut_as_the_last_resort_so_a_feasible_request_fits() -> None:
    messages = [*_agent(2)[:-1], tool("c1", _log(1, lines=2000))]
    floor_without_final = count_tokens(messages[:-1])
    budget = floor_without_final + 400
    result = compress(messages, budget)
    config = make_config(budget)
    assert count_tokens(result.messages) <= budget
    assert check_result(messages, result, config) == []
    final = result.messages[-1]
    assert final["role"] == "tool"
    assert final["tool_call_id"] == "c1"
    assert "line 0: step 1" in message_text(final)
    assert uncompress(result.messages, result.verbatim).messages == messages


def test_the_final_tool_result_is_cut_when_the_final_call_it_answers_does_not_leave_room() -> None:
    # The protected messages and the final tool result alone fit, so the floor says the result
    # may stay whole; but the final assistant message keeps its tool call (a long patch), and
    # with it the request only fits once the result is cut. (Found on swe-agent runs in the
    # Responses shape, where the final message also keeps its reasoning items.)
    messages = _agent(3)
    call = assistant("THOUGHT: apply the patch.", "c9")
    call["tool_calls"][0]["function"]["arguments"] = json.dumps({"patch": _log(9, lines=25)})
    messages += [call, tool("c9", _log(9, lines=50))]
    budget = count_tokens([messages[0], messages[1], messages[-1]]) + 50
    assert count_tokens([*messages[:2], *messages[-2:]]) > budget
    result = compress(messages, budget)
    assert count_tokens(result.messages) <= budget
    assert check_result(messages, result, make_config(budget)) == []
    assert result.messages[-2]["tool_calls"] == call["tool_calls"]
    final = result.messages[-1]
    assert final["tool_call_id"] == "c9"
    assert REF_PATTERN.search(message_text(final)), "cut in place, with its reference"
    assert uncompress(result.messages, result.verbatim).messages == messages


def test_final_tool_results_stay_whole_when_the_rest_can_give_enough() -> None:
    messages = _agent(6)
    total = count_tokens(messages)
    result = compress(messages, int(total * 0.5))
    assert result.messages[-1] == messages[-1]


def test_an_unreachable_target_goes_as_far_as_facts_allow_not_just_under_the_budget() -> None:
    # The system message alone is over the target: a result just under the budget would be
    # over it again a turn later (a compaction event, and the prompt cache broken, each turn).
    messages = [system(words(600)), *chat(6)[2:]]
    budget = count_tokens(messages) * 3 // 4
    limit = count_tokens(messages[:1]) // 2
    config = make_config(limit, budget=budget)
    result = EngineProvider().compress(messages, config)
    assert isinstance(result, CompactionResult)
    assert check_result(messages, result, config) == []
    least_lossy = compress(messages, budget)  # the least lossy rung under the budget
    assert count_tokens(result.messages) < count_tokens(least_lossy.messages) - 200
    assert not any("forced" in limitation for limitation in result.limitations)


def test_one_large_answer_is_cut_to_the_room_left_not_reduced_to_its_facts() -> None:
    # A long answer that is all code has no summary smaller than itself: its next rung is its
    # fact list, far under the target. Cut head and tail to the room, its facts listed.
    code = "\n".join(
        f"def handler_{k}(request):\n    return lookup(request, 'user_{k}')" for k in range(400)
    )
    messages = [
        system(),
        user("Translate src/app.py to French."),
        assistant(f"```python\n{code}\n```"),
    ]
    messages.append(user("Thanks. Now the tests?"))
    limit = count_tokens(messages) // 2
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    assert 0.9 * limit <= count_tokens(result.messages) <= limit
    answer = message_text(result.messages[2])
    assert "def handler_0(request):" in answer  # its head, verbatim
    assert "handler_399" in answer  # its tail
    assert uncompress(result.messages, result.verbatim).messages == messages


def test_a_stub_that_frees_far_more_than_needed_lists_more_facts_to_use_the_room() -> None:
    # The old request (60 paths) becomes a stub listing a tenth of its text, and the answer's
    # summary frees far more than the target needs: the stub lists facts up to the room.
    messages = [
        user("Loaded " + " ".join(f"/srv/app/conf/part_{k}.yml" for k in range(60))),
        assistant("Noted /srv/app/conf/main.yml. " + words(600, "note")),
        user("/exit"),
    ]
    limit = count_tokens(messages) * 3 // 10
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    stub = message_text(result.messages[0])
    assert "1 message" in stub
    assert "dropped" in stub
    assert 0.85 * limit <= count_tokens(result.messages) <= limit
    assert stub.count("part_") >= 15  # a tenth of its text holds 5
    assert uncompress(result.messages, result.verbatim).messages == messages


# Reduced to its facts the old request still misses the target; its stub (a tenth of its text:
# 11 paths of 120) would leave most of the target unused, so it lists paths up to the room. A
# short request (30 paths, a 145-token target) fills its room too, though its spare tokens are
# fewer than a long request's threshold.
@pytest.mark.parametrize(("paths", "listed"), [(120, 36), (30, 6)])
def test_a_unit_dropped_as_the_last_step_gets_a_stub_sized_to_the_room(
    paths: int, listed: int
) -> None:
    messages = [
        user("Loaded " + " ".join(f"/srv/app/conf/part_{k}.yml" for k in range(paths))),
        assistant("Noted."),
        user("/exit"),
    ]
    limit = count_tokens(messages) // 2
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    stub = message_text(result.messages[0])
    assert "dropped" in stub
    assert 0.8 * limit <= count_tokens(result.messages) <= limit
    assert stub.count("part_") >= listed
    assert uncompress(result.messages, result.verbatim).messages == messages


def test_a_long_request_fills_spare_tokens_however_small_a_share_of_its_target() -> None:
    # Ten requests of 40 paths each at half their tokens: the rung that fits leaves about 70 of
    # 2,200 tokens unused (3 %, under the twentieth a fill once needed); its stub lists paths in
    # them, up to a few tokens of the target.
    messages: list[Message] = []
    for k in range(10):
        messages.append(
            user("Loaded " + " ".join(f"/srv/app{k}/conf/part_{j}.yml" for j in range(40)))
        )
        messages.append(assistant("Noted. " + words(30, "reply")))
    messages.append(user("/exit"))
    limit = count_tokens(messages) // 2
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    assert limit - 4 * engine.FILL_MIN < count_tokens(result.messages) <= limit
    assert sum(message_text(m).count("part_") for m in result.messages) >= 190
    assert uncompress(result.messages, result.verbatim).messages == messages


def test_a_message_cut_to_fill_the_room_keeps_every_fact_its_fact_list_had() -> None:
    # Half of the room would list fewer paths than the message's fact list does: the cut that
    # fills the room lists them all, then gives what is left to head and tail.
    text = "\n".join(f"Then I wrote /srv/app/conf/part_{k}.yml as planned." for k in range(200))
    messages = [assistant(text)]
    settings = FormSettings(0.4, 0.4, 0.1, 1500)
    forms = Forms(messages, make_config(10_000), settings, {}, [count_message(messages[0])])
    facts = forms.facts_draft(0).body.removeprefix("facts: ").split(", ")
    assert len(facts) > 20
    cut = forms.fill_draft(0, 2400)
    assert cut is not None
    assert all(fact in cut.body for fact in facts)
    assert text.splitlines()[0] in cut.body  # the head, verbatim


def test_forced_markers_list_facts_up_to_the_room_not_just_the_next_smaller_cap() -> None:
    # A long personal chat with a small target: forced markers with 200 characters of facts
    # each miss it, with 100 they leave a quarter of it unused; a cap in between fills it.
    names = [
        "Alice",
        "Bruno",
        "Carmen",
        "Dmitri",
        "Elena",
        "Farid",
        "Greta",
        "Hiro",
        "Ingrid",
        "Jomo",
        "Kasia",
        "Lionel",
    ]
    cities = [
        "Lisbon",
        "Osaka",
        "Nairobi",
        "Quito",
        "Tbilisi",
        "Hanoi",
        "Oslo",
        "Lima",
        "Accra",
        "Perth",
        "Riga",
        "Cusco",
    ]
    messages = [system()]
    for k in range(36):
        name = f"{names[k % 12]} {names[k // 12].lower()}ski"
        city = f"{cities[k % 12]} {cities[(k // 12 + 5) % 12]}"
        messages.append(
            user(
                f"Then my friend {name} moved to {city} and met {names[(k - 1) % 12]}son at "
                f"the {cities[(k - 2) % 12]} Museum."
            )
        )
        messages.append(assistant(f"So {name} lives in {city} now, near {names[k % 7]}berg Hall."))
    messages.append(user("Which town did my friend move to first?"))
    limit = count_tokens(messages) * 8 // 100
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    assert any("forced" in limitation for limitation in result.limitations)
    assert 0.9 * limit <= count_tokens(result.messages) <= limit
    assert uncompress(result.messages, result.verbatim).messages == messages


class _CapPlan:
    """A stand-in plan whose top rung costs 910 tokens plus one per character of fact cap."""

    steps = (None, None)

    def build(
        self, rung: int, cap: int, collect: bool = True
    ) -> tuple[list[Message], list[Form], int]:
        return [], [], 910 + cap


def test_a_forced_cap_is_refined_when_the_room_left_is_small_beside_the_target() -> None:
    # The cap that fits (50) leaves 40 of 1,000 tokens unused: under a twentieth of the target,
    # but room for facts; the largest cap that still fits (90) is found between it and 200.
    config = CompressionConfig(
        limit=1000, budget=1000, count_tokens=lambda ms: 960, count_message=count_message
    )
    plan = cast(Plan, _CapPlan())
    assert 80 <= engine._finer_cap(plan, 50, 200, [], config) <= 90
    # Fewer spare tokens than FILL_MIN: nothing worth refining.
    tight = replace(config, count_tokens=lambda ms: 1000 - engine.FILL_MIN + 1)
    assert engine._finer_cap(plan, 50, 200, [], tight) == 50


def test_the_estimates_write_one_stub_to_calibrate_however_many_units_they_drop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each stub written costs the fact scan of what it reads; the early ones the climb passes
    # say little about the stubs near the answer, which the search's probes price exactly.
    climbing: list[bool] = [False]
    written: list[tuple[int, int]] = []
    drop, stub_form = engine_plan.Estimates._drop, Forms._stub_form

    def counted_drop(self: engine_plan.Estimates, u: int) -> tuple[int, int]:
        climbing[0] = True
        try:
            return drop(self, u)
        finally:
            climbing[0] = False

    def counted_stub(
        self: Forms, start: int, end: int, cap: int, marked: bool, filled: bool = False
    ) -> object:
        if climbing[0]:
            written.append((start, end))
        return stub_form(self, start, end, cap, marked, filled)

    monkeypatch.setattr(engine_plan.Estimates, "_drop", counted_drop)
    monkeypatch.setattr(Forms, "_stub_form", counted_stub)
    messages = chat(30)
    result = compress(messages, count_tokens(messages) // 5)
    assert any(is_stand_in(message_text(m)) for m in result.messages)  # units were dropped
    assert len(written) == 1


def test_a_stub_does_not_list_what_the_messages_kept_as_they_are_say() -> None:
    # The system prompt names Lisbon and the last user message Porto: the request says them
    # anyway, so the stub of the old turns spends its room on what only they hold.
    messages = [system("The user, Ana, lives in Lisbon.")]
    for k in range(6):
        messages.append(user(f"we met Rui_{k} in Lisbon and Porto, " + words(80, f"w{k}")))
        messages.append(assistant(f"Noted Rui_{k} in Lisbon. " + words(80, f"a{k}")))
    messages.append(user("What about Porto, again?"))
    limit = count_tokens(messages) // 4
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    stubs = [message_text(m) for m in result.messages if "dropped" in message_text(m)]
    assert stubs
    assert all("Lisbon" not in s and "Porto" not in s for s in stubs)
    assert any("Rui_" in s for s in stubs)


def test_escaped_line_breaks_of_tool_call_arguments_make_no_facts() -> None:
    # `{"command": "echo done\nWait, check utils.py"}`: the fact scan reads the line break, not
    # a fact `nWait`; an escaped backslash leaves the arguments as they are.
    message = assistant(None, "c1")
    message["tool_calls"][0]["function"]["arguments"] = json.dumps(
        {"command": 'echo done\nWait, "check" utils.py'}
    )
    text = engine_forms.fact_text(message)
    assert '"command": "echo done\nWait, "check" utils.py"' in text
    facts = fact_items(text)
    assert "utils.py" in facts
    assert not any(f.startswith("nWait") for f in facts)
    message["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": "a\\nb"})
    assert engine_forms.fact_text(message).endswith('{"command": "a\\\\nb"}')


def test_a_stub_lists_the_content_words_that_start_sentences_after_its_facts() -> None:
    # `Roguelike` starts a sentence, so no name rule finds it; `The` and `Now` start most.
    messages = [system()]
    kinds = ["Roguelike", "Platformer", "Soulslike", "Metroidvania", "Deckbuilder", "Shmup"]
    for k, kind in enumerate(kinds):
        messages.append(user(f"{kind} games. The end. Now " + words(60, kind.lower())))
        messages.append(assistant("Sure. " + words(60, f"a{k}")))
    messages.append(user("What kind of game was it?"))
    limit = count_tokens(messages) // 3
    result = compress(messages, limit)
    assert check_result(messages, result, make_config(limit)) == []
    stubs = [message_text(m) for m in result.messages if "dropped" in message_text(m)]
    assert sum(kind in s for s in stubs for kind in kinds) >= 2
    assert not any(", The" in s or ", Now" in s or ", Sure" in s for s in stubs)


def test_a_coding_chats_stub_lists_its_newest_messages_facts_first_a_narratives_its_first() -> None:
    # Each message names its own file; a room for a few of them keeps the newest files of a
    # chat with code fences (where the work is now) and the first ones of a chat without.
    def chat_about(fenced: bool) -> list[Message]:
        out: list[Message] = []
        for k in range(8):
            code = f"\n```python\nx = {k}\n```" if fenced else ""
            out.append(user(f"Please edit src/module_{k}.py now." + code + " " + words(20, "w")))
        out.append(user("What next?"))
        return out

    settings = FormSettings(0.4, 0.4, 0.1, 1500)
    for fenced in (True, False):
        messages = chat_about(fenced)
        costs = [count_message(m) for m in messages]
        forms = Forms(messages, make_config(10_000), settings, {}, costs)
        stub = forms.stub_sized(0, len(messages) - 1, 60)
        assert stub is not None
        listed = [f"src/module_{k}.py" in stub.body for k in range(8)]
        assert 0 < sum(listed) < 8, stub.body
        assert listed[-1] is fenced, stub.body
        assert listed[0] is not fenced, stub.body


def test_a_stub_lists_the_lead_words_the_conversation_says_again_before_those_said_once() -> None:
    # Each message opens with a word said once (a greeting, an exclamation) and later says a
    # word that the conversation also writes in lower case: in a share that holds a few of
    # them, the words said again come first, whatever their place.
    once = ["Welcome", "Absolutely", "Congratulations", "Splendid", "Fabulous", "Marvellous"]
    again = ["Team", "Playtesters", "Roguelike"]
    messages = [user(f"{w} there. " + words(30, "filler")) for w in once]
    messages += [user(f"{w} matter here. " + words(30, "filler")) for w in again]
    messages.append(user("How big is the team, and what do the playtesters say of the roguelike?"))
    settings = FormSettings(0.4, 0.4, 0.1, 1500)
    costs = [count_message(m) for m in messages]
    forms = Forms(messages, make_config(10_000), settings, {}, costs)
    # Room for a few lead words only (they get half the room of a filled stub).
    stub = forms.stub_sized(0, len(messages) - 1, 60)
    assert stub is not None
    listed = stub.body.removeprefix("facts: ").split(", ")
    assert set(again) <= set(listed), stub.body
    assert len(set(listed) & set(once)) < len(once), stub.body


def test_lead_words_are_searched_in_a_bounded_share_of_a_huge_historys_prose() -> None:
    # A multi-megabyte history is not lowered and searched whole for each lead word (one call
    # over it held the event loop for ~20 ms): only its latest prose, up to PROSE_SEARCH.
    line = "Team notes. " + words(40, "w") + "\n"
    messages = [user(line * 400) for _ in range(30)]
    settings = FormSettings(0.4, 0.4, 0.1, 1500)
    costs = [count_message(m) for m in messages]
    forms = Forms(messages, make_config(10_000), settings, {}, costs)
    assert sum(len(message_text(m)) for m in messages) > 2 * engine_forms.PROSE_SEARCH
    stub = forms.stub_sized(0, len(messages) - 1, 400)
    assert stub is not None
    assert "Team" in stub.body
    assert len(forms._prose_lowered()) <= engine_forms.PROSE_SEARCH + len(messages)
