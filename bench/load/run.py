"""compactd under sustained load: memory and descriptors stay bounded, nothing fails.

    apt-get install -y nginx-light        # the fast upstream (once)
    .venv/bin/python bench/load/run.py [--streams-seconds 60] [--c64-seconds 120] [--cooldown 60]
                                       [--store sqlite|redis] [--side 1]

One compactd worker (embedded store, accounting on, as shipped) pinned to the first core, an
nginx upstream serving fixed JSON and SSE bodies, and the load generator on the second core:

1. warm-up, then a baseline sample of the worker's RSS and open descriptors;
2. 256 concurrent SSE streams for --streams-seconds;
3. 64 concurrent JSON requests for --c64-seconds, while --side clients each send an
   over-budget, growing conversation every 0.5 s (each must be compacted or replayed, never
   fail open);
4. --cooldown seconds idle.

--store redis runs a private redis-server (AOF off) as the store instead of the embedded
SQLite file. The report gives the share of over-budget requests that failed open.

RSS and fds are sampled every 10 s throughout. Prints the samples, each phase's req/s and
errors, and the checks: 0 errors, RSS under load <= 120 % of baseline, RSS after the cooldown
<= 110 % of baseline, every over-budget request compacted or replayed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "overhead"))

from bodies import chat_body, completion_response, sse_events  # noqa: E402
from loadgen import Result, Scenario, run_scenario  # noqa: E402
from procs import PinnedServer, cores, free_port  # noqa: E402
from upstream import NginxUpstream  # noqa: E402

sys.path.insert(0, str(HERE.parent.parent))
from tests.store.redis_server import RedisServer  # noqa: E402

SAMPLE_SECONDS = 10.0
CONFIG = """
[default_policy]
# Small enough that the side client's conversation is compacted, large enough that the load's
# ~500-token chat body is not.
budget_tokens = 3000
"""


@dataclass
class Sample:
    """The worker's memory and descriptors at one moment."""

    at: float
    phase: str
    rss_mb: float
    fds: int


@dataclass
class Sampler:
    """Reads /proc/<pid> every SAMPLE_SECONDS while a phase runs."""

    pid: int
    start: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)

    def take(self, phase: str) -> Sample:
        status = Path(f"/proc/{self.pid}/status").read_text()
        rss_kb = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        sample = Sample(time.monotonic() - self.start, phase, rss_kb / 1024, fds)
        self.samples.append(sample)
        print(
            f"   t={sample.at:6.1f}s {phase:<10} RSS {sample.rss_mb:7.1f} MB  fds {fds}",
            file=sys.stderr,
        )
        return sample

    async def during(self, phase: str, work: asyncio.Future[Result] | asyncio.Task[None]) -> None:
        while not work.done():
            try:
                await asyncio.wait_for(asyncio.shield(work), SAMPLE_SECONDS)
            except TimeoutError:
                self.take(phase)
        self.take(phase)


def conversation(turn: int) -> bytes:
    """The side client's conversation after `turn` turns: well over a 3,000-token budget."""
    said = [
        (
            f"Turn {t}: look at src/mod{t}.py " + "lorem ipsum dolor " * 30,
            f"Answer {t}: " + "ok " * 40,
        )
        for t in range(turn + 30)
    ]
    history = [
        {"role": role, "content": text}
        for question, answer in said
        for role, text in (("user", question), ("assistant", answer))
    ]
    system = {"role": "system", "content": "You are a careful agent."}
    last = {"role": "user", "content": "What did we decide about src/mod0.py?"}
    return orjson.dumps({"model": "gpt-4o-mini", "messages": [system, *history, last]})


async def over_budget(url: str, stop: asyncio.Event, seen: dict[str, int], side: int = 0) -> None:
    """One growing conversation, a turn every 0.5 s, counting the actions it gets."""
    key = f"sk-bench-load-side-{side}"
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        turn = 0
        while not stop.is_set():
            start = time.monotonic()
            async with session.post(url, data=conversation(turn), headers=headers) as resp:
                await resp.read()
                action = resp.headers.get("x-compactd-action", f"status {resp.status}")
                if action == "error":  # why it failed open, and how long the request took
                    why = resp.headers.get("x-compactd-error", "")
                    action = f"error ({why}, {1000 * (time.monotonic() - start):.0f} ms)"
                seen[action] = seen.get(action, 0) + 1
            turn += 1
            await asyncio.sleep(0.5)


async def store_latency(metrics_url: str) -> dict[str, str]:
    """Per store operation: how many, their mean, and how many took over 100 ms (a timeout at
    the default 200 ms is one of them), from compactd's `compactd_store_seconds` histogram."""
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as resp:
        text = await resp.text()
    count: dict[str, float] = {}
    total: dict[str, float] = {}
    within: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("compactd_store_seconds"):
            continue
        name, _, value = line.rpartition(" ")
        op = name.split('op="', 1)[1].split('"', 1)[0]
        if name.startswith("compactd_store_seconds_count"):
            count[op] = float(value)
        elif name.startswith("compactd_store_seconds_sum"):
            total[op] = float(value)
        elif 'le="0.1"' in name:
            within[op] = float(value)
    return {
        op: f"{n:.0f}, {1000 * total[op] / n:.1f} ms, {n - within.get(op, n):.0f}"
        for op, n in sorted(count.items())
        if n
    }


async def cache_entries(metrics_url: str) -> dict[str, int]:
    """What each in-memory cache holds (`compactd_cache_entries`) after the cooldown."""
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as resp:
        text = await resp.text()
    return {
        line.split('cache="', 1)[1].split('"', 1)[0]: int(float(line.rpartition(" ")[2]))
        for line in text.splitlines()
        if line.startswith("compactd_cache_entries{")
    }


