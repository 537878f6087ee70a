"""The fast digests are the plugin API's digests, byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.providers import canonical
from proxy.providers.base import canonical_json, compute_source_digest, make_ref_id
from proxy.providers.canonical import canonical_bytes, ref_id, source_digest

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text()
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(_JSON)
def test_canonical_bytes_equal_the_standard_library_encoding(value: Any) -> None:
    assert canonical_bytes(value) == canonical_json(value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["role", "content", "name", "x"]), _JSON)))
def test_source_digest_and_ref_id_equal_the_plugin_api(messages: list[dict[str, Any]]) -> None:
    assert source_digest(messages) == compute_source_digest(messages)
    assert ref_id(messages) == make_ref_id(messages)


def test_every_code_point_and_64_bit_edge_is_written_the_same() -> None:
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    value = {
        "z": text,
        "a": [2**63 - 1, -(2**63), 2**64 - 1, 2**64, True, None],
        "é": {"\U0001d538": 1},
    }
    assert (
        canonical_bytes(value)
        == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )


def test_floats_and_big_integers_go_to_the_standard_library() -> None:
    # orjson writes 1e16 where json writes 1e+16, and refuses integers beyond 64 bits.
    for value in ({"x": 1e16}, {"x": [1e-7]}, {"x": 2**80}, {1: "non-string key"}):
        assert canonical_bytes(value) == canonical_json(value)


class _Text(str):
    pass


class _Number(int):
    pass


# What `_plain` tells apart: exact types only (a str or int subclass, a tuple, a float are not
# plain), ints at the 64-bit edges, non-string keys.
_EDGES = st.sampled_from(
    [2**63 - 1, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 0, -1, 1.5, True, _Text("a"),
     _Number(1), (1,), b"x", "é"]
)  # fmt: skip
_ANY = st.recursive(
    _SCALARS | _EDGES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=2) | st.integers(0, 3) | st.none(), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=1000, deadline=None)
@given(_ANY)
def test_what_plain_accepts_orjson_writes_as_the_standard_library(value: Any) -> None:
    if canonical._plain(value):
        assert canonical_bytes(value) == canonical_json(value)


def test_plain_of_deep_nesting_raises() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        canonical._plain(deep)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.dictionaries(st.sampled_from(["role", "content", "name", "x"]), _JSON)),
    st.data(),
)
def test_digests_of_slices_equal_the_plugin_api(
    messages: list[dict[str, Any]], data: st.DataObject
) -> None:
    digests = canonical.Digests(messages)
    for _ in range(3):
        start = data.draw(st.integers(0, len(messages)))
        end = data.draw(st.integers(start, len(messages)))
        assert digests.source_digest(start, end) == compute_source_digest(messages[start:end])
        assert digests.ref_id(start, end) == make_ref_id(messages[start:end])
