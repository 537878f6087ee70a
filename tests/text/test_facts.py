"""Facts are what a paraphrase would lose: names, quoted titles, ids, paths, amounts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.text import facts
from proxy.text.facts import all_matches, facts_of_matches, name_matches


def fact_items(text: str) -> list[str]:
    """The distinct facts of a text, in order (what a summary's `facts:` line lists)."""
    return facts_of_matches(all_matches(text))


def test_names_are_capitalized_words_that_do_not_start_a_sentence() -> None:
    text = 'Yesterday we went to Green Meadow Park with Emily. Then I read "The Great Gatsby".'
    # The quoted title is found as a quote and as a name; the fact list has it once.
    assert name_matches(text).count("The Great Gatsby") == 2
    assert fact_items(text) == ["The Great Gatsby", "Green Meadow Park", "Emily"]


def test_pronouns_and_sentence_starts_are_not_names() -> None:
    assert name_matches("I think so. Maybe I'm wrong, I'll check! Sure.") == []


def test_acronyms_after_a_word_are_names() -> None:
    assert name_matches("moved from NYC to San Francisco") == ["NYC", "San Francisco"]


def test_a_multi_megabyte_line_is_scanned_a_piece_at_a_time() -> None:
    # Pieces are cut at spaces (one regex call over 6 MB would hold the GIL for long): the few
    # quotes a cut splits are missed, nothing else.
    text = ('see "a b" and x ' * 400_000).strip()
    assert 399_000 < len(name_matches(text)) <= 400_000


def test_a_name_keeps_its_possessive_as_written() -> None:
    text = "We played Baldur's Gate; the title is 'Netrunner's Gambit'. Ask Maria's sister."
    assert fact_items(text) == ["Baldur's Gate", "Netrunner's Gambit", "Maria's"]


def test_plural_acronyms_and_units_after_an_amount_are_names() -> None:
    assert fact_items("we run 64 A100 GPUs and hit 22K MAU today") == [
        "64", "A100", "GPUs", "22K", "MAU",
    ]  # fmt: skip


def test_technical_words_with_inner_capitals_hyphens_or_signs_are_facts() -> None:
    text = "Surprisingly smooth. GDScript beats C#. XLM-R went PC-only with English+French."
    for fact in ("GDScript", "C#", "XLM-R", "PC-only", "English+French"):
        assert fact in fact_items(text)
    assert fact_items("Real-time combat. Cross-lingual work. See issue #12.") == ["12"]


def test_a_name_keeps_its_hyphenated_parts() -> None:
    text = "We ate Sichuan-style tofu at Chick-fil-a, then flew over the Qinghai-Tibet Plateau."
    facts = fact_items(text)
    for fact in ("Sichuan-style", "Chick-fil-a", "Qinghai-Tibet Plateau"):
        assert fact in facts
    assert "Sichuan" not in facts


def test_amounts_with_thousands_separators_are_facts_and_their_pieces_are_not_listed() -> None:
    text = "The house cost 300,000 and the car $12,500.50, not 1,2,3."
    assert name_matches(text) == ["300,000", "$12,500.50"]


def test_a_capitalized_word_after_a_dash_goes_on_with_the_sentence() -> None:
    text = (
        "The migration is half done \u2014 Products 1 and 2 are moved. Update \u2013 the board met."
    )
    assert name_matches(text) == ["Products"]


def test_a_name_with_inner_capitals_keeps_its_possessive() -> None:
    text = "we moved to FSDP \u2014 PyTorch's own, like YouTube's player and McDonald's fries"
    assert name_matches(text) == ["FSDP", "PyTorch's", "YouTube's", "McDonald's"]


def test_a_quoted_word_in_a_sentence_is_a_fact_a_quoted_key_or_command_is_not() -> None:
    text = 'she is not "spoiled." says my "girlfriend" {"role": "user"} sed -i "s|a|b|" x = "abc"'
    assert name_matches(text) == ["spoiled.", "girlfriend"]


# Pieces of text the fact pattern tells apart: letters of every case and script, digits of
# other scripts, every character the pattern names, blanks of every kind.
_PIECES = [
    "a", "z", "B", "Z", "é", "É", "ß", "1", "0", "\u0663", "\u00b2", "\u2160", "_", "/", "@",
    "`", "``", ".", ",", ";", ":", "!", "?", "=", "&", "#", "<", ">", "(", ")", '"', "'", " ",
    "\n", "\t", "\u00a0", "\u2003", "\u2028", "\x1c", "-", "+", "%", "~", "$", "€", "£", "ab",
    "Cd", "GD", "x.y", "a-B", "A-b", "x+Y", "C#", "\u01c5", "\ufb01", "\U0001d7d8", "é.x",
]  # fmt: skip
_QUOTE_PIECES = ['"', "“", "”", "\n", " ", "a", "bc", "x" * 30, "é", "'", "\u2028"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=60).map("".join))
def test_the_token_scan_finds_what_the_fact_pattern_finds(text: str) -> None:
    # Plain words are ruled out without the pattern, and each token's matches are remembered.
    assert facts._scan(text) == facts._FACT.findall(text)
    assert facts._scan(text, {}) == facts._FACT.findall(text)


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.sampled_from(_QUOTE_PIECES), max_size=80).map("".join),
    st.integers(min_value=-3, max_value=120),
    st.integers(min_value=-3, max_value=120),
)
def test_quoted_spans_hold_the_quoted_phrase_and_its_quotes(
    text: str, start: int, end: int
) -> None:
    found = facts._quoted_spans(text, start, end)
    assert [text[a + 1 : b - 1] for a, b in found] == facts._QUOTED_PHRASE.findall(text, start, end)


def test_names_drop_the_words_that_are_no_names_before_them() -> None:
    text = "we met Jay Chou and then OK Bob\tSmith, and I Ann with I"
    found = facts._name_facts(text, 0, len(text), facts._NOT_NAMES)
    assert found == ["Jay Chou", "Bob Smith"]
