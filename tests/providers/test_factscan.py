"""The native fact scan (proxy/providers/_factscan.c) finds exactly what the fact pattern finds.

facts.py uses it only while its pattern is the one the C scan implements; the pure-Python scan
stays the reference and the fallback, and is pinned to the same pattern here too.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.providers import facts

try:
    from proxy.providers import _factscan
except ImportError:  # built without a compiler
    _factscan = None  # type: ignore[assignment]

_PIECES = [
    "a", "z", "B", "Z", "é", "É", "ß", "1", "0", "\u0663", "\u00b2", "\u2160", "_", "/", "@",
    "`", "``", ".", ",", ";", ":", "!", "?", "=", "&", "#", "<", ">", "(", ")", '"', "'", " ",
    "\n", "\t", "\u00a0", "\u2003", "\u2028", "\x1c", "-", "+", "%", "~", "$", "€", "£", "ab",
    "Cd", "GD", "x.y", "a-B", "A-b", "x+Y", "C#", "\u01c5", "\ufb01", "\U0001d7d8", "é.x",
]  # fmt: skip


def _texts(max_size: int = 60) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(_PIECES), max_size=max_size).map("".join)


def _native() -> object:
    if _factscan is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("the native fact scan was not built (a C compiler is needed)")
        pytest.skip("the native fact scan was not built (no C compiler): pure-Python scan")
    # Not a skip: a changed pattern would otherwise switch the native scan off unseen (same
    # results, the engine several times slower at finding facts).
    assert facts._FACT.pattern == _factscan.PATTERN, (
        "facts._FACT changed: change proxy/providers/_factscan.c (and its PATTERN) with it"
    )
    return _factscan


@settings(max_examples=3000, deadline=None)
@given(_texts())
def test_native_scan_is_the_fact_pattern(text: str) -> None:
    _native()
    assert _factscan.fact_matches(text) == facts._FACT.findall(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_native_scan_is_the_fact_pattern_on_any_text(text: str) -> None:
    _native()
    assert _factscan.fact_matches(text) == facts._FACT.findall(text)


def test_native_scan_of_long_backtick_runs_and_edges() -> None:
    _native()
    for n in (0, 1, 2, 3, 59, 60, 61, 62, 200):
        for text in (f"`{'x' * n}`", f"a`{'x' * n}`b_1", f"`{'1' * n}", f"{'a' * n}#"):
            assert _factscan.fact_matches(text) == facts._FACT.findall(text)


def test_the_scan_in_use_is_native_when_built() -> None:
    _native()
    assert facts.NATIVE_SCAN is _factscan.fact_matches


@settings(max_examples=1000, deadline=None)
@given(_texts())
def test_python_scan_is_the_fact_pattern(text: str) -> None:
    assert facts.python_scan(text) == facts._FACT.findall(text)
    assert facts.python_scan(text, {}) == facts._FACT.findall(text)


def test_native_scan_wants_a_str() -> None:
    _native()
    with pytest.raises(TypeError):
        _factscan.fact_matches(b"abc_1")  # type: ignore[arg-type]
