"""Stored values decode to what was written, and anything else is refused, not half-read."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import TenantMismatchError, UnreadableValueError
from proxy.store import codec
from proxy.store.base import Checkpoint

A = "aaaaaaaaaaaaaaaaaaaaaaaa"


def checkpoint(**extra: object) -> Checkpoint:
    fields: dict[str, object] = {
        "tenant": A,
        "conversation": "c1",
        "source_digest": "d" * 32,
        "covered_through": 2,
        "messages": [{"role": "user", "content": "[compactd:ref=abcdef0123 dropped]"}],
        "providers": ["trim"],
        "created_at": 1.5,
        **extra,
    }
    return Checkpoint(**fields)  # type: ignore[arg-type]


def test_a_checkpoint_keeps_its_structure_through_the_store() -> None:
    cp = checkpoint(ends=[3], parts=[["abcdef0123"]], tokens_before=9, tokens_after=4)
    assert codec.load_checkpoint(codec.dump_checkpoint(cp), A) == cp


def test_a_checkpoint_written_before_structure_was_recorded_loads_without_it() -> None:
    raw = orjson.loads(codec.dump_checkpoint(checkpoint()))
    del raw["e"], raw["r"]
    cp = codec.load_checkpoint(orjson.dumps(raw), A)
    assert (cp.ends, cp.parts) == ([], [])


@pytest.mark.parametrize(
    "change",
    [
        {"m": "not a list of messages"},
        {"m": ["not a message"]},
        {"k": "three"},
        {"e": [None]},
        {"p": None},
    ],
)
def test_a_malformed_checkpoint_is_unreadable(change: dict[str, object]) -> None:
    raw = {**orjson.loads(codec.dump_checkpoint(checkpoint())), **change}
    with pytest.raises(UnreadableValueError):
        codec.load_checkpoint(orjson.dumps(raw), A)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"'])
def test_bytes_that_are_not_an_object_are_unreadable(raw: bytes) -> None:
    with pytest.raises(UnreadableValueError):
        codec.load_checkpoint(raw, A)
    with pytest.raises(UnreadableValueError):
        codec.load_original(raw, A)
    with pytest.raises(UnreadableValueError):
        codec.load_ref(raw, A)


def test_an_original_or_ref_of_the_wrong_shape_is_unreadable() -> None:
    with pytest.raises(UnreadableValueError):
        codec.load_original(orjson.dumps({"t": A, "m": "text"}), A)
    with pytest.raises(UnreadableValueError):
        codec.load_ref(orjson.dumps({"t": A, "d": "abc"}), A)


def test_another_tenants_value_is_refused() -> None:
    with pytest.raises(TenantMismatchError):
        codec.load_checkpoint(codec.dump_checkpoint(checkpoint()), "b" * 24)
