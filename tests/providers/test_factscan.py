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


# The other native functions: each is its Python reference on generated texts, and in use.
_AMOUNT_PIECES = [
    "1", "12", "123", "1234", ",", ".", "$", "€", "£", "\u0663", "a", "_", " ", "\n", "-",
    ",000", ",12", ".5", "x", "é",
]  # fmt: skip
_QUOTE_PIECES = ['"', "“", "”", "\n", " ", "a", "bc", "x" * 30, "é", "'", "\u2028"]


def _span_text(pieces: list[str]) -> st.SearchStrategy[tuple[str, int, int]]:
    texts = st.lists(st.sampled_from(pieces), max_size=80).map("".join)
    bound = st.integers(min_value=-3, max_value=120)
    return st.tuples(texts, bound, bound)


@settings(max_examples=3000, deadline=None)
@given(_span_text(_AMOUNT_PIECES))
def test_native_grouped_amounts_are_the_pattern(case: tuple[str, int, int]) -> None:
    _native()
    text, start, end = case
    assert _factscan.grouped_amounts(text) == facts._GROUPED.findall(text)
    assert _factscan.grouped_amounts(text, start) == facts._GROUPED.findall(text, start)
    assert _factscan.grouped_amounts(text, start, end) == facts._GROUPED.findall(text, start, end)


@settings(max_examples=3000, deadline=None)
@given(_span_text(_QUOTE_PIECES))
def test_native_quoted_phrases_are_the_pattern(case: tuple[str, int, int]) -> None:
    _native()
    text, start, end = case
    found = facts.python_quoted_spans(text, start, end)
    assert _factscan.quoted_spans(text, start, end) == found
    assert _factscan.quoted_spans(text) == facts.python_quoted_spans(text, 0, len(text))
    # the group is what the spans leave without their quotes
    assert [text[a + 1 : b - 1] for a, b in found] == facts._QUOTED_PHRASE.findall(text, start, end)


_RANK_PIECES = [
    *_PIECES, "/", "//", "://", ".py", ".md", ".toolong", "-", "\n", "$", "1-2-3", "a/b", "x_1",
]  # fmt: skip


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_RANK_PIECES), max_size=12).map("".join) | st.text(max_size=30))
def test_native_rank_is_python_rank(value: str) -> None:
    _native()
    if not value:
        with pytest.raises(IndexError):
            facts.python_rank(value)
        with pytest.raises(IndexError):
            _factscan.fact_rank(value)
        return
    assert _factscan.fact_rank(value) == facts.python_rank(value)


@settings(max_examples=1000, deadline=None)
@given(st.lists(_texts(20).filter(bool), max_size=30), st.lists(st.booleans(), max_size=30))
def test_native_distinct_and_ranked_are_python(matches: list[str], flags: list[bool]) -> None:
    _native()
    native: dict[str, bool] = {}
    python: dict[str, bool] = {}
    for i, match in enumerate(matches):  # facts already in, quoted or not, keep their place
        if i < len(flags) and flags[i]:
            native[match] = python[match] = i % 2 == 0
    _factscan.quote_into(native, matches)
    facts.python_quote_into(python, matches)
    assert list(native.items()) == list(python.items())
    assert _factscan.ranked(native) == facts.python_ranked(python)
    assert _factscan.ranked(native) == facts.python_ranked(python, facts.FactMemo())


