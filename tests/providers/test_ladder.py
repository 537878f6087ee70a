"""What the engine keeps longest: tool results the recent turns still talk about, whatever age."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.providers.engine import EngineProvider
from proxy.providers.engine_forms import DROPPED, MASKED, SUMMARY, fact_text
from proxy.providers.ladder import keep_keys, ladder, reactions
from proxy.providers.relevance import (
    LineHits,
    Relevance,
    heaviest,
    line_hits,
    relevant_lines,
    terms,
)
from proxy.providers.units import message_text, split_units
from tests.providers.build import assistant, system, tool, user
from tests.providers.tokens import count_tokens, make_config


def _listing(k: int) -> str:
    return "\n".join(f"-rw-r--r-- 1 dev dev {k * 100 + j} notes_{k}_{j}.txt" for j in range(60))


def _run() -> list[dict[str, object]]:
    """An agent run: the task names `parse_header`; an old file view holds it, the newer
    listings do not."""
    view = "\n".join(
        [f"def helper_{k}(value):\n    return value + {k}" for k in range(40)]
        + ["def parse_header(raw):", "    return raw.split(':')"]
        + [f"def other_{k}(value):\n    return value * {k}" for k in range(40)]
    )
    out = [system(), user("Fix the bug in parse_header: it drops the value after a colon.")]
    out += [assistant("Reading the parser.", "c0"), tool("c0", view)]
    for k in range(1, 7):
        out += [assistant(f"Listing step {k}.", f"c{k}"), tool(f"c{k}", _listing(k))]
    out += [assistant("Checking parse_header once more.", "c9"), tool("c9", "parse_header ok")]
    return out


def test_terms_are_lowered_words_split_at_punctuation() -> None:
    assert terms("Fix `parse_header()` in src/Net.py!") == [
        "fix",
        "parse_header",
        "in",
        "src",
        "net",
        "py",
    ]


def test_bm25_prefers_the_document_sharing_the_rarer_query_term() -> None:
    docs = [set(terms(t)) for t in ("alpha beta", "alpha gamma", "alpha delta")]
    relevance = Relevance([(d, 2) for d in docs], ["alpha", "gamma"])
    assert relevance.score(1) > relevance.score(0) == relevance.score(2) > 0


def test_a_relevant_old_output_outlives_irrelevant_newer_ones() -> None:
    messages = _run()
    keys, weights = keep_keys(messages, [fact_text(m) for m in messages], [1, 16, 17])
    assert "parse_header" in weights
    assert keys[3] > max(keys[i] for i in range(5, 15, 2))  # the old view, the listings


def test_every_stale_output_is_masked_before_any_message_is_summarized() -> None:
    messages = _run()
    units = split_units(messages)
    keys, _ = keep_keys(messages, [fact_text(m) for m in messages], [1, 16, 17])
    fixed = frozenset({0, 1, len(messages) - 1})
    steps = ladder(units, messages, keys, fixed=fixed, can_drop=[True] * len(units))
    levels = [s.level for s in steps]
    assert levels.index(SUMMARY) > max(i for i, lv in enumerate(levels) if lv == MASKED)
    # A unit is dropped only after its last message was reduced.
    first_drop = levels.index(DROPPED)
    dropped_unit = steps[first_drop].unit
    reduced = {s.message for s in steps[:first_drop] if s.unit == dropped_unit}
    assert reduced == set(units[dropped_unit].indices())


def test_a_mask_keeps_the_lines_the_recent_turns_talk_about() -> None:
    messages = _run()
    limit = count_tokens(messages) * 3 // 10
    result = EngineProvider().compress(messages, make_config(limit))
    view = message_text(next(m for m in result.messages if m.get("tool_call_id") == "c0"))
    assert view.startswith("[compactd:ref=")
    assert "def parse_header(raw):" in view
    assert "helper_30" not in view  # the middle that mentions nothing relevant


def test_relevant_lines_are_found_a_piece_at_a_time_in_a_text_without_line_breaks() -> None:
    # 5 MB on one line: every search is bounded by one piece, and a long line gives the part
    # around its hit.
    text = "x" * 5_000_000 + " needle " + "y" * 100
    hits = line_hits(text, heaviest({"needle": 1.0}))
    lines = relevant_lines(hits, 0, len(text), 300)
    assert len(lines) == 1
    assert "needle" in lines[0]
    assert len(lines[0]) <= 240


def test_an_output_the_agent_acts_on_outlives_one_it_passes_over() -> None:
    # Neither output shares a term with the task or the final turns; the agent's next message
    # edits what the first one showed and shrugs at the second.
    view = "def load_config(where):\n    settings = read_yaml(where)\n    return settings"
    noise = "Please use exactly one block per reply.\nSee the formatting notes."
    messages = [
        system(),
        user("Make startup faster."),
        assistant("Looking around.", "c0"),
        tool("c0", view),
        assistant("Replacing read_yaml with cached_yaml in load_config.", "c1"),
        tool("c1", noise),
        assistant("Understood, retrying.", "c2"),
        tool("c2", "done"),
    ]
    keys, _ = keep_keys(messages, [fact_text(m) for m in messages], [1, 6, 7])
    assert keys[3] > keys[5]


def test_the_reaction_to_parallel_results_is_the_next_assistant_message() -> None:
    messages = [
        system(),
        user("Go."),
        {"role": "assistant", "content": None, "tool_calls": []},
        tool("a", "one"),
        tool("b", "two"),
        assistant("Both read.", "c"),
        tool("c", "three"),
    ]
    assert reactions(messages) == {3: 5, 4: 5}


def test_a_mask_keeps_the_lines_the_agent_took_up_in_its_next_message() -> None:
    # The task and the final turns never name `retry_budget`; the agent's reaction to the view
    # does. Masked, the view keeps that line from its middle (head and tail aside).
    view = "\n".join(
        [f"def helper_{k}(value):\n    return value + {k}" for k in range(40)]
        + ["    retry_budget = compute_retry_budget(limit)"]
        + [f"def other_{k}(value):\n    return value * {k}" for k in range(40)]
    )
    messages = [system(), user("Make the client give up sooner.")]
    messages += [assistant("Reading the client.", "c0"), tool("c0", view)]
    messages += [assistant("The retry_budget comes from compute_retry_budget; lowering it.", "c1")]
    messages += [tool("c1", "edited")]
    for k in range(2, 12):
        messages += [assistant(f"Listing step {k}.", f"c{k}"), tool(f"c{k}", _listing(k))]
    limit = count_tokens(messages) * 3 // 10
    result = EngineProvider().compress(messages, make_config(limit))
    masked = message_text(next(m for m in result.messages if m.get("tool_call_id") == "c0"))
    assert masked.startswith("[compactd:ref=")
    assert "retry_budget = compute_retry_budget(limit)" in masked
    assert "helper_30" not in masked


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sets(st.sampled_from("abcdefgh")), max_size=12),
    st.lists(st.sampled_from("abcdefghxy"), max_size=10),
)
def test_weight_sum_and_score_add_the_same_weights_in_the_same_order(
    docs: list[set[str]], query: list[str]
) -> None:
    relevance = Relevance([(d, len(d)) for d in docs], query)
    for found in [set(query), *docs]:
        assert relevance.weight_sum(found) == sum(map(relevance.weight, found))
    for d, (doc, length) in enumerate(relevance.documents):
        norm = 1.2 * (1 - 0.75 + 0.75 * length / relevance.avg)
        gain = 2.2 / (1 + norm)
        assert relevance.score(d) == gain * sum(
            relevance.idf[t] for t in relevance.idf.keys() & doc
        )


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "bb", "ccc dd", "", "x" * 300, "a"]), min_size=1, max_size=12),
    st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=12, max_size=12),
    st.integers(0, 40),
    st.integers(1, 120),
)
def test_relevant_lines_take_the_heaviest_first_ties_in_text_order(
    lines: list[str], weights: list[float], start: int, max_chars: int
) -> None:
    text = "\n".join(lines)
    starts = [sum(len(ln) + 1 for ln in lines[:k]) for k in range(len(lines))]
    scores = {at: weights[k] for k, at in reversed(list(enumerate(starts)))}  # ties: many
    hits = LineHits(text, scores, dict.fromkeys(starts, 0) | {at: at for at in starts})
    found = relevant_lines(hits, start, len(text), max_chars)
    # The reference: every line in range, by (-weight, offset), taken while it fits.
    used, chosen, seen = 0, [], set()
    for at in sorted((s for s in scores if start <= s), key=lambda s: (-scores[s], s)):
        if used >= max_chars - 1:
            break
        stop = text.find("\n", at, min(len(text), at + 960))
        body = text[at : stop if stop >= 0 else min(len(text), at + 960)].strip()
        body = body if len(body) <= 240 else text[at : at + 240].strip()
        if body and body not in seen and used + len(body) + 1 <= max_chars:
            seen.add(body)
            chosen.append((at, body))
            used += len(body) + 1
    assert found == [body for _at, body in sorted(chosen)]
