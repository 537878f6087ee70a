"""Numbers a rewritten request could not carry exactly: integers beyond orjson's 64 bits.

orjson reads an integer outside [-2**63, 2**64 - 1] as a float, so a body read with it and
serialized again would carry `1.8446744073709552e+19` where the client wrote
`18446744073709551616` (a `seed`, a tool schema's `maximum`, a `tool_use.input` value): a value
the upstream reads differently. Floats need nothing: orjson reads each as the double any JSON
reader upstream reads it as (the text may change, `1E5` -> `100000.0`, the value does not) and
refuses what overflows a double (`1e400`), as it refuses NaN and Infinity.

compactd never rewrites a request holding such an integer (`holds_wide_int`: it fails open, the
client's bytes go upstream, nothing is stored). Reading one exactly is not enough: the plugin API
hands providers plain JSON values (the standard library's json, deep copies, digests that match
`base.canonical_json`), which an integer orjson can write back (an `orjson.Fragment`) is not.
`loads` reads one as such a Fragment, for a value only orjson reads and writes.

Cost: only a run of 20 digits, or of 19 after a minus sign, can be such an integer. Looking for
one is a translate and two finds over the bytes (~0.7 µs per KB, about what orjson takes to read
them); only a body that has one is read again, by the standard library's json, to tell.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_STR_DIGITS = str.maketrans("0123456789", "0" * 10)
_LOWEST = -(2**63)
_HIGHEST = 2**64 - 1
_LONGEST = 20
"""Digits of the longest integer orjson may keep (2**64 - 1)."""


class WideIntegerError(Exception):
    """The request holds an integer beyond 64 bits: a rewrite could not carry it exactly."""


def may_hold_wide_int(raw: bytes | str) -> bool:
    """Whether `raw` has a run of digits that could be an integer orjson cannot keep (20 digits,
    or 19 after a minus sign; a run inside a string only costs the slower read)."""
    if isinstance(raw, str):
        shape = raw.translate(_STR_DIGITS)
        return "0" * 20 in shape or "-" + "0" * 19 in shape
    shape_b = raw.translate(_DIGITS)
    return b"0" * 20 in shape_b or b"-" + b"0" * 19 in shape_b


def holds_wide_int(raw: bytes) -> bool:
    """Whether the JSON `raw` holds an integer orjson cannot keep (False if it is not JSON)."""
    if not may_hold_wide_int(raw):
        return False
    found: list[str] = []
    try:
        _read(raw, found)
    except orjson.JSONDecodeError:
        return False
    return bool(found)


def loads(raw: bytes | str) -> Any:
    """`orjson.loads(raw)`, with integers beyond its range read as Fragments of their digits
    (raises orjson.JSONDecodeError where orjson.loads would)."""
    if not may_hold_wide_int(raw):
        return orjson.loads(raw)
    return _read(raw, [])


def _read(raw: bytes | str, found: list[str]) -> Any:
    """The slow read: the standard library's json with orjson's rules, a wide integer as a
    Fragment (one per spelling, so equal ones are equal), its digits added to `found`."""
    fragments: dict[str, orjson.Fragment] = {}

    def integer(text: str) -> int | orjson.Fragment:
        if len(text.lstrip("-")) <= _LONGEST:
            value = int(text)
            if _LOWEST <= value <= _HIGHEST:
                return value
        fragment = fragments.get(text)
        if fragment is None:
            fragment = fragments[text] = orjson.Fragment(text)
            found.append(text)
        return fragment

    try:
        text = raw if isinstance(raw, str) else raw.decode()
    except UnicodeDecodeError as exc:
        raise orjson.JSONDecodeError(str(exc), "", 0) from exc
    try:
        value = json.loads(text, parse_int=integer, parse_float=_finite, parse_constant=_refuse)
        # What orjson would have refused to read, it refuses to write (a lone surrogate).
        orjson.dumps(value)
    except (ValueError, TypeError, RecursionError) as exc:  # orjson's errors are ValueErrors
        raise orjson.JSONDecodeError(str(exc), text, 0) from exc
    return value


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("number is infinity when parsed as double")
    return value


def _refuse(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")