def test_native_functions_are_in_use_and_check_their_arguments() -> None:
    _native()
    assert facts.NATIVE_GROUPED is _factscan.grouped_amounts
    assert facts.NATIVE_QUOTED is _factscan.quoted_spans
    assert facts.NATIVE_RANKED is _factscan.ranked
    assert facts.NATIVE_QUOTE_INTO is _factscan.quote_into
    with pytest.raises(IndexError):
        _factscan.quote_into({}, [""])
    with pytest.raises(TypeError):
        _factscan.quote_into({}, [1])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _factscan.ranked({1: True})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        _factscan.grouped_amounts("1,000", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _factscan.quoted_spans()  # type: ignore[call-arg]
    assert facts._ranked_facts("see `xy` and a_1 at 1,000 in \"the red door\"") == [
        (0, 0, "xy"), (0, 1, "a_1"), (2, 3, "000"), (1, 4, "the red door"), (2, 5, "1,000"),
    ]  # fmt: skip


_LINE_PIECES = ["a", "b", "ab", "abc", "AB", "İ", "Σ", "ς", "é", "\n", " ", "x\ny", "\r", "ß", "ﬁ"]
_LINE_TERMS = ["a", "ab", "abc", "b", "i", "\u03c3", "ς", "x\ny", "", "ss", "ﬁ", "fi"]


_LONG_LINE_PIECES = [*_LINE_PIECES, "abcdefgh ", "  ", "\t", "\n\n", " ab ab ab ab"]


_NAME_PIECES = [
    "a ", "a", "z", "1", "5G", ",", ";", " ", "\t", "\n", "Ab", "AB", "Abc", "X", "x", "-", "-b",
    "-B", "'s", "'", "\u2019", "\u00f7", "\u00d7", "ß", "À", "Þ", "é", "É", '"', "(", "\u201c",
    "\u2018", "_", "I", "Mc", "Ñ", "ÿ", "Ā", "\u0663", "GPUs", "\u2013", "\u2014", "aB", "bCd",
]  # fmt: skip


@settings(max_examples=5000, deadline=None)
@given(_span_text(_NAME_PIECES))
def test_native_names_are_the_pattern(case: tuple[str, int, int]) -> None:
    _native()
    assert facts.NATIVE_NAMES is _factscan.names
    text, start, end = case
    assert _factscan.names(text) == facts._NAME.findall(text)
    assert _factscan.names(text, start, end) == facts._NAME.findall(text, start, end)


_NAME_FACT_PIECES = [*_NAME_PIECES, "I ", "OK ", "Ok\t", "I'm ", "Bob ", "a I ", "a OK Ab "]


@settings(max_examples=5000, deadline=None)
@given(_span_text(_NAME_FACT_PIECES), st.sampled_from([facts._NOT_NAMES, frozenset(), {"Ab"}]))
def test_native_name_facts_are_python(
    case: tuple[str, int, int], not_names: frozenset[str]
) -> None:
    _native()
    assert facts.NATIVE_NAME_FACTS is _factscan.name_facts
    text, start, end = case
    native = _factscan.name_facts(text, start, end, not_names)
    assert native == facts.python_name_facts(text, start, end, not_names)


def test_name_facts_drop_leading_non_names_and_reject_bad_arguments() -> None:
    _native()
    text = "we met Jay Chou and then OK Bob\tSmith, and I Ann with I"
    expected = facts.python_name_facts(text, 0, len(text), facts._NOT_NAMES)
    assert _factscan.name_facts(text, 0, len(text), facts._NOT_NAMES) == expected
    assert "Bob Smith" in expected
    with pytest.raises(TypeError):
        _factscan.name_facts(text, 0, len(text))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _factscan.name_facts(text, 0, len(text), ["I"])  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200))
def test_native_spans_on_any_text(text: str) -> None:
    _native()
    for native, pattern in (
        (_factscan.names, facts._NAME),
        (_factscan.grouped_amounts, facts._GROUPED),
    ):
        assert native(text) == pattern.findall(text)
    assert _factscan.quoted_spans(text) == facts.python_quoted_spans(text, 0, len(text))


def test_native_names_of_long_hyphen_chains() -> None:
    _native()
    for tail in ("", "1", "\u00f7", " Abc", "'s Xy", "-"):
        for text in ("a Ab" + "-cd" * 50_000 + tail, "a Ab" + "Cd" * 50_000 + tail):
            assert _factscan.names(text) == facts._NAME.findall(text)  # no recursion per part


# Widths 1, 2 and 4 (and repeats, so that some needles' rarest pair is common and the search
# falls back to str.find): `occurs` must answer `in` for every mix of str kinds.
_OCCUR_PIECES = [
    "a", "b", "ab", "aab", "ba", "é", "ÿ", "\x00", "Ā", "€", "\uffff", "\U0001f600", "\U0001d7d8",
    "\U0010ffff", "\n", " ", "aé", "a€", "a\U0001f600",
]  # fmt: skip


def _occur_texts(max_size: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(_OCCUR_PIECES), max_size=max_size).map("".join)


