"""The text library of the engine: pieces tile their text; salience ranks facts over filler."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.providers import pieces
from proxy.providers.salience import Scorer, edges, form, said_later, terms

TEXTS = st.text(
    alphabet=st.sampled_from([*"ab Z9.,;:{}[]\"'\n\\/-_", "é", "\U0001f600"]), max_size=900
)


@given(TEXTS)
def test_pieces_tile_any_text_exactly(text: str) -> None:
    spans = pieces.split(text)
    assert "".join(text[s:e] for s, e in spans) == text
    assert all(s < e for s, e in spans)
    assert all(e - s <= max(pieces.LONGEST, pieces.LONG_LINE) for s, e in spans)


def test_short_lines_are_gathered_with_the_lines_after_them() -> None:
    text = "def f(x):\n    if x:\n        return compute_the_answer(x, cache=True)\n}\n"
    spans = pieces.split(text)
    first = text[spans[0][0] : spans[0][1]]
    assert first.endswith("return compute_the_answer(x, cache=True)\n"), first


def test_data_is_cut_between_members_never_inside_a_string() -> None:
    text = '{"note": "a, b; c", ' + ", ".join(f'"k{i}": {i}' for i in range(80)) + "}"
    for s, e in pieces.split(text):
        assert text[s:e].count('"') % 2 == 0, text[s:e]


def test_the_form_of_a_term_says_how_specific_it_is() -> None:
    assert form("HAT069") == form("src/app.py") == form("user_id") == form("getUser") == 1.0
    assert form("NASA") == 0.6
    assert form("river") == form("River") == 0.0


def test_a_rare_id_outweighs_filler_and_relevance_follows_the_question() -> None:
    filler = ["that sounds great thanks a lot", "sure thing, happy to help you"] * 5
    scorer = Scorer(
        [*filler, "your booking ZX81-4471 is confirmed", "the weather in Lisbon is mild"],
        query="ok",
        focus="what is the weather like in Lisbon?",
    )
    specific = [scorer.specificity(i) for i in range(12)]
    assert specific[10] > max(specific[:10])
    relevant = [scorer.relevance(i) for i in range(12)]
    assert relevant[11] == max(relevant) > 0


def test_a_quoted_phrase_is_a_name_where_someone_wrote_it_not_in_output() -> None:
    pieces = [
        "the working title is 'netrunner's gambit' now",
        'it said "firefox closed unexpectedly" and quit',
        "don't worry, it's fine",
        '{"status": "closed unexpectedly"}',
    ]
    scorer = Scorer(pieces, query="ok", focus="ok", written=bytes([1, 1, 1, 0]))
    assert scorer.specificity(0) > 0
    assert scorer.specificity(1) > 0
    assert scorer.specificity(2) == 0, "an apostrophe opens no quote"
    assert scorer.specificity(3) == 0, "a tool's output: quotes are JSON's, not a name"


def test_a_line_said_again_later_is_marked_where_it_stands_first() -> None:
    groups = [
        ["Error: disk full on /dev/sda1\n", "}\n"],
        ["Error: disk full on /dev/sda1\n", "}\n", "retrying in 5 s\n"],
    ]
    flags = said_later(groups, {"retrying in 5 s"}, min_chars=12)
    assert flags == [[True, False], [False, False, True]]


def test_edges_find_a_fact_at_the_start_or_end_of_a_piece() -> None:
    assert edges("HAT069 departs at noon and arrives in the evening, on time", 24) == (True, False)
    assert edges("the flight that departs at noon is flight number HAT069", 24) == (False, True)
    assert terms("see https://x.org/a_b (2024-05-20)") == ["see", "https://x.org/a_b", "2024-05-20"]
