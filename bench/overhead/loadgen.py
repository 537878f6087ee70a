"""Closed-loop load generator (aiohttp on uvloop) measuring latency, TTFB and SSE fidelity.

Each worker keeps one keep-alive connection busy: it sends the next request as soon as the
previous answer has been read in full. Time-to-first-byte is the first *body* bytes, not the
status line, because that is what a streaming client waits for.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from procs import machine_busy_seconds

Meter = Callable[[], float] | None
"""Reads a process's CPU seconds so far (None: nothing to read)."""


@dataclass
class Result:
    """What one scenario against one target measured."""

    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    errors: int = 0
    mismatched_bodies: int = 0
    events_identical: int = 0
    events_total: int = 0
    elapsed: float = 0.0
    server_cpu: float = 0.0
    """CPU seconds the proxy process used during the measured part (0 for direct)."""
    client_cpu: float = 0.0
    """CPU seconds the load generator (this process) used meanwhile: on two cores it and nginx
    share the core a second worker runs on, so they bound what a second worker can add."""
    upstream_cpu: float = 0.0
    """CPU seconds nginx (the upstream) used meanwhile: it shares that core too."""
    machine_cpu: float = 0.0
    """CPU seconds every core was busy meanwhile, whoever used them (see `other_cores`)."""
    completed: int = 0
    """Completed requests when no latencies were kept (wrk); else the latencies count them."""
    spreads: list[tuple[int, ...]] = field(default_factory=list)
    """Per run (wrk, several workers): the connections each worker held, sampled mid-run."""

    def merged(self, other: Result) -> Result:
        """This result and `other` (a later round of the same scenario) as one."""
        return Result(
            latencies=self.latencies + other.latencies,
            ttfbs=self.ttfbs + other.ttfbs,
            errors=self.errors + other.errors,
            mismatched_bodies=self.mismatched_bodies + other.mismatched_bodies,
            events_identical=self.events_identical + other.events_identical,
            events_total=self.events_total + other.events_total,
            elapsed=self.elapsed + other.elapsed,
            server_cpu=self.server_cpu + other.server_cpu,
            client_cpu=self.client_cpu + other.client_cpu,
            upstream_cpu=self.upstream_cpu + other.upstream_cpu,
            machine_cpu=self.machine_cpu + other.machine_cpu,
            completed=self.completed + other.completed,
            spreads=self.spreads + other.spreads,
        )

    @property
    def count(self) -> int:
        """Completed requests."""
        return self.completed or len(self.latencies)

    @property
    def rps(self) -> float:
        """Completed requests per second over the whole scenario."""
        return self.count / self.elapsed if self.elapsed else 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        """Proxy CPU time per completed request, in milliseconds."""
        return 1000 * self.server_cpu / self.count if self.count else 0.0

    @property
    def client_cpu_ms_per_request(self) -> float:
        """Load-generator CPU time per completed request, in milliseconds."""
        return 1000 * self.client_cpu / self.count if self.count else 0.0

    @property
    def upstream_cpu_ms_per_request(self) -> float:
        """Upstream (nginx) CPU time per completed request, in milliseconds."""
        return 1000 * self.upstream_cpu / self.count if self.count else 0.0

    @property
    def other_cores(self) -> float:
        """Cores that other processes (not the proxy, load generator or upstream) kept busy on
        average: on a shared machine, what the run did not get."""
        ours = self.server_cpu + self.client_cpu + self.upstream_cpu
        return max(0.0, self.machine_cpu - ours) / self.elapsed if self.elapsed else 0.0

    @property
    def identical_pct(self) -> float:
        """Share of SSE events that arrived byte-identical to the upstream's, in percent."""
        return 100.0 * self.events_identical / self.events_total if self.events_total else 0.0


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation), in the unit of `values`."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1))
    return ordered[rank]


def split_events(body: bytes) -> list[bytes]:
    """Split an SSE body into events, each keeping its terminating blank line."""
    parts = body.split(b"\n\n")
    events = [p + b"\n\n" for p in parts[:-1]]
    if parts[-1]:
        events.append(parts[-1])
    return events


@dataclass(frozen=True)
class Scenario:
    """One load shape: body, concurrency, and a bound in requests or in seconds."""

    name: str
    body: bytes
    concurrency: int
    requests: int = 0
    seconds: float = 0.0
    stream: bool = False
    warmup: int = 20


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    sc: Scenario,
    headers: dict[str, str],
    expected: bytes,
    ref_events: list[bytes],
    res: Result,
) -> None:
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=sc.body, headers=headers) as resp:
            first = await resp.content.readany()
            t1 = time.perf_counter()
            body = first + await resp.content.read()
            t2 = time.perf_counter()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError, OSError):
        res.errors += 1
        return
    if status != 200:
        res.errors += 1
        return
    res.latencies.append(t2 - t0)
    res.ttfbs.append(t1 - t0)
    if sc.stream:
        got = split_events(body)
        res.events_total += max(len(got), len(ref_events))
        res.events_identical += sum(1 for a, b in zip(got, ref_events, strict=False) if a == b)
    elif body != expected:
        res.mismatched_bodies += 1


async def run_scenario(
    url: str,
    sc: Scenario,
    expected: bytes,
    ref_events: list[bytes],
    cpu: Callable[[], float] | None = None,
    upstream_cpu: Callable[[], float] | None = None,
) -> Result:
    """Run `sc` against `url` (a full chat-completions URL) and return the measurements.

    `cpu` and `upstream_cpu`, if given, read the proxy's and the upstream's CPU seconds so far;
    the result keeps the differences.
    """
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-overhead"}
    if sc.stream:
        headers["x-bench-stream"] = "1"
    connector = aiohttp.TCPConnector(limit=sc.concurrency, limit_per_host=sc.concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warm = Result()
        # Warm-up opens every connection and fills caches; its figures are dropped.
        n_warm = max(sc.warmup, sc.concurrency)
        for start in range(0, n_warm, sc.concurrency):
            batch = min(sc.concurrency, n_warm - start)
            await asyncio.gather(
                *(_one(session, url, sc, headers, expected, ref_events, warm) for _ in range(batch))
            )
        res = Result()
        budget = [sc.requests]
        deadline = time.perf_counter() + sc.seconds if sc.seconds else 0.0

        async def worker() -> None:
            while True:
                if sc.seconds:
                    if time.perf_counter() >= deadline:
                        return
                else:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                await _one(session, url, sc, headers, expected, ref_events, res)

        cpu0 = cpu() if cpu else 0.0
        up0 = upstream_cpu() if upstream_cpu else 0.0
        machine0 = machine_busy_seconds()
        t0, client0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(sc.concurrency)))
        res.elapsed = time.perf_counter() - t0
        res.client_cpu = time.process_time() - client0
        res.server_cpu = cpu() - cpu0 if cpu else 0.0
        res.upstream_cpu = upstream_cpu() - up0 if upstream_cpu else 0.0
        res.machine_cpu = machine_busy_seconds() - machine0
    return res


async def probe(url: str, body: bytes) -> dict[str, str]:
    """The `x-compactd-*` headers one request gets back (shows whether tokens were counted)."""
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-overhead"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=headers) as resp,
    ):
        await resp.read()
        return {k: v for k, v in resp.headers.items() if k.lower().startswith("x-compactd-")}
