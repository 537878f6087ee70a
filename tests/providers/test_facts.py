"""Fact lists keep what is specific: names and quoted titles, not tags that every message repeats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.providers import facts
from proxy.providers.facts import (
    TAG_MESSAGES,
    fact_items,
    fact_shape,
    name_matches,
    pack_salient,
    shape_counts,
    structural_shapes,
)


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


def test_near_identical_tags_share_a_shape() -> None:
    assert fact_shape("D1:2") == fact_shape("D3:14") == "d0:0"


def test_tags_on_every_message_give_way_to_the_names_they_tag() -> None:
    groups = [[(1, f"D1:{k}")] for k in range(1, 20)]
    groups[7].append((1, "Lisbon"))
    groups[12].append((1, "Caroline"))
    packed = pack_salient(groups, 40).split(", ")
    assert "Lisbon" in packed
    assert "Caroline" in packed
    assert sum(p.startswith("D1:") for p in packed) <= 2


def test_fewer_messages_than_a_tag_needs_have_no_structural_shape() -> None:
    # What lets a stub over a few messages skip the shape counts: the same tags on one more
    # message are structural.
    groups = [[(1, f"D1:{k}"), (1, f"D2:{k}")] for k in range(1, TAG_MESSAGES)]
    assert structural_shapes([shape_counts(g) for g in groups]) == frozenset()
    groups.append([(1, "D1:99"), (1, "D2:99")])
    assert structural_shapes([shape_counts(g) for g in groups]) == {"d0:0"}


def test_ids_listed_many_at_once_are_content_not_tags() -> None:
    # Flight numbers come in bunches per search result: none is dropped as a structural tag.
    groups = [
        [(0, f"HAT{k:03d}"), (0, f"HAT{k + 100:03d}"), (0, f"HAT{k + 200:03d}")] for k in range(8)
    ]
    assert len(pack_salient(groups, 1000).split(", ")) == 24


def test_a_number_told_session_after_session_is_content_not_a_tag() -> None:
    # A metric in 5 of 14 messages, one value each (the shape `0.0`): every value is kept,
    # though turn ids of that regularity would give way.
    groups: list[list[tuple[int, str]]] = [[(1, "mAP")] for _ in range(14)]
    for at, value in zip((4, 7, 8, 9, 13), ("1.2", "89.3", "91.1", "93.5", "0.5"), strict=True):
        groups[at].append((2, value))
    packed = pack_salient(groups, 1000).split(", ")
    assert {"1.2", "89.3", "91.1", "93.5", "0.5"} <= set(packed)
    dates = [[(1, f"2024-05-{k:02d}")] for k in range(1, 15)]
    assert len(pack_salient(dates, 1000).split(", ")) == 14


def test_tags_on_fewer_than_two_fifths_of_the_messages_are_kept() -> None:
    groups: list[list[tuple[int, str]]] = [[(1, "x")] for _ in range(14)]
    for k in range(5):
        groups[k].append((1, f"D1:{k}"))
    assert sum(p.startswith("D1:") for p in pack_salient(groups, 1000).split(", ")) == 5


def test_a_fact_inside_a_longer_chosen_one_is_left_out() -> None:
    assert pack_salient([[(1, "Pride and Prejudice"), (1, "Prejudice")]], 100) == (
        "Pride and Prejudice"
    )


def test_within_a_rank_facts_several_messages_mention_go_first() -> None:
    listing = [(0, f"file_{k}.py") for k in range(12)]
    groups = [listing, [(0, "src/library.py")], [(0, "src/library.py"), (0, "parse_bits")]]
    groups.append([(0, "parse_bits")])
    # Room for two: the file and the function three messages work on, not the first listed.
    assert pack_salient(groups, 30).split(", ") == ["src/library.py", "parse_bits"]


def test_a_name_keeps_its_possessive_as_written() -> None:
    text = "We played Baldur's Gate; the title is 'Netrunner's Gambit'. Ask Maria's sister."
    assert fact_items(text) == ["Baldur's Gate", "Netrunner's Gambit", "Maria's"]


def test_a_fact_list_with_a_possessive_leaves_out_the_bare_name() -> None:
    # `Maria's` holds `Maria`: listing both spends room on one name.
    groups = [[(1, "Maria")], [(1, "Maria"), (1, "Maria's"), (1, "Lisbon")]]
    assert pack_salient(groups, 100) == "Maria's, Lisbon"


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
    groups = [[(2, fact) for fact in fact_items(text)]]
    assert pack_salient(groups, 100) == "300,000, $12,500.50"


def test_a_capitalized_word_after_a_dash_goes_on_with_the_sentence() -> None:
    text = (
        "The migration is half done \u2014 Products 1 and 2 are moved. Update \u2013 the board met."
    )
    assert name_matches(text) == ["Products"]


def test_a_name_with_inner_capitals_keeps_its_possessive() -> None:
    text = "we moved to FSDP \u2014 PyTorch's own, like YouTube's player and McDonald's fries"
    assert name_matches(text) == ["FSDP", "PyTorch's", "YouTube's", "McDonald's"]


def test_a_fact_list_with_a_plural_leaves_out_the_singular() -> None:
    groups = [[(0, "A100"), (1, "GPU")], [(0, "A100s"), (1, "GPUs"), (1, "classes")]]
    assert pack_salient(groups, 100) == "A100s, GPUs, classes"
    # A question mark the fact pattern took along makes no second fact.
    assert pack_salient([[(1, "TensorRT?")], [(1, "TensorRT"), (0, "INT8")]], 100) == (
        "TensorRT?, INT8"
    )


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


def test_facts_are_ranked_code_and_ids_first_in_order_of_appearance() -> None:
    assert facts._ranked_facts('see `xy` and a_1 at 1,000 in "the red door"') == [
        (0, 0, "xy"), (0, 1, "a_1"), (2, 3, "000"), (1, 4, "the red door"), (2, 5, "1,000"),
    ]  # fmt: skip


def test_names_drop_the_words_that_are_no_names_before_them() -> None:
    text = "we met Jay Chou and then OK Bob\tSmith, and I Ann with I"
    found = facts._name_facts(text, 0, len(text), facts._NOT_NAMES)
    assert found == ["Jay Chou", "Bob Smith"]


def test_shape_counts_group_a_message_s_facts_with_digits_by_shape() -> None:
    assert shape_counts([(0, "Turn 12"), (1, "turn 3")]) == {"turn 0": {"Turn 12", "turn 3"}}


def test_unshown_keeps_the_facts_not_in_the_text_and_remembers_answers() -> None:
    shown = {"cd": False}
    assert facts.unshown([(0, "ab"), (1, "cd")], shown, facts.occurs_in("xab")) == [(1, "cd")]
    assert shown == {"cd": False, "ab": True}


def test_a_fact_another_holds_or_pluralizes_is_left_out_of_a_salient_list() -> None:
    held = [[(1, "b"), (1, "a b"), (0, "GPUs")], [(1, "b"), (0, "GPU")]]
    assert pack_salient(held, 99, frozenset()) == "a b, GPUs"
