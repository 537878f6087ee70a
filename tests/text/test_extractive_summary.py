"""The deterministic extractive summarizer keeps hard content and drops filler."""

from __future__ import annotations

import json

from proxy.text.extractive_summary import SentenceCache, summarize_text
from proxy.text.facts import FactMemo, all_matches, facts_of_matches

PROSE = (
    "Sure, happy to help with that! "
    "The crash comes from aider/utils.py where run_install calls subprocess.Popen twice. "
    "It was a long day and everyone was tired and the weather was grey and wet outside. "
    "We decided to use the Spinner class instead of the inline spinner. "
    "Thanks again for your patience with all of this."
)


def test_code_fences_survive_verbatim() -> None:
    code = "```python\ndef warm_cache():\n    return {}\n```"
    out = summarize_text(f"{PROSE}\n\n{code}\n\nLet me know if you need anything else.")
    assert code in out


def test_filler_is_dropped_and_fact_sentences_kept() -> None:
    out = summarize_text(PROSE, ratio=0.5)
    assert "happy to help" not in out
    assert "Thanks again" not in out
    assert "aider/utils.py" in out


def test_facts_of_dropped_sentences_follow_on_a_facts_line() -> None:
    text = "Nothing much happened here at all today. " * 3 + "The id is HAT136 on 2024-05-20."
    out = summarize_text(text, ratio=0.05)
    assert "facts:" in out
    assert "HAT136" in out
    assert "2024-05-20" in out


def test_a_json_document_is_returned_unchanged() -> None:
    doc = json.dumps({"user_id": "mia_li_3668", "amount": 250})
    assert summarize_text(doc) == doc


def test_traceback_paragraph_is_kept_as_hard_content() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "app.py", line 3, in <module>\n'
        "KeyError: 'user_7'"
    )
    out = summarize_text(f"{PROSE}\n\n{tb}", ratio=0.2)
    assert tb in out


def test_fact_items_find_paths_ids_urls_amounts_and_names() -> None:
    text = "See https://x.org/a?b=1 and src/app.py; mia_li_3668 paid $250 for HAT136 via warmCache."
    assert facts_of_matches(all_matches(text)) == [
        "https://x.org/a?b=1",
        "src/app.py",
        "mia_li_3668",
        "$250",
        "HAT136",
        "warmCache",
    ]


def test_summaries_are_deterministic() -> None:
    text = PROSE * 4 + "\n\n```sh\nmake test\n```"
    assert summarize_text(text) == summarize_text(text)


def test_a_shared_sentence_cache_changes_no_summary() -> None:
    texts = [
        f"{PROSE}\n\nThe error was in src/mod_{i}.py line {i}. {PROSE}\n\n```\nx = {i}\n```"
        for i in range(4)
    ] + [PROSE, "Thanks again for your patience with all of this. It failed in `run_{7}`."]
    cache = SentenceCache()
    shared = [summarize_text(t, 0.3, 120, cache) for t in texts + texts]
    assert shared == [summarize_text(t, 0.3, 120) for t in texts + texts]
    assert cache.scores
    assert cache.facts.pieces


def test_a_shared_fact_memo_changes_no_matches() -> None:
    code = "\n".join(
        f"def handler_{k}(request):\n    return lookup(request, 'user_1')" for k in range(5)
    )
    texts = [
        code,
        PROSE,
        f"{PROSE}\n`warm_cache()` failed: KeyError user_1",
        code,
        '{"id": "A1B2C"}',
    ]
    memo = FactMemo()
    assert [memo.piece(t) for t in texts + texts] == [all_matches(t) for t in texts + texts]
    assert memo.pieces
    assert memo.tokens