@st.composite
def _text_and_needles(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(_occur_texts(80) | st.text(max_size=120))
    cuts = draw(st.lists(st.tuples(st.integers(-5, 125), st.integers(-5, 125)), max_size=20))
    needles = [text[a:b] for a, b in cuts]  # slices of it: many occur
    needles += draw(st.lists(_occur_texts(8) | st.text(max_size=6), max_size=20))
    needles.append(text + draw(st.sampled_from(["", "a", "\U0001f600"])))  # as long or longer
    return text, needles


@settings(max_examples=3000, deadline=None)
@given(_text_and_needles())
def test_native_occurs_is_in(case: tuple[str, list[str]]) -> None:
    _native()
    text, needles = case
    occurs = facts.occurs_in(text)
    index = _factscan.text_index(text)
    for needle in needles:
        assert occurs(needle) is (needle in text), (text, needle)
        assert _factscan.occurs(index, needle) is (needle in text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.lists(st.text(max_size=10), max_size=30))
def test_native_occurs_on_any_text(text: str, needles: list[str]) -> None:
    _native()
    occurs = facts.occurs_in(text)
    for needle in [*needles, "", text, text[1:], text[:-1], text[1:-1], text + "x"]:
        assert occurs(needle) is (needle in text)


def test_native_occurs_of_long_repeats_and_bad_arguments() -> None:
    _native()
    assert facts.NATIVE_TEXT_INDEX is _factscan.text_index
    assert facts.NATIVE_OCCURS is _factscan.occurs
    long = "".join(f"line {i}: é\U0001f600 x_{i * 7}\n" for i in range(5000))  # indexed sans GIL
    for text in ("a" * 5000 + "b", "ab" * 3000 + "\U0001f600", "é" * 4000 + "a", "", long):
        occurs = facts.occurs_in(text)
        for needle in ("a" * 40 + "b", "a" * 5001, "ab" * 60, "b", "ba", "éa", "\U0001f600", ""):
            assert occurs(needle) is (needle in text)
        for needle in ("x_34993\n", "x_34994", "4999: é\U0001f600", "\nline 0", long[-30:]):
            assert occurs(needle) is (needle in text)
    occurs = facts.occurs_in("some text")

    class Sub(str):
        pass

    assert occurs(Sub("me te"))
    assert not occurs(Sub("met"))
    with pytest.raises(TypeError):
        occurs(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _factscan.text_index(b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="PyCapsule"):
        _factscan.occurs("not an index", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _factscan.occurs(_factscan.text_index("x"))  # type: ignore[call-arg]


def test_python_occurs_is_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts, "NATIVE_TEXT_INDEX", None)  # as if built without a compiler
    occurs = facts.occurs_in("some text")
    assert occurs("me te")
    assert occurs("")
    assert not occurs("met")


# Facts a stub packs: repeats, plurals and possessives of each other, ones that hold another
# (`a b` holds `a`), structural-looking tags (`D1:2`), wide characters.
_SALIENT_FACTS = [
    "ab", "abs", "ab?", "ab's", "abes", "a b", "b", "a,b", "D1:1", "D1:2", "D2:10", "d3:4", "x_1",
    "é9", "s", "es", "'s", "Σ1", "\U0001d7d81", "ab ab", "b,ab", "GPU", "GPUs",
]  # fmt: skip


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 9), st.sampled_from(_SALIENT_FACTS)), max_size=12),
        max_size=6,
    ),
    st.integers(-3, 60),
    st.booleans(),
)
def test_native_salient_is_python(
    groups: list[list[tuple[int, str]]], max_chars: int, shaped: bool
) -> None:
    _native()
    assert facts.NATIVE_SALIENT is _factscan.salient
    memo: dict[str, str] = {}
    structural = (
        facts.structural_shapes([facts.shape_counts(g, memo) for g in groups])
        if not shaped
        else frozenset({"d0:0", "é0"})  # tags that occur (at most two of each listed)
    )
    native_memo, python_memo = dict(memo), dict(memo)
    native = _factscan.salient(groups, max_chars, structural, native_memo, facts.fact_shape)
    assert native == facts.python_salient(groups, max_chars, structural, python_memo)
    assert native_memo == python_memo
    assert facts.pack_salient(groups, max_chars, structural) == native


def test_native_salient_checks_its_arguments() -> None:
    _native()
    with pytest.raises(TypeError):
        _factscan.salient([[(0, 1)]], 10, frozenset(), {}, facts.fact_shape)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _factscan.salient([[("0", "ab")]], 10, frozenset(), {}, facts.fact_shape)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _factscan.salient([[(0, "ab")]], "10", frozenset(), {}, facts.fact_shape)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _factscan.salient(1, 10, frozenset(), {}, facts.fact_shape)  # type: ignore[arg-type]
    with pytest.raises(ZeroDivisionError):  # what fact_shape raises comes through
        _factscan.salient([[(0, "D1:1")]], 10, frozenset({"d0:0"}), {}, lambda f: 1 / 0)
    held = [[(1, "b"), (1, "a b"), (0, "GPUs")], [(1, "b"), (0, "GPU")]]
    assert _factscan.salient(held, 99, frozenset(), {}, str) == "a b, GPUs"


_TERM_PIECES = [
    "a", "Z", "ab", "Foo", "x_1", "9", "-", "_", " ", "\n", "\t", "\x0b", "\x0c", "\r", "\x1c",
    "\x1f", "\x00", "\x7f", ".", "/", "@", "::", "(", ")", "\\", "'", '"', "`", "=", "#", "é", "\x85",
]  # fmt: skip


