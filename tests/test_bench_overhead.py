"""The overhead benchmark's own logic: bodies, SSE splitting, percentiles, report, profiles."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "overhead"
sys.path.insert(0, str(BENCH))

import bodies  # noqa: E402
import loadgen  # noqa: E402
import report  # noqa: E402
import spy  # noqa: E402


def test_sse_body_splits_back_into_its_events_byte_for_byte() -> None:
    events = bodies.sse_events(32)
    assert len(events) == 32
    assert loadgen.split_events(b"".join(events)) == events
    assert events[-1] == b"data: [DONE]\n\n"
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)


def test_split_events_keeps_a_trailing_partial_event_so_it_counts_as_different() -> None:
    assert loadgen.split_events(b"data: a\n\ndata: b") == [b"data: a\n\n", b"data: b"]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert loadgen.percentile(values, 50) == 50.0
    assert loadgen.percentile(values, 99) == 99.0
    assert loadgen.percentile([3.0], 99) == 3.0


def test_chat_body_is_about_2_kb_and_streams_only_when_asked() -> None:
    plain, streamed = json.loads(bodies.chat_body()), json.loads(bodies.chat_body(stream=True))
    assert 1500 <= len(bodies.chat_body()) <= 2500
    assert "stream" not in plain
    assert streamed["stream"] is True


def test_large_body_is_400_kb_of_turns_ending_on_a_user_message() -> None:
    raw = bodies.large_body()
    body = json.loads(raw)
    assert len(raw) >= 400_000
    assert body["model"] == bodies.MODEL_LARGE
    assert body["messages"][-1]["role"] == "user"
    assert all(isinstance(m["content"], str) for m in body["messages"])


def _result(rps_latency: float, n: int = 100) -> loadgen.Result:
    res = loadgen.Result(latencies=[rps_latency] * n, ttfbs=[rps_latency / 2] * n, elapsed=1.0)
    res.events_total = res.events_identical = 10
    return res


def test_report_puts_targets_side_by_side_and_marks_one_that_did_not_start() -> None:
    scs = [loadgen.Scenario(n, b"{}", concurrency=1, requests=1) for n in "abcd"]
    results: report.Results = {
        "direct": {n: _result(0.001) for n in "abcd"},
        "naive-aiohttp": {n: _result(0.002) for n in "abcd"},
        "compactd-aiohttp": "did not start: boom",
    }
    table = report.render_table(results, scs)
    header = table.splitlines()[0]
    assert header == "| metric | direct | naive-aiohttp | compactd-aiohttp |"
    assert "| (a) added latency p50 ms | +0.00 | +1.00 | — |" in table
    assert "did not start: boom" in table


def test_target_checks_mark_met_and_missed_targets() -> None:
    results: report.Results = {
        "direct": {n: _result(0.001) for n in "abcd"},
        "naive-aiohttp": {n: _result(0.001) for n in "abcd"},
        "compactd-aiohttp": {n: _result(0.0015) for n in "abcd"},
    }
    checks = report.target_checks(results)
    assert "- [x] added p50 at c=1 <= 1.0 ms: 0.50" in checks
    assert "- [ ] 400 KB bodies >= 500 req/s: 100.00" in checks
    assert "- [x] SSE events byte-identical = 100%: 100.00" in checks


def test_profile_summary_ranks_self_time_and_our_own_functions(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "main (/x/proxy/cli.py:1);send (/v/site-packages/aiohttp/client.py:9) 30\n"
        "main (/x/proxy/cli.py:1);prepare (/x/proxy/compaction.py:5) 10\n"
    )
    md = spy.summarise(raw)
    assert "samples: 40" in md
    assert "| 75.0 | `send (aiohttp/client.py)` |" in md
    assert "| 100.0 | `main (proxy/cli.py)` |" in md


def test_rounds_merge_into_one_result_with_summed_time_and_counts() -> None:
    first, second = _result(0.001, n=10), _result(0.003, n=30)
    second.errors = 2
    merged = first.merged(second)
    assert len(merged.latencies) == 40
    assert merged.errors == 2
    assert merged.elapsed == 2.0
    assert merged.rps == 20.0
    assert merged.events_total == 20
