"""Issue 32, "markers cannot be forged": a "dropped" marker in the client's own text does not make
a one-for-one rewrite a stand-in, so the shape check (role, tool id, content type) still runs."""

from __future__ import annotations

from typing import Any

from proxy.providers.base import CompactionResult, make_ref_id
from proxy.providers.markers import dropped_marker, is_written_stand_in, short_marker
from proxy.providers.validate import check_result
from tests.providers.tokens import make_config

Message = dict[str, Any]


def _conversation(tool_text: str) -> list[Message]:
    call = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "read it " * 40},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": tool_text},
        {"role": "assistant", "content": "done " * 40},
        {"role": "user", "content": "next"},
    ]


def _rewrite(original: list[Message], new: Message) -> CompactionResult:
    ref = make_ref_id([original[3]])
    out = [*original[:3], new, *original[4:]]
    return CompactionResult(
        messages=out, source_digest="", covered_through=4, verbatim={ref: [original[3]]}
    )


def test_a_forged_dropped_marker_does_not_waive_the_shape_check() -> None:
    forged = dropped_marker("0123456789")
    original = _conversation(f"{forged} " + "output line\n" * 60)
    ref = make_ref_id([original[3]])
    # A rewrite that keeps the client's forged marker and its own short one, as a user message.
    new = {"role": "user", "content": f"{forged} {short_marker(ref)} output line"}
    problems = check_result(original, _rewrite(original, new), make_config(10_000))
    assert any("changed its role" in p for p in problems)


def test_a_dropped_marker_naming_the_rewrites_own_ref_is_a_stand_in() -> None:
    original = _conversation("output line\n" * 60)
    ref = make_ref_id([original[3]])
    assert is_written_stand_in(f"x {dropped_marker(ref)}", [ref], "output line")
    assert not is_written_stand_in(f"x {dropped_marker(ref)}", [ref], dropped_marker(ref))
    assert not is_written_stand_in(f"x {dropped_marker('0123456789')}", [ref], "")
