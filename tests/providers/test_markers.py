"""The marker forms: every one is found by the ref pattern; only "dropped" ones are stand-ins."""

from __future__ import annotations

from proxy.providers import base
from proxy.providers.markers import (
    REF_PATTERN,
    dropped_marker,
    is_stand_in,
    ref_marker,
    refs_in_text,
    short_marker,
)

REF = "c7f3a9d2e1"


def test_every_form_carries_its_ref() -> None:
    for marker in (ref_marker(REF, 3, 2104), short_marker(REF), dropped_marker(REF)):
        assert REF_PATTERN.findall(marker) == [REF]


def test_the_full_form_reads_as_documented() -> None:
    assert ref_marker(REF, 3, 2104) == f"[compactd:ref={REF} … 3 messages, 2,104 tokens summarized]"
    assert ref_marker(REF, 1, 5, "dropped") == f"[compactd:ref={REF} … 1 message, 5 tokens dropped]"


def test_only_dropped_markers_are_stand_ins() -> None:
    assert is_stand_in(dropped_marker(REF))
    assert is_stand_in(ref_marker(REF, 2, 90, "dropped") + "\nfacts: HAT170")
    assert not is_stand_in(short_marker(REF))
    assert not is_stand_in(ref_marker(REF, 1, 90, "summarized"))
    assert not is_stand_in(f"the flight was dropped [compactd:ref={REF}]")


def test_refs_are_listed_once_in_order() -> None:
    text = f"{short_marker('abcdef12')} {dropped_marker(REF)} {short_marker('abcdef12')}"
    assert refs_in_text(text) == ["abcdef12", REF]


def test_the_plugin_api_re_exports_the_one_definition() -> None:
    assert base.ref_marker is ref_marker
    assert base.REF_PATTERN is REF_PATTERN
    assert base.short_marker is short_marker
    assert base.dropped_marker is dropped_marker
