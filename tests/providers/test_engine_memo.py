"""The engine's per-compaction memos and shortcuts answer what the work they skip would have."""

from __future__ import annotations

from hypothesis import given

from proxy.providers.base import Message
from proxy.providers.engine_forms import FACTS, MASKED, SUMMARY, Form, Forms, FormSettings, _has_ref
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
