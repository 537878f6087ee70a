"""The fast text scans find exactly what the plain patterns they replace find.

Each scan avoids a long regex call (per-character cost, or a long GIL hold on a big text); these
properties pin them to the simple reference that defines them.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.text import extractive_summary, facts, prose

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.M | re.S)


def _texts(pieces: list[str], max_size: int = 40) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(pieces), max_size=max_size).map("".join)


_FENCE_PIECES = ["```", "````", "~~~", "``", "\n", " ", "\t", "    ", "x", "py", "\n\n", "`", "~"]
_FACT_PIECES = [
    "a", "B", "é", "É", "1", "_", "/", "@", "`", ".", ",", ";", ":", "!", "?", "(", ")", '"',
    "'", " ", "\n", "\t", "\u00a0", "\u2003", "\u2028", "\x1c", "-", "+", "%", "~", "$", "€",
    "=", "&", "ab", "Cd", "x.y", "\u0663", "\u01c5", "\ufb01",
]  # fmt: skip
_ERROR_PIECES = [
    "error", "Error", "KeyError", "failed", "not found", "invalid", "x", "\n", " ", "fail",
    "fatal", "exceptions", "traceback", "\u0130", "deniedx", "refused.", "_", ".",
]  # fmt: skip
_PATH_PIECES = ["a/b", "src/x.py", " ", "\n", "(", ")", "'", '"', ",", ";", "=", "./x", "~/y", "a"]


@settings(max_examples=2000, deadline=None)
@given(_texts(_FENCE_PIECES))
def test_fence_spans_are_the_fence_pattern_matches(text: str) -> None:
    expected = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    assert list(extractive_summary._fence_spans(text)) == expected


@settings(max_examples=2000, deadline=None)
@given(_texts(_FACT_PIECES))
def test_fact_scan_finds_what_the_fact_pattern_finds(text: str) -> None:
    assert facts._fact_matches(text) == facts._FACT.findall(text)


def test_fact_scan_of_a_long_text_in_pieces_is_the_whole_scan() -> None:
    text = "see src/app/module_3.py at line 12: KeyError 'user_42' in fooBar.\n" * 2000
    assert len(text) > facts.SCAN_CHARS
    assert facts._fact_matches(text) == facts._FACT.findall(text)


@settings(max_examples=1000, deadline=None)
@given(_texts(_PATH_PIECES, max_size=400))
def test_paths_in_pieces_are_the_paths_of_the_whole_text(text: str) -> None:
    text = (text + "\n") * 200  # long enough to be split in pieces
    whole = {
        c
        for token in prose._TOKEN_SPLIT.split(text)
        if (c := token.rstrip(".:") if "/" in token else "") and prose._PATH_TOKEN.fullmatch(c)
    }
    assert prose.paths_in(text) == whole


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(
        st.sampled_from(["  x", "\ty", "foo;", "bar", "baz:", "word", "x)", "a ="]), min_size=2
    )
)
def test_code_line_count_stops_early_with_the_same_answer(lines: list[str]) -> None:
    code = sum(
        1
        for ln in lines
        if ln[0] in " \t" or ln.rstrip().endswith(extractive_summary._CODE_ENDINGS)
    )
    assert extractive_summary._mostly_code(lines) == (code * 5 >= len(lines) * 3)


def test_paths_of_a_long_log_are_found_across_its_pieces() -> None:
    text = "open ./src/app/module_3.py failed; see (~/logs/run.txt) and a/b,c/d\n" * 2000
    assert len(text) > 2 * facts.SCAN_CHARS
    assert prose.paths_in(text) == {"./src/app/module_3.py", "~/logs/run.txt", "a/b", "c/d"}


# Separators and specials are ASCII; the pieces add multi-byte, astral, case-changing and lone
# surrogate characters around them.
_BYTE_PIECES = [
    "a", "Z", "é", "İ", "ß", "\U0001f600", "\ud800", "\udfff", "\u2028", "\x85", " ", "\n",
    "\r", "\t", ".", "/", "@", "`", "(", "]", "{", "|", "\\", ";", "=", "~", "_", "-", "1",
]  # fmt: skip
_OLD_SEPARATORS = str.maketrans(dict.fromkeys("\t\n\r\"'`()[]{}<>,;:=|!?*#&^%$+~\\/.@", " "))
_OLD_SPECIAL = str.maketrans("", "", "{}[]<>|\\;:@#$%^&*()=+`~")


@settings(max_examples=2000, deadline=None)
@given(_texts(_BYTE_PIECES))
def test_special_characters_are_counted_as_a_str_table_deletes_them(text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    deleted = len(data) - len(data.translate(None, extractive_summary._SPECIAL_DELETE))
    assert deleted == len(text) - len(text.translate(_OLD_SPECIAL))