async def main_async(args: argparse.Namespace) -> int:
    """Run the phases and print the report."""
    proxy_core, load_core = cores()
    os.sched_setaffinity(0, {load_core})
    expected, ref = completion_response(), sse_events()
    with (
        NginxUpstream(expected, b"".join(ref)) as up,
        tempfile.TemporaryDirectory(prefix="compactd-bench-load-") as data,
    ):
        config = Path(data) / "compactd.toml"
        config.write_text(CONFIG)
        redis = None
        if args.store == "redis":
            redis = RedisServer(Path(data) / "redis")
            redis.directory.mkdir()
            redis.start()
        port = free_port()
        exe = Path(sys.executable).parent / "compactd"
        argv = [
            str(exe),
            "serve",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        env = {
            "COMPACTD_UPSTREAM_URL": up.base_url,
            "COMPACTD_DATA_DIR": str(Path(data) / "state"),
            "COMPACTD_SERVER_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "warning"),
            **({"COMPACTD_STORE_URL": redis.url} if redis is not None else {}),
        }
        with PinnedServer("compactd-load", argv, port, proxy_core, env=env) as server:
            url = f"{server.url}/v1/chat/completions"
            sampler = Sampler(server.worker_pids()[-1])
            warm = Scenario("warm", chat_body(), concurrency=64, seconds=5)
            await run_scenario(url, warm, expected, ref)
            await run_scenario(
                url,
                Scenario("warm-sse", chat_body(stream=True), 256, seconds=5, stream=True),
                expected,
                ref,
            )
            await asyncio.sleep(5)
            baseline = sampler.take("baseline")

            streams = Scenario(
                "streams",
                chat_body(stream=True),
                concurrency=256,
                seconds=args.streams_seconds,
                stream=True,
            )
            work = asyncio.ensure_future(run_scenario(url, streams, expected, ref))
            await sampler.during("256 SSE", work)
            res_streams = work.result()

            stop = asyncio.Event()
            seen: dict[str, int] = {}
            sides = asyncio.gather(*(over_budget(url, stop, seen, n) for n in range(args.side)))
            c64 = Scenario("c64", chat_body(), concurrency=64, seconds=args.c64_seconds)
            work = asyncio.ensure_future(run_scenario(url, c64, expected, ref))
            await sampler.during("c=64", work)
            res_c64 = work.result()
            stop.set()
            await sides
            store_ops = await store_latency(f"{server.url}/metrics")

            idle = asyncio.ensure_future(asyncio.sleep(args.cooldown))
            await sampler.during("cooldown", idle)
            after = sampler.samples[-1]
            caches = await cache_entries(f"{server.url}/metrics")
        if redis is not None:
            redis.stop()
    under_load = max(s.rss_mb for s in sampler.samples if s.phase in ("256 SSE", "c=64"))
    fds = max(s.fds for s in sampler.samples)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print("\n| phase | requests | req/s | errors | bodies identical |")
    print("|---|---:|---:|---:|---:|")
    for name, r in (("256 SSE streams", res_streams), ("c=64 JSON", res_c64)):
        same = (
            r.identical_pct
            if r.events_total
            else 100 * (1 - r.mismatched_bodies / len(r.latencies))
        )
        print(f"| {name} | {len(r.latencies):,} | {r.rps:,.0f} | {r.errors} | {same:.1f} % |")
    print(
        f"\nRSS: baseline {baseline.rss_mb:.1f} MB, peak under load {under_load:.1f} MB "
        f"({100 * under_load / baseline.rss_mb:.0f} %), {args.cooldown:.0f} s after "
        f"{after.rss_mb:.1f} MB ({100 * after.rss_mb / baseline.rss_mb:.0f} %); "
        f"fds baseline {baseline.fds}, peak {fds}, after {after.fds}."
    )
    print(f"Over-budget side requests during c=64 ({args.store} store): {seen}")
    over = sum(seen.values())
    failed = sum(n for action, n in seen.items() if action.startswith("error"))
    share = 100 * failed / over if over else 0.0
    print(f"Failed open: {failed} of {over} over-budget requests ({share:.2f} %).")
    print(f"Cache entries after the cooldown: {caches}")
    print(f"Store operations after c=64 (count, mean, over 100 ms): {store_ops}")
    print(f"Load average at the end (1, 5, 15 min): {load} on {os.cpu_count()} cores.\n")
    errors = res_streams.errors + res_c64.errors + res_c64.mismatched_bodies
    checks = [
        ("0 errors", errors == 0),
        ("RSS under load <= 120 % of baseline", under_load <= 1.2 * baseline.rss_mb),
        ("RSS after the cooldown <= 110 % of baseline", after.rss_mb <= 1.1 * baseline.rss_mb),
        ("<= 0.5 % of over-budget requests failed open", share <= 0.5),
        (
            "every over-budget request compacted or replayed",
            bool(seen) and set(seen) <= {"compacted", "replayed"},
        ),
    ]
    for name, ok in checks:
        print(f"- [{'x' if ok else ' '}] {name}")
    return 0 if all(ok for _, ok in checks) else 1


def main() -> int:
    """Parse arguments and run on uvloop."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams-seconds", type=float, default=60.0)
    parser.add_argument("--c64-seconds", type=float, default=120.0)
    parser.add_argument("--cooldown", type=float, default=60.0)
    parser.add_argument("--store", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--side", type=int, default=1, help="over-budget conversations at once")
    return uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
