"""A C load generator for the throughput scenarios: Debian's `wrk`, driven by a Lua script.

The aiohttp load generator costs ~0.2 ms of CPU per request, on the core it shares with nginx:
with `--workers 2` on two cores that cost is taken from the second worker. wrk costs a few tens
of µs. It runs one thread (its core is shared with nginx, as the aiohttp one's is), keeps
`concurrency` keep-alive connections busy in a closed loop, and the script checks every answer:
a non-200 counts as an error and a 200 whose (de-chunked) body differs from the upstream's bytes
as a mismatch. `done()` prints one JSON line of totals, so the result is a `loadgen.Result` like
the aiohttp one's but without latencies: wrk's histogram is "corrected" for coordinated omission
(synthetic entries are added before `done()` sees it), so neither its count nor its percentiles
are the requests that were made. Latency and time-to-first-byte stay the aiohttp generator's.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

from loadgen import Meter, Result, Scenario
from procs import connections_per_worker, machine_busy_seconds

INSTALL = "wrk not found: apt-get install -y wrk (Debian's wrk 4.1)"
MARK = "WRKJSON "

LUA = r"""
local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
wrk.method = "POST"
wrk.body = slurp([[%(body)s]])
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench-overhead"
%(extra)s
local expected = slurp([[%(expected)s]])
ok, mismatched = 0, 0
local threads = {}
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
    if body ~= expected then mismatched = mismatched + 1 end
  end
end
function done(summary, latency, requests)
  local k, m = 0, 0
  for _, t in ipairs(threads) do k = k + t:get("ok"); m = m + t:get("mismatched") end
  local e = summary.errors
  io.write(string.format(
    '%(mark)s{"requests":%%d,"duration_us":%%d,"ok":%%d,"mismatched":%%d,' ..
    '"connect":%%d,"read":%%d,"write":%%d,"status":%%d,"timeout":%%d}\n',
    summary.requests, summary.duration, k, m,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def wrk_binary() -> str | None:
    """Path of wrk, or None when it is not installed."""
    return shutil.which("wrk")


def lua_script(body: Path, expected: Path, stream: bool) -> str:
    """The wrk script for one scenario: POST `body`, check answers against `expected`."""
    extra = 'wrk.headers["x-bench-stream"] = "1"' if stream else ""
    return LUA % {"body": body, "expected": expected, "extra": extra, "mark": MARK}


def wrk_argv(
    exe: str, url: str, script: Path, concurrency: int, seconds: float, batch: bool = False
) -> list[str]:
    """The wrk command line: one thread, `concurrency` connections, for `seconds` (wrk takes
    whole seconds: rounded, at least 1); `batch` runs it SCHED_BATCH (see `run_wrk_scenario`)."""
    secs = max(1, round(seconds))
    load = [f"-c{concurrency}", f"-d{secs}s", "--timeout", "30s"]
    policy = ["chrt", "-b", "0"] if batch else []
    return [*policy, exe, "-t1", *load, "-s", str(script), url]


def parse_output(text: str) -> dict[str, int]:
    """The totals line `done()` printed (raises ValueError when wrk printed none)."""
    for line in text.splitlines():
        if line.startswith(MARK):
            out: dict[str, int] = json.loads(line[len(MARK) :])
            return out
    raise ValueError(f"no {MARK.strip()} line in wrk's output: {text[-600:]!r}")


def to_result(totals: dict[str, int], events_per_answer: int = 0) -> Result:
    """A `Result` from wrk's totals: the 200 answers are the completed requests; any other
    status and every socket error or timeout is an error.

    A stream's answer is compared whole, so its events count as identical only when all are."""
    ok, bad = totals["ok"], totals["mismatched"]
    errors = sum(totals[k] for k in ("connect", "read", "write", "timeout"))
    errors += totals["requests"] - ok  # every answer that was not a 200
    res = Result(completed=ok, errors=errors, elapsed=totals["duration_us"] / 1e6)
    if events_per_answer:
        res.events_total = ok * events_per_answer
        res.events_identical = (ok - bad) * events_per_answer
    else:
        res.mismatched_bodies = bad
    return res


async def _wrk(argv: list[str]) -> tuple[str, float]:
    """Run wrk; its stdout and the CPU seconds it used (from wait4's rusage)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = await asyncio.to_thread(os.wait4, proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}: {text[-600:]}")
    return text, usage.ru_utime + usage.ru_stime


async def _spread(workers: list[int], url: str, after: float) -> tuple[int, ...]:
    """The connections to `url`'s port each of `workers` holds, `after` seconds from now."""
    await asyncio.sleep(after)
    port = urllib.parse.urlsplit(url).port or 80
    return tuple(sorted(connections_per_worker(port, workers)))


async def run_wrk_scenario(
    url: str, sc: Scenario, expected: bytes, ref_events: list[bytes],
    cpu: Meter = None, upstream_cpu: Meter = None, warmup: float = 1.0, batch: bool = False,
    workers: list[int] | None = None,
) -> Result:  # fmt: skip
    """Run `sc` (bounded in seconds) against `url` with wrk; `warmup` seconds before it (opening
    every connection, filling caches) are not counted.

    `batch` runs wrk SCHED_BATCH: an answer that wakes it does not preempt the proxy worker that
    shares its core (with `--workers 2` on two cores), it runs at the worker's next yield.
    With several `workers` (pids), how many of wrk's connections each holds is sampled once,
    a second into the run (wrk opens them all at its start)."""
    exe = wrk_binary()
    if exe is None:
        raise SystemExit(INSTALL)
    with tempfile.TemporaryDirectory(prefix="compactd-bench-wrk-") as tmp:
        body, want, script = Path(tmp, "body"), Path(tmp, "expected"), Path(tmp, "s.lua")
        body.write_bytes(sc.body)
        want.write_bytes(b"".join(ref_events) if sc.stream else expected)
        script.write_text(lua_script(body, want, sc.stream))
        if warmup:
            await _wrk(wrk_argv(exe, url, script, sc.concurrency, warmup, batch))
        cpu0 = cpu() if cpu else 0.0
        up0 = upstream_cpu() if upstream_cpu else 0.0
        machine0 = machine_busy_seconds()
        argv = wrk_argv(exe, url, script, sc.concurrency, sc.seconds, batch)
        if workers and len(workers) > 1:
            (text, client), spread = await asyncio.gather(
                _wrk(argv), _spread(workers, url, min(1.0, sc.seconds / 2))
            )
        else:
            (text, client), spread = await _wrk(argv), ()
        machine = machine_busy_seconds() - machine0
        server = cpu() - cpu0 if cpu else 0.0
        up = upstream_cpu() - up0 if upstream_cpu else 0.0
    res = to_result(parse_output(text), len(ref_events) if sc.stream else 0)
    res.server_cpu, res.client_cpu, res.upstream_cpu = server, client, up
    res.machine_cpu = machine
    res.spreads = [spread] if spread else []
    return res
