"""bench/corpora conversions and bench/quality's probe rule, on small in-repo conversations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import locations
from bench.corpora import agent_messages, patch_answers, split_of
from bench.corpora_extra import irc_messages, irc_threads, windowed_messages
from bench.probes import answer_items, specific_items
from bench.quality import (
    MARKER_TOKENS,
    Bound,
    Case,
    can_fit,
    host_speed,
    load_new,
    verbatim_bound,
)
from proxy.providers.validate import pairing_problems

PATCH = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -10,7 +10,7 @@ def compute_total(items):
-    return sum(i.price for i in items)
+    return sum(i.price * i.qty for i in items)
"""


def test_agent_steps_become_tool_calls_and_the_run_ends_before_submission() -> None:
    raw = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "THOUGHT: look\n\n```bash\nls -la\n```"},
        {"role": "user", "content": "<returncode>0</returncode><output>a.py</output>"},
        {"role": "assistant", "content": "no block here"},
        {"role": "user", "content": "Please always provide exactly one bash block."},
        {
            "role": "assistant",
            "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
        },
        {"role": "user", "content": "diff --git ..."},
    ]
    out = agent_messages(raw)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "assistant", "user"]
    call = out[2]["tool_calls"][0]
    assert out[2]["content"] == "THOUGHT: look"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la"}
    assert out[3]["tool_call_id"] == call["id"]
    assert not pairing_problems(out)


def test_patch_answers_are_files_functions_and_removed_lines() -> None:
    assert patch_answers(PATCH) == [
        "pkg/mod.py",
        "compute_total",
        "return sum(i.price for i in items)",
    ]


def test_split_is_stable_and_holds_out_about_a_fifth() -> None:
    ids = [f"case-{i}" for i in range(1000)]
    held = sum(split_of(i) == "held-out" for i in ids)
    assert 150 < held < 250
    assert [split_of(i) for i in ids] == [split_of(i) for i in ids]


def test_specific_items_are_quotes_numbers_and_names_not_sentence_starts() -> None:
    text = 'Yesterday we watched "Taxi Driver" at Green Meadow Park, then ran 5km at 7:30.'
    assert specific_items(text) == {"Taxi Driver", "Green Meadow Park", "5km", "7:30"}
    # An answer's first word is capitalized because it starts the answer: not a name.
    assert answer_items(["Moved from NYC to San Francisco", "Processes 2TB daily"]) == {
        "NYC",
        "San Francisco",
        "2TB",
    }


def test_a_request_is_feasible_without_its_final_tool_results() -> None:
    big = "x " * 2000
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": big},
    ]
    case = Case("t", "id", messages, None, [])

    def count(ms: object) -> int:
        return len(json.dumps(ms)) // 4

    assert can_fit(case, count, 100)
    assert not can_fit(case, count, 5)


def test_a_feasible_request_has_room_for_the_calls_its_final_results_answer() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "a " * 200}}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "thinking " * 300, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x " * 2000},
    ]
    case = Case("t", "id", messages, None, [])

    def count(ms: object) -> int:
        return len(json.dumps(ms)) // 4

    calls = count([messages[0], messages[1], {**messages[2], "content": None}])
    # The call stays (its result may only be cut), the text of its message need not; a marker
    # names the ref of each: the dropped messages', the text's and the cut result's.
    assert not can_fit(case, count, calls + 40)
    assert can_fit(case, count, calls + 60)
    # Without text, the call's message needs no marker of its own.
    bare = {**case.messages[2], "content": None}
    assert can_fit(Case("t", "id", [*messages[:2], bare, messages[3]], None, []), count, calls + 40)


