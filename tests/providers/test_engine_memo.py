"""The engine's per-compaction memos and shortcuts answer what the work they skip would have."""

from __future__ import annotations

from hypothesis import given

from proxy.providers.base import Message
from proxy.providers.engine_forms import (
    FACTS,
    MASKED,
    PROSE_WEIGHT,
    SUMMARY,
    Form,
    Forms,
    FormSettings,
    _has_ref,
    fact_text,
)
from proxy.providers.facts import analyze, candidates_of
from proxy.providers.units import message_text, split_units
from tests.providers.test_properties import SETTINGS, conversations
from tests.providers.tokens import count_message, make_config


def _forms(messages: list[Message]) -> Forms:
    settings = FormSettings(0.4, 0.4, 0.1, 1500)
    forms = Forms(messages, make_config(10_000), settings, {}, [count_message(m) for m in messages])
    forms.keys = [i / max(len(messages) - 1, 1) for i in range(len(messages))]
    return forms


def _written(forms: Forms, messages: list[Message]) -> list[Form]:
    """Every single-message form at every level, then the stub of every run of whole units."""
    found = [
        forms.single(i, level) for i in range(len(messages)) for level in (MASKED, SUMMARY, FACTS)
    ]
    units = split_units(messages)
    for first in range(len(units)):
        for last in range(first, len(units)):
            found.append(forms.stub(units[first].start, units[last].end))
    return [f for f in found if f is not None]


@SETTINGS
@given(messages=conversations())
def test_is_stub_says_whether_stub_wrote_the_form_without_writing_one(
    messages: list[Message],
) -> None:
    forms = _forms(messages)
    for form in _written(forms, messages):
        asked = forms.is_stub(form)  # before `stub` may write the span's stub
        assert asked == (forms.stub(form.start, form.end) is form)


def test_is_stub_is_false_for_a_span_no_stub_was_written_for() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "Please read /srv/app/config_42.yml. " * 40},
        {"role": "assistant", "content": "Done."},
    ]
    forms = _forms(messages)
    single = forms.single(0, FACTS)
    assert single is not None
    assert not forms.is_stub(single)
    assert forms.stub(0, 1) is not single


@SETTINGS
@given(messages=conversations())
def test_a_messages_rewritable_text_is_remembered_as_first_found(messages: list[Message]) -> None:
    forms = _forms(messages)
    for i, message in enumerate(messages):
        text = message_text(message)
        plain = bool(text) and not text.isspace() and not _has_ref(text)
        expected = text if plain else None
        assert forms._summarizable(i) == expected
        assert forms._summarizable(i) == expected  # asked again: the remembered answer


@SETTINGS
@given(messages=conversations())
def test_a_stubs_candidates_leave_out_what_the_kept_messages_say_as_an_uncached_filter_would(
    messages: list[Message],
) -> None:
    forms = _forms(messages)
    forms.shown = frozenset(range(0, len(messages), 3))
    known = "\n".join(fact_text(messages[i]) for i in sorted(forms.shown))
    for i in reversed(range(len(messages))):  # later messages first: their facts recur earlier
        everything = candidates_of(analyze(fact_text(messages[i])))
        assert forms._candidates(i) == [c for c in everything if c[1] not in known]


def test_a_fact_said_by_a_kept_message_is_left_out_of_every_message_that_repeats_it() -> None:
    path = "/srv/app/conf/cluster_7.yml"
    messages: list[Message] = [
        {"role": "system", "content": f"The deployment reads {path}."},
        {"role": "user", "content": f"Open {path} and /srv/app/conf/worker_3.yml please."},
        {"role": "assistant", "content": f"I opened {path}; port 8443 is set there."},
    ]
    forms = _forms(messages)
    forms.shown = frozenset({0})
    for i in (1, 2):
        facts = [f for _rank, f in forms._candidates(i)]
        assert path not in facts
    assert "/srv/app/conf/worker_3.yml" in [f for _rank, f in forms._candidates(1)]


def test_a_stub_gives_prose_more_room_than_a_tool_exchange_of_the_same_length() -> None:
    text = "We moved to Lisbon in 2021 and Ana started at Feedzai. " * 40
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    prose: list[Message] = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "ok"},
    ]
    agent: list[Message] = [
        {"role": "assistant", "content": text, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    told, ran = _forms(prose), _forms(agent)
    assert told.fact_chars_of(0, 1) == int(told.fact_chars(0) * PROSE_WEIGHT)
    assert ran.fact_chars_of(0, 1) == ran.fact_chars(0) >= len(text)
    assert told.stub_cap(0, 2) > ran.stub_cap(0, 2)