_SHAPE_PIECES = ["a", "Z", "0", "9", "12", ":", "-", " ", "é", "É", "\u0663", "\u00b2", "İ", "_"]


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3), st.lists(st.sampled_from(_SHAPE_PIECES), max_size=8).map("".join)
        ),
        max_size=12,
    ),
    st.lists(st.sampled_from(["D1:2", "ab", "é3"]), max_size=3),
)
def test_native_shape_counts_are_python(group: list[tuple[int, str]], known: list[str]) -> None:
    _native()
    assert facts.NATIVE_SHAPE_COUNTS is _factscan.shape_counts
    memo = {fact: facts.fact_shape(fact) for fact in known}  # shapes found before are reused
    native_memo, python_memo = dict(memo), dict(memo)
    native = _factscan.shape_counts(group, native_memo, facts.fact_shape)
    python = facts.python_shape_counts(group, python_memo)
    assert native == python
    assert list(native.items()) == list(python.items())
    assert native_memo == python_memo
    assert list(native_memo) == list(python_memo)


def test_native_shape_counts_check_their_arguments() -> None:
    _native()
    with pytest.raises(TypeError):
        _factscan.shape_counts([(0, 1)], {}, facts.fact_shape)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _factscan.shape_counts([(0, "é1")], {}, lambda fact: 1)
    with pytest.raises(ZeroDivisionError):
        _factscan.shape_counts([(0, "é1")], {}, lambda fact: 1 / 0)
    assert facts.shape_counts([(0, "Turn 12"), (1, "turn 3")]) == {"turn 0": {"Turn 12", "turn 3"}}


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["ab", "cd", "abc", "x_1", "é"]))),
    st.dictionaries(st.sampled_from(["ab", "cd", "zz"]), st.booleans()),
    st.sampled_from(["", "abc", "x_1 and cd", "é"]),
)
def test_native_unshown_is_python(
    found: list[tuple[int, str]], known: dict[str, bool], text: str
) -> None:
    _native()
    assert facts.NATIVE_UNSHOWN is _factscan.unshown
    native_shown, python_shown = dict(known), dict(known)  # answers found before are reused
    occurs = facts.occurs_in(text)
    native = _factscan.unshown(found, native_shown, occurs)
    assert native == facts.python_unshown(found, python_shown, occurs)
    assert list(native_shown.items()) == list(python_shown.items())


def test_native_unshown_checks_its_arguments() -> None:
    _native()
    with pytest.raises(TypeError):
        _factscan.unshown((), {}, bool)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        _factscan.unshown([(0,)], {}, bool)  # type: ignore[list-item]
    with pytest.raises(ZeroDivisionError):
        _factscan.unshown([(0, "ab")], {}, lambda fact: 1 / 0)
    assert facts.unshown([(0, "ab"), (1, "cd")], {"cd": False}, "xab".__contains__) == [(1, "cd")]


_JSON_STRINGS = st.one_of(
    st.sampled_from(["", "a", "HAT069", "ABCDE", "ABCDEFGHI", "x_1", "12", "1.2.3", "é", "ÉÉ123"]),
    st.text(st.characters(codec="ascii"), max_size=12),
    st.text(max_size=8),
)
_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from([0, 0.0, -0.0, 1.5, float("nan"), float("inf")]),
    st.floats(allow_nan=False),
    _JSON_STRINGS,
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(_JSON_STRINGS, inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=1000, deadline=None)
@given(_JSON)
def test_native_json_items_are_python(value: object) -> None:
    _native()
    assert facts.NATIVE_JSON_ITEMS is _factscan.json_items
    native = _factscan.json_items(value, facts._id_like)
    assert list(native.items()) == list(facts.python_json_items(value).items())


@settings(max_examples=1000, deadline=None)
@given(st.text(st.characters(codec="ascii"), max_size=12))
def test_native_json_items_decide_ascii_ids_as_python(text: str) -> None:
    _native()
    # An ASCII key or value is decided in C, without asking `id_like`.
    native = _factscan.json_items({text: [text]}, lambda _text: 1 / 0)
    assert list(native.items()) == list(facts.python_json_items({text: [text]}).items())


def test_native_json_items_ask_id_like_of_other_strings() -> None:
    _native()
    assert _factscan.json_items({"é": "ü"}, lambda text: text == "ü") == {("é", "ü"): (0, 0)}
    with pytest.raises(ZeroDivisionError):
        _factscan.json_items(["é"], lambda text: 1 / 0)
    with pytest.raises(TypeError):
        _factscan.json_items([])  # type: ignore[call-arg]
    nested: list[object] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(RecursionError):
        _factscan.json_items(nested, facts._id_like)
