"""Reading JSON so that orjson writes every number back as it was written."""

from __future__ import annotations

import orjson
import pytest

from proxy.exactjson import holds_wide_int, loads, may_hold_wide_int

EDGES = [
    b"18446744073709551615",  # 2**64 - 1: orjson keeps it
    b"18446744073709551616",
    b"-9223372036854775808",  # -2**63: orjson keeps it
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b"-123456789012345678901234567890",
    b"1" + b"0" * 5000,  # past int()'s 4,300 digits
]


@pytest.mark.parametrize("number", EDGES)
def test_every_integer_is_written_back_with_its_own_digits(number) -> None:
    raw = b'{"seed":' + number + b',"a":[' + number + b"]}"
    assert orjson.dumps(loads(raw)) == raw
    assert orjson.dumps(loads(raw.decode())) == raw


def test_integers_orjson_keeps_stay_python_ints() -> None:
    body = loads(b"[18446744073709551615,-9223372036854775808,0,-0,12]")
    assert body == [2**64 - 1, -(2**63), 0, 0, 12]
    assert all(type(v) is int for v in body)


def test_one_read_gives_one_spelling_one_value() -> None:
    a, b = loads(b"[18446744073709551616, 18446744073709551616]")
    assert a == b


def test_floats_read_as_orjson_reads_them() -> None:
    raw = b"[-0.0,1.0000000000000001,1E5,1.5e-400,0.1,5e-324,123456789012345678901.5]"
    padded = raw[:-1] + b",11111111111111111111111]"  # forces the slow read
    assert orjson.dumps(loads(padded)[:-1]) == orjson.dumps(orjson.loads(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b"[1e400, 11111111111111111111111]",
        b"[NaN, 11111111111111111111111]",
        b"[-Infinity, 11111111111111111111111]",
        b'["\\ud800", 11111111111111111111111]',
        b'["\xff", 11111111111111111111111]',
        b"[11111111111111111111111,]",
        b"\xef\xbb\xbf[11111111111111111111111]",
    ],
)
def test_what_orjson_refuses_the_slow_read_refuses(raw) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw.replace(b"11111111111111111111111", b"1"))
    with pytest.raises(orjson.JSONDecodeError):
        loads(raw)


def test_the_scan_finds_exactly_the_runs_that_can_be_out_of_range() -> None:
    assert may_hold_wide_int(b'{"a":18446744073709551616}')
    assert may_hold_wide_int(b'{"a":-9223372036854775809}')
    assert not may_hold_wide_int(b'{"a":9999999999999999999,"b":-999999999999999999}')
    assert may_hold_wide_int('{"a":"12345678901234567890"}')  # in a string: only slower


def test_a_wide_integer_is_told_from_a_long_run_of_digits_in_a_string() -> None:
    assert holds_wide_int(b'{"seed":18446744073709551616}')
    assert holds_wide_int(b'{"a":[{"b":-9223372036854775809}]}')
    assert not holds_wide_int(b'{"seed":18446744073709551615,"id":"123456789012345678901"}')
    assert not holds_wide_int(b'{"seed":18446744073709551616')  # not JSON: forwarded as sent
