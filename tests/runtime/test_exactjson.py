"""Telling the integers orjson cannot keep (it reads them as floats) from everything else."""

from __future__ import annotations

import pytest

from proxy.runtime.exactjson import holds_wide_int, may_hold_wide_int

KEPT = [
    b"18446744073709551615",  # 2**64 - 1
    b"-9223372036854775808",  # -2**63
    b"0",
    b"-0",
    b"9999999999999999999",
]
WIDE = [
    b"18446744073709551616",
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b"-123456789012345678901234567890",
    b"1" + b"0" * 5000,  # past int()'s 4,300 digits
]


@pytest.mark.parametrize("number", WIDE)
def test_an_integer_beyond_64_bits_is_found_anywhere(number: bytes) -> None:
    assert holds_wide_int(b'{"seed":' + number + b"}")
    assert holds_wide_int(b'{"a":[{"b":[1,2,' + number + b"]}]}")


@pytest.mark.parametrize("number", KEPT)
def test_an_integer_orjson_keeps_is_not(number: bytes) -> None:
    padded = b'{"id":"123456789012345678901","n":' + number + b"}"  # forces the slow read
    assert may_hold_wide_int(padded)
    assert not holds_wide_int(padded)


def test_floats_are_never_wide_integers() -> None:
    raw = b"[-0.0,1.0000000000000001,1E5,1.5e-400,5e-324,123456789012345678901.5]"
    assert may_hold_wide_int(raw)
    assert not holds_wide_int(raw)


def test_the_scan_finds_exactly_the_runs_that_can_be_out_of_range() -> None:
    assert may_hold_wide_int(b'{"a":18446744073709551616}')
    assert may_hold_wide_int(b'{"a":-9223372036854775809}')
    assert not may_hold_wide_int(b'{"a":9999999999999999999,"b":-999999999999999999}')
    assert may_hold_wide_int(b'{"a":"12345678901234567890"}')  # in a string: only slower


def test_a_wide_integer_is_told_from_a_long_run_of_digits_in_a_string() -> None:
    assert not holds_wide_int(b'{"seed":18446744073709551615,"id":"123456789012345678901"}')
