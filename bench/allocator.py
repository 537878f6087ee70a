"""jemalloc against glibc's malloc under compactd, in one run: a worker's RSS and compaction
latency with `server.allocator = "auto"` (jemalloc, when installed) and `"system"`.

    .venv/bin/python bench/allocator.py [--rounds 3] [--conversations 16] [--concurrency 4]

Each round starts `compactd serve --workers 1` once per allocator (the order alternating from
round to round) against a local fake upstream (`bench/rss.py`'s, answering at once), and reads
the worker's RSS from /proc: idle; after one chat request per model family; while
`--conversations` distinct ~100k-token real conversations (`bench/overhead/bodies.py`'s
aider sessions, under `$BENCH_CORPORA`, else Python's sources) are sent `--concurrency` at a
time to a 128k model, so that each is compacted afresh (the peak, sampled every 50 ms); and
once it has settled after them. The same requests' latency is the compaction's (the upstream
costs nothing): p50 and p95, and the worker's CPU time per conversation (/proc, steadier than
latency on a busy machine). Prints a markdown table, each allocator's median over the rounds
with its range, and the change jemalloc makes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent / "overhead"))

from bodies import large_body
from procs import cpu_seconds

from bench.rss import FAMILIES, chat, each_worker, free_port, rss_mb, settled, upstream

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "jemalloc": ("auto", {}),
    "glibc": ("system", {}),
    # What the re-exec sets besides the allocator, alone: code objects without column positions.
    "glibc, no debug ranges": ("system", {"PYTHONNODEBUGRANGES": "1"}),
}
"""Each one's `server.allocator` and environment. "auto" restarts `serve` with jemalloc preloaded
and `PYTHONNODEBUGRANGES=1`; "system" runs on as started."""
MODEL = "gpt-4o"
"""A 128k-token window: the ~100k-token conversations are compacted under the default policy."""


def conversations(n: int) -> list[bytes]:
    """`n` distinct ~100k-token conversations: the same turns under a system line of their own,
    so no conversation replays another's compaction."""
    base = json.loads(large_body())
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": f"Session {i}: {base['messages'][0]['content']}"}]
        out.append(json.dumps({**base, "model": MODEL, "messages": msgs + base["messages"][1:]}))
    return [o.encode() for o in out]


async def ready(http: httpx.AsyncClient, base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if (await http.get(f"{base}/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("compactd did not start")
        await asyncio.sleep(0.2)


async def under_load(
    url: str, pid: int, bodies: list[bytes], concurrency: int
) -> tuple[list[float], float, dict[str, int]]:
    """Send `bodies`, `concurrency` at a time: each one's seconds, the worker's peak RSS
    meanwhile, and how many got each `x-compactd-action`."""
    queue = list(bodies)
    times: list[float] = []
    actions: dict[str, int] = {}
    peak = rss_mb(pid)
    done = asyncio.Event()
    headers = {"authorization": "Bearer sk-alloc", "content-type": "application/json"}

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            resp = await http.post(url, content=body)
            times.append(time.perf_counter() - start)
            action = f"{resp.status_code} {resp.headers.get('x-compactd-action', '-')}"
            actions[action] = actions.get(action, 0) + 1

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=300, headers=headers) as http:
        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        done.set()
        await sampler
    return times, peak, actions


async def measure(variant: str, bodies: list[bytes], concurrency: int) -> dict[str, float]:
    allocator, extra = VARIANTS[variant]
    up_port, port = free_port(), free_port()
    runner = await upstream(up_port)
    data = tempfile.mkdtemp(prefix="compactd-alloc-")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COMPACTD_") and k not in {"PYTHONNODEBUGRANGES", "LD_PRELOAD"}
    }
    env |= {
        "COMPACTD_UPSTREAM_URL": f"http://127.0.0.1:{up_port}/v1",
        "COMPACTD_DATA_DIR": data,
        "COMPACTD_SECRET": "alloc-bench",
        "COMPACTD_SERVER_ALLOCATOR": allocator,
        **extra,
    }
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/chat/completions"
    out: dict[str, float] = {}
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            await ready(http, base)
        pid = proc.pid  # one worker: the server itself (after its jemalloc re-exec, same pid)
        out["idle RSS"] = (await settled([pid]))[0]
        for model in FAMILIES:
            await each_worker(url, [pid], chat(model))
        out["RSS after one request per model family"] = (await settled([pid]))[0]
        cpu = cpu_seconds(pid)
        times, peak, actions = await under_load(url, pid, bodies, concurrency)
        out["worker CPU per big conversation (ms)"] = (cpu_seconds(pid) - cpu) / len(bodies) * 1000
        out["peak RSS under the big conversations"] = peak
        out["RSS settled after them"] = (await settled([pid]))[0]
        out["compaction p50 (ms)"] = statistics.median(times) * 1000
        out["compaction p95 (ms)"] = statistics.quantiles(times, n=20)[-1] * 1000
        seen = ", ".join(f"{k}: {v}" for k, v in sorted(actions.items()))
        print(f"   {variant}: {seen}", file=sys.stderr)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        await runner.cleanup()
    return out


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


async def main_async(rounds: int, n: int, concurrency: int) -> None:
    bodies = conversations(n)
    names = list(VARIANTS)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    for rnd in range(rounds):
        for variant in names[rnd % len(names) :] + names[: rnd % len(names)]:
            res = await measure(variant, bodies, concurrency)
            runs[variant].append(res)
            each = ", ".join(f"{k} {v:.1f}" for k, v in res.items())
            print(f"   round {rnd + 1} {variant}: {each}", file=sys.stderr)
    print(f"| figure | {' | '.join(names)} | the re-exec's change |")
    print(f"|---|{'---:|' * len(names)}---:|")
    for figure in runs[names[0]][0]:
        cols = [[r[figure] for r in runs[v]] for v in names]
        change = statistics.median(cols[0]) / statistics.median(cols[1]) - 1
        print(f"| {figure} | {' | '.join(spread(c) for c in cols)} | {change:+.1%} |")
    print(f"\nMedian (range) of {rounds} interleaved rounds; RSS in MB (2^20 bytes).")
    print(f"Load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--conversations", type=int, default=16, help="distinct big conversations per round"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="of the big conversations")
    args = parser.parse_args()
    asyncio.run(main_async(args.rounds, args.conversations, args.concurrency))


if __name__ == "__main__":
    main()