def test_the_verbatim_bound_keeps_the_densest_messages_and_bounds_every_whole_pick() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "Alice lives in Oslo " + "pad " * 40},
        {"role": "assistant", "content": "Noted Alice."},
        {"role": "user", "content": "Bob moved " + "pad " * 200},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "where does she live?"},
    ]
    case = Case("t", "id", messages, None, ["Alice", "Oslo", "Bob"])

    def one(m: object) -> int:
        return len(json.dumps(m)) // 4

    def count(ms: object) -> int:
        return sum(one(m) for m in ms)  # type: ignore[attr-defined]

    base = count([messages[0], messages[5]]) + MARKER_TOKENS
    # Room for the short message naming Alice and the 40-pad one holding Alice and Oslo: the
    # pick keeps both names; the bound counts Alice twice (it never says less than a pick).
    bound = verbatim_bound(case, count, one, base + one(messages[1]) + one(messages[2]))
    assert (bound.greedy, bound.most) == (2, 3)
    # The short message alone would split the dropped run in two: its second marker does not fit.
    assert verbatim_bound(case, count, one, base + one(messages[2])).greedy == 0
    # Nothing fits besides what must stay: nothing is kept, and no pick could keep any.
    assert verbatim_bound(case, count, one, base - 1) == Bound(0, 0)
    everything = verbatim_bound(case, count, one, count(messages) + MARKER_TOKENS)
    assert (everything.greedy, everything.most) == (3, 3)


def test_the_host_speed_line_gives_both_workloads_a_positive_time() -> None:
    line = host_speed(rounds=1)
    figures = re.findall(r"(tiktoken|Python) (\d+\.\d) ms", line)
    assert [name for name, _ in figures] == ["tiktoken", "Python"]
    assert all(float(ms) > 0 for _, ms in figures)


def test_windowed_agent_steps_become_tool_calls_and_the_run_ends_before_submit() -> None:
    window = "[File: /repo/pkg/mod.py (240 lines total)]\n10:def compute_total(items):"
    history = [
        {"role": "system", "content": "SETTING: windowed editor"},
        {"role": "user", "content": "demonstration", "is_demo": True},
        {"role": "user", "content": "ISSUE: totals ignore quantities"},
        {"role": "assistant", "content": "x", "thought": "Open it.", "action": "open pkg/mod.py\n"},
        {"role": "user", "content": window},
        {"role": "assistant", "content": "y", "thought": "", "action": "goto 10"},
        {"role": "tool", "content": window},
        {"role": "assistant", "content": "z", "thought": "Done.", "action": "submit\n"},
        {"role": "user", "content": "diff --git ..."},
    ]
    out = windowed_messages(history)
    steps = ["assistant", "tool"] * 2
    assert [m["role"] for m in out] == ["system", "user", "user", *steps]
    first = out[3]["tool_calls"][0]
    assert out[3]["content"] == "Open it."
    assert json.loads(first["function"]["arguments"]) == {"command": "open pkg/mod.py"}
    assert out[5]["content"] is None
    assert out[6]["content"] == window
    assert not pairing_problems(out)


def test_irc_threads_follow_reply_links_and_the_first_speaker_is_the_user() -> None:
    raw = "\n".join(
        [
            "[10:00] <ana> my wifi drops after suspend",
            "[10:00] <bob> unrelated: anyone on 24.04?",
            "[10:01] <cy> ana: see https://help.ubuntu.com/community/WifiDocs",
            "[10:01] <cy> ana: and paste `dmesg` to paste.ubuntu.com",
            "[10:02] <ana> thanks, here: http://paste.ubuntu.com/123/",
        ]
    )
    links = "0 0 -\n1 1 -\n0 2 -\n2 3 -\n3 4 -\n"
    threads = sorted(irc_threads(raw, links), key=len)
    assert [len(t) for t in threads] == [1, 4]
    messages = irc_messages(threads[1], "#ubuntu")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"].splitlines() == [
        "<cy> ana: see https://help.ubuntu.com/community/WifiDocs",
        "<cy> ana: and paste `dmesg` to paste.ubuntu.com",
    ]
    assert messages[-1]["content"] == "thanks, here: http://paste.ubuntu.com/123/"


def test_a_small_agent_corpus_gives_a_case_per_cut_with_the_run_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    run = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(5):
        step = {**call, "id": f"c{i}"}
        run += [
            {"role": "assistant", "content": None, "tool_calls": [step]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"},
        ]
    row = {"id": "r1", "split": "held-out", "messages": run, "answers": []}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    monkeypatch.setattr(locations, "converted", lambda label: rows)
    cases = load_new("swe-windowed", None)
    assert [c.id for c in cases] == ["r1@40%", "r1@60%", "r1@80%"]
    assert {c.split for c in cases} == {"held-out"}
    assert [len(c.messages) for c in cases] == [4, 8, 10]
