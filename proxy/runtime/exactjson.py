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

Cost: only a run of 20 digits, or of 19 after a minus sign, can be such an integer. Looking for
one is a translate and two finds over the bytes (~0.7 µs per KB, about what orjson takes to read
them); only a body that has one is read again, by the standard library's json, to tell.
"""

from __future__ import annotations

import json

from proxy.errors import WideIntegerError

_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_LOWEST = -(2**63)
_HIGHEST = 2**64 - 1
_LONGEST = 20
"""Digits of the longest integer orjson may keep (2**64 - 1)."""


def may_hold_wide_int(raw: bytes) -> bool:
    """Whether `raw` has a run of digits that could be an integer orjson cannot keep (20 digits,
    or 19 after a minus sign; a run inside a string only costs the slower read)."""
    shape = raw.translate(_DIGITS)
    return b"0" * 20 in shape or b"-" + b"0" * 19 in shape


def _integer(text: str) -> int:
    if len(text.lstrip("-")) <= _LONGEST and _LOWEST <= int(text) <= _HIGHEST:
        return 0  # the value is not wanted, only whether it is in range
    raise WideIntegerError


def holds_wide_int(raw: bytes) -> bool:
    """Whether `raw`, a body orjson has read, holds an integer orjson cannot keep (the read
    stops at the first one; a body that is no JSON at all is never rewritten, so never asked)."""
    if not may_hold_wide_int(raw):
        return False
    try:
        json.loads(raw, parse_int=_integer)
    except WideIntegerError:
        return True
    except (ValueError, RecursionError):  # what the standard library cannot read, orjson read
        return False
    return False
