"""The overhead benchmark's own logic: bodies, SSE splitting, percentiles, report, profiles."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "overhead"
sys.path.insert(0, str(BENCH))

import bodies  # noqa: E402
import loadgen  # noqa: E402
import report  # noqa: E402
import spy  # noqa: E402
import wrkgen  # noqa: E402


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


def test_large_body_is_400_kb_of_turns_ending_on_a_user_message(tmp_path: Path) -> None:
    raw = bodies.large_body(corpus=tmp_path / "absent.jsonl")  # the stdlib-sources fallback
    body = json.loads(raw)
    assert len(raw) >= 400_000
    assert body["model"] == bodies.MODEL_LARGE
    assert body["messages"][-1]["role"] == "user"
    assert all(isinstance(m["content"], str) for m in body["messages"])


def test_large_body_takes_the_corpus_turns_in_order_when_the_corpus_is_there(
    tmp_path: Path,
) -> None:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * 1000}
        for i in range(600)
    ]
    corpus = tmp_path / "sessions.jsonl"
    corpus.write_text(
        "".join(json.dumps({"messages": turns[i : i + 100]}) + "\n" for i in range(0, 600, 100))
    )
    body = json.loads(bodies.large_body(corpus=corpus))
    sent = body["messages"]
    assert sent[0]["role"] == "system"
    assert len(json.dumps(sent)) >= 400_000
    assert sent[1 : len(sent) - 1] == turns[: len(sent) - 2]
    assert sent[-1]["role"] == "user"


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
        "main (/x/proxy/cli/main.py:1);send (/v/site-packages/aiohttp/client.py:9) 30\n"
        "main (/x/proxy/cli/main.py:1);prepare (/x/proxy/chat/compactor.py:5) 10\n"
    )
    md = spy.summarise(raw)
    assert "samples: 40" in md
    assert "| 75.0 | `send (aiohttp/client.py)` |" in md
    assert "| 100.0 | `main (proxy/cli/main.py)` |" in md


def test_rounds_merge_into_one_result_with_summed_time_and_counts() -> None:
    first, second = _result(0.001, n=10), _result(0.003, n=30)
    second.errors = 2
    merged = first.merged(second)
    assert len(merged.latencies) == 40
    assert merged.errors == 2
    assert merged.elapsed == 2.0
    assert merged.rps == 20.0
    assert merged.events_total == 20


def test_wrk_command_is_one_thread_closed_loop_in_whole_seconds(tmp_path: Path) -> None:
    argv = wrkgen.wrk_argv("/usr/bin/wrk", "http://127.0.0.1:1/v1", tmp_path / "s.lua", 32, 3.4)
    assert argv == [
        "/usr/bin/wrk", "-t1", "-c32", "-d3s", "--timeout", "30s",
        "-s", str(tmp_path / "s.lua"), "http://127.0.0.1:1/v1",
    ]  # fmt: skip
    assert "-d1s" in wrkgen.wrk_argv("wrk", "u", tmp_path, 1, 0.2)


def test_wrk_script_posts_the_body_and_compares_every_answer(tmp_path: Path) -> None:
    plain = wrkgen.lua_script(tmp_path / "body", tmp_path / "want", stream=False)
    streamed = wrkgen.lua_script(tmp_path / "body", tmp_path / "want", stream=True)
    assert 'wrk.method = "POST"' in plain
    assert f"slurp([[{tmp_path / 'body'}]])" in plain
    assert "if body ~= expected then mismatched = mismatched + 1 end" in plain
    assert "x-bench-stream" not in plain
    assert 'wrk.headers["x-bench-stream"] = "1"' in streamed


def test_wrk_totals_count_only_200s_and_every_other_answer_as_an_error() -> None:
    line = wrkgen.MARK + json.dumps(
        {"requests": 1000, "duration_us": 2_000_000, "ok": 990, "mismatched": 3,
         "connect": 0, "read": 1, "write": 0, "status": 10, "timeout": 2}
    )  # fmt: skip
    totals = wrkgen.parse_output("Running 2s test @ http://x\n" + line + "\n")
    res = wrkgen.to_result(totals)
    assert res.count == 990
    assert res.rps == 495.0
    assert res.errors == 13  # 10 non-200 answers, a read error and two timeouts
    assert res.mismatched_bodies == 3
    assert res.latencies == []  # wrk's histogram is corrected, so none are kept
    streamed = wrkgen.to_result(totals, events_per_answer=32)
    assert streamed.events_total == 990 * 32
    assert streamed.events_identical == 987 * 32
    assert streamed.mismatched_bodies == 0


def test_wrk_output_without_totals_is_an_error() -> None:
    with pytest.raises(ValueError, match="no WRKJSON line"):
        wrkgen.parse_output("unable to connect to 127.0.0.1:1 Connection refused")


def test_cpu_per_request_and_other_processes_use_the_completed_count() -> None:
    res = loadgen.Result(completed=500, elapsed=2.0, server_cpu=0.5, client_cpu=0.05)
    res.upstream_cpu, res.machine_cpu = 0.05, 1.0
    assert res.cpu_ms_per_request == pytest.approx(1.0)
    assert res.client_cpu_ms_per_request == pytest.approx(0.1)
    assert res.upstream_cpu_ms_per_request == pytest.approx(0.1)
    assert res.other_cores == pytest.approx(0.2)  # (1.0 - 0.6) CPU seconds over 2 s
    assert res.merged(res).count == 1000


def test_workers_table_gives_the_ratio_and_the_bound_the_cpu_costs_allow() -> None:
    def run(rps: float, proxy_ms: float) -> loadgen.Result:
        n = int(rps * 10)
        return loadgen.Result(
            completed=n, elapsed=10.0, server_cpu=n * proxy_ms / 1000, client_cpu=n * 0.00005
        )

    results: report.Results = {
        "compactd-aiohttp": {"b": run(1000, 1.0), "c": run(1000, 1.0)},
        "compactd-aiohttp-w2": {"b": run(1800, 1.05), "c": run(1500, 1.2)},
    }
    # Two runs of (b) with two workers: the fewer a worker held in any run is shown.
    results["compactd-aiohttp-w2"]["b"].spreads = [(15, 17), (11, 21)]
    table = report.workers_table(results)
    assert "| (b) c=32 | 1 | 1,000 (1.00) | 1.00x | 1.00x | 0.05 | 0.00 | - |" in table
    assert "| (b) c=32 | 2 | 1,800 (1.05) | 1.80x | 1.82x | 0.05 | 0.00 | 11 of 32 |" in table
    assert "| (c) 64 streams | 2 | 1,500 (1.20) | 1.50x | 1.60x | 0.05 | 0.00 | - |" in table
    assert len(results["compactd-aiohttp-w2"]["b"].merged(run(1, 1)).spreads) == 2
    one = loadgen.Result(completed=1, elapsed=1.0, spreads=[(15, 17)])
    assert report.describe(one).endswith(", 0 errors, connections per worker 15/17")


def test_report_shows_a_dash_where_the_load_generator_kept_no_latencies() -> None:
    scs = [loadgen.Scenario("b", b"{}", concurrency=32, seconds=1)]
    results: report.Results = {"direct": {"b": loadgen.Result(completed=10, elapsed=1.0)}}
    table = report.render_table(results, scs)
    assert "| (b) c=32: req/s | 10 |" in table
    assert "| (b) c=32: latency p99 ms | — |" in table


class _Fixed(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        body = b"bad" if self.path == "/bad" else b'{"ok":true}'
        self.send_response(200 if self.path != "/missing" else 404)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fixed_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fixed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_wrk_counts_right_bodies_mismatches_and_non_200s(fixed_server: str) -> None:
    if shutil.which("wrk") is None:
        if os.environ.get("CI", "").lower() == "true":
            raise AssertionError("wrk is not installed: apt-get install wrk (.ci/run does)")
        pytest.skip("wrk not installed (apt-get install wrk)")
    sc = loadgen.Scenario("b", b'{"model":"m"}', concurrency=2, seconds=1)
    # The server is a thread of this process: "both workers" hold wrk's 2 connections.
    workers = [os.getpid(), os.getpid()]
    good = asyncio.run(
        wrkgen.run_wrk_scenario(
            fixed_server + "/ok", sc, b'{"ok":true}', [], warmup=0, workers=workers
        )
    )
    assert good.count > 0
    assert (good.errors, good.mismatched_bodies) == (0, 0)
    assert good.client_cpu > 0
    assert good.spreads == [(2, 2)]
    bad = asyncio.run(
        wrkgen.run_wrk_scenario(fixed_server + "/bad", sc, b'{"ok":true}', [], warmup=0)
    )
    assert bad.mismatched_bodies == bad.count > 0
    missing = asyncio.run(wrkgen.run_wrk_scenario(fixed_server + "/missing", sc, b"", [], warmup=0))
    assert missing.count == 0
    assert missing.errors > 0


def test_workers_adds_a_multi_worker_copy_of_each_chosen_naive_target_as_the_control() -> None:
    import run

    chosen = run.choose_targets("naive-aiohttp,compactd-aiohttp", "1,2", [])
    got = [(t.name, t.kind, t.transport, t.workers) for t in chosen]
    assert got == [
        ("naive-aiohttp", "naive", "aiohttp", 1),
        ("compactd-aiohttp", "compactd", "aiohttp", 1),
        ("compactd-aiohttp-w2", "compactd", "aiohttp", 2),
        ("naive-aiohttp-w2", "naive", "aiohttp", 2),
    ]
    assert [t.name for t in run.choose_targets("compactd-aiohttp", "1", [])] == ["compactd-aiohttp"]


def test_a_variant_runs_with_each_worker_count_too(tmp_path: Path) -> None:
    import run

    chosen = run.choose_targets("compactd-aiohttp", "1,2", [f"compactd-x={tmp_path}"])
    got = [(t.name, t.pythonpath, t.workers) for t in chosen]
    assert got == [
        ("compactd-aiohttp", "", 1),
        ("compactd-aiohttp-w2", "", 2),
        ("compactd-x", str(tmp_path.resolve()), 1),
        ("compactd-x-w2", str(tmp_path.resolve()), 2),
    ]


def test_a_multi_worker_naive_target_runs_its_workers_on_every_core(tmp_path: Path) -> None:
    import run

    two = run.Target("naive-aiohttp-w2", "naive", "aiohttp", workers=2)
    server = run.server_for(two, "http://127.0.0.1:1/v1", 0, tmp_path)
    argv = server._argv
    assert argv[-4:-1] == ["aiohttp", str(server.port), "http://127.0.0.1:1/v1"]
    assert argv[-1] == "2"
    if argv[0] == "taskset":
        assert argv[2] == ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    server.log.unlink(missing_ok=True)


def test_workers_table_of_the_naive_control_compares_it_with_its_own_single_worker() -> None:
    def run_(rps: float) -> loadgen.Result:
        n = int(rps * 10)
        return loadgen.Result(completed=n, elapsed=10.0, server_cpu=n / 1000)

    results: report.Results = {
        "naive-aiohttp": {"b": run_(1000)},
        "compactd-aiohttp": {"b": run_(500)},
        "compactd-aiohttp-w2": {"b": run_(900)},
        "naive-aiohttp-w2": {"b": run_(1600)},
    }
    table = report.workers_table(results, "naive-aiohttp")
    assert "| (b) c=32 | 2 | 1,600 (1.00) | 1.60x |" in table
    assert "900" not in table


def test_cpu_scaling_control_reports_cpu_per_unit_alone_and_both_busy() -> None:
    import cpuscale

    assert all(callable(f) and f() for f in cpuscale.UNITS.values())
    # alone: 1,000 units in 2 CPU s per phase; both busy: each of two did 900 in 2 CPU s.
    row = cpuscale.summarise("json", [(1000, 2.0)] * 4, [(900, 2.0)] * 8, 2.0)
    assert row.startswith("| json | 2000.00 (2000.00) | 2222.22 (2222.22) | +11.1 % |")
    assert row.endswith("| 500 | 900 | 1.80x |")


def test_a_run_waits_for_the_machine_to_be_quiet_but_not_longer_than_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import run

    busy = iter([0.0, 0.5, 0.5, 1.0, 1.0, 1.01])  # 1 core busy, 1 core, then 0.02 cores
    monkeypatch.setattr(run, "machine_busy_seconds", lambda: next(busy))
    waited = asyncio.run(run.wait_quiet(0.2, budget=60, window=0.5))
    assert 1.0 <= waited < 60
    always = iter(float(i) for i in range(100))  # 2 cores busy throughout
    monkeypatch.setattr(run, "machine_busy_seconds", lambda: next(always))
    assert asyncio.run(run.wait_quiet(0.2, budget=0.2, window=0.1)) >= 0.2
