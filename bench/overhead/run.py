"""compactd overhead benchmark: direct-to-upstream against each proxy, in one run.

    .venv/bin/python bench/overhead/run.py [--seconds 10] [--requests 300] [--rounds 2]

An nginx upstream serves fixed JSON and SSE bodies on loopback. Every proxy (two naive
starlette + httpx pass-throughs and compactd with each upstream transport) is started up front,
pinned to the first core with taskset; the load generator and nginx share the second. Scenarios
run target after target, interleaved over --rounds rounds, so load from elsewhere on a shared
machine falls on all targets alike. Prints a markdown table and the target checks; with
--profile also py-spy hot spots for compactd.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import uvloop
from bodies import chat_body, completion_response, large_body, sse_events
from loadgen import Result, Scenario, probe, run_scenario
from procs import (
    PinnedServer,
    cores,
    cpu_seconds,
    free_port,
    machine_busy_seconds,
    niced,
    set_autogroup_nice,
    spawned,
)
from report import describe, render_table, target_checks, workers_table
from spy import start_record, summarise
from upstream import NginxUpstream
from wrkgen import INSTALL, run_wrk_scenario, wrk_binary

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Target:
    """A proxy under test: how to start it given (port, upstream base URL, data dir)."""

    name: str
    kind: str  # "direct", "naive" or "compactd"
    transport: str = ""
    pythonpath: str = ""
    """For A/B runs: a directory holding a patched `proxy` package that compactd imports first."""
    workers: int = 1
    """compactd's (or naive.py's) `--workers`; with more than one, it may run on every core (see
    server_for)."""
    accounting: bool = True
    """Off: `accounting.enabled = false`, to measure what accounting costs."""


TARGETS = (
    Target("direct", "direct"),
    Target("naive-httpx", "naive", "httpx"),
    Target("naive-aiohttp", "naive", "aiohttp"),
    Target("compactd-aiohttp", "compactd", "aiohttp"),
    Target("compactd-httpx", "compactd", "httpx"),
    Target("compactd-no-accounting", "compactd", "aiohttp", accounting=False),
)


def scenarios(seconds: float, requests: int) -> list[Scenario]:
    """The four load shapes of the benchmark, (a) to (d)."""
    return [
        Scenario("a", chat_body(), concurrency=1, requests=requests, warmup=50),
        Scenario("b", chat_body(), concurrency=32, seconds=seconds),
        Scenario("c", chat_body(stream=True), concurrency=64, seconds=seconds, stream=True),
        Scenario("d", large_body(), concurrency=4, seconds=seconds),
    ]


def choose_targets(only: str, workers: str, variants: list[str]) -> list[Target]:
    """The targets of a run: those named in `only` (all when empty); for each worker count
    above one in `workers`, compactd-aiohttp with that many workers and, as the control, the
    same count of each chosen naive pass-through; then each `NAME=DIR` variant, with the same
    multi-worker copies (an A/B of what a change does to two workers)."""
    chosen = [t for t in TARGETS if not only or t.name in only.split(",")]
    naive = [t for t in chosen if t.kind == "naive"]
    for n in (int(w) for w in workers.split(",") if w.strip() and int(w) > 1):
        chosen.append(Target(f"compactd-aiohttp-w{n}", "compactd", "aiohttp", workers=n))
        chosen += [dataclasses.replace(t, name=f"{t.name}-w{n}", workers=n) for t in naive]
    counts = [int(w) for w in workers.split(",") if w.strip() and int(w) > 1]
    for variant in variants:
        name, _, path = variant.partition("=")
        v = Target(name, "compactd", "aiohttp", str(Path(path).resolve()))
        chosen += [v, *(dataclasses.replace(v, name=f"{name}-w{n}", workers=n) for n in counts)]
    return chosen


def server_for(
    t: Target, upstream: str, core: int, data_dir: Path, config: str = ""
) -> PinnedServer:
    """A pinned server process for target `t` (not started). A multi-worker compactd is pinned
    to every core (its workers must have a core each to scale); the load generator and nginx
    stay pinned to theirs, so on two cores worker two shares a core with them."""
    port = free_port()
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0) | {core}))
    if t.kind == "naive":
        argv = [sys.executable, str(HERE / "naive.py"), t.transport, str(port), upstream]
        argv += [str(t.workers)]
        env = {"PYTHONPATH": str(HERE)}  # the spawned workers import `naive`
        return PinnedServer(t.name, argv, port, cpus if t.workers > 1 else core, env=env)
    exe = Path(sys.executable).parent / "compactd"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "proxy"]
    argv = [*base, "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workers", str(t.workers)]
    env = {
        "COMPACTD_UPSTREAM_URL": upstream,
        "COMPACTD_UPSTREAM_TRANSPORT": t.transport,
        "COMPACTD_DATA_DIR": str(data_dir / t.name),
        "COMPACTD_SERVER_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "info"),
    }
    if t.pythonpath:
        env["PYTHONPATH"] = t.pythonpath
    if not t.accounting:
        env["COMPACTD_ACCOUNTING_ENABLED"] = "false"
    if config:
        env["COMPACTD_CONFIG_FILE"] = str(Path(config).resolve())
    return PinnedServer(t.name, argv, port, cpus if t.workers > 1 else core, env=env)


def total_cpu(pids: list[int]) -> float:
    """CPU seconds used so far by all of a target's worker processes."""
    return sum(cpu_seconds(p) for p in pids)


def split_rounds(scs: list[Scenario], rounds: int) -> list[Scenario]:
    """Each scenario's share of one round: the same total requests or seconds over all rounds."""
    return [
        dataclasses.replace(
            sc,
            requests=max(1, sc.requests // rounds) if sc.requests else 0,
            seconds=sc.seconds / rounds,
        )
        for sc in scs
    ]


WRK_SCENARIOS = "bcd"
"""The scenarios `--loadgen wrk` runs with wrk: the throughput ones, bounded in seconds. (a), the
latency at concurrency 1, stays with the aiohttp load generator (wrk has no request budget)."""


async def wait_quiet(cores: float, budget: float, window: float = 0.5) -> float:
    """Wait until other work takes under `cores` cores over `window` seconds (the bench's own
    servers are idle between runs), at most `budget` seconds; the seconds waited.

    On a shared machine another session's busy process on the second core raised a single
    worker's CPU per request by up to 70 % (0.52 -> 0.88 ms; two workers keep both cores and
    push it aside), so a run next to one measures that process more than the target."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        busy0 = machine_busy_seconds()
        await asyncio.sleep(window)
        if (machine_busy_seconds() - busy0) / window < cores or loop.time() - start >= budget:
            return loop.time() - start


async def interleaved(
    live: dict[str, tuple[str, list[int]]],
    scs: list[Scenario],
    rounds: int,
    expected: bytes,
    ref: list[bytes],
    upstream: list[int] | None = None,
    loadgen: str = "aiohttp",
    batch: bool = False,
    quiet: tuple[float, float] = (0.0, 0.0),
) -> dict[str, dict[str, Result]]:
    """Run every scenario against every target, target after target, for `rounds` rounds.

    Interleaving spreads other work on a shared machine over all targets alike instead of
    favouring whichever target happened to run in a quiet minute; the start rotates per round.
    With `quiet` (cores, seconds) each run first waits for the machine to be that quiet.
    """
    names = list(live)
    out: dict[str, dict[str, Result]] = {n: {} for n in names}
    up = functools.partial(total_cpu, upstream) if upstream else None
    for rnd in range(rounds):
        for sc in split_rounds(scs, rounds):
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                url, pids = live[name]
                run = run_scenario
                if loadgen == "wrk" and sc.name in WRK_SCENARIOS:
                    run = functools.partial(run_wrk_scenario, batch=batch, workers=spawned(pids))
                cpu = functools.partial(total_cpu, pids) if pids else None
                waited = await wait_quiet(*quiet) if quiet[0] else 0.0
                res = await run(url, sc, expected, ref, cpu, up)
                note = f" (waited {waited:.0f} s for quiet)" if waited >= 1 else ""
                print(
                    f"   round {rnd + 1} ({sc.name}) {name}: {describe(res)}{note}", file=sys.stderr
                )
                prev = out[name].get(sc.name)
                out[name][sc.name] = prev.merged(res) if prev else res
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"-- round {rnd + 1}/{rounds} done (load {load})", file=sys.stderr)
    return out


async def profile_pass(
    server: PinnedServer,
    url: str,
    scs: list[Scenario],
    expected: bytes,
    ref: list[bytes],
    out: Path,
) -> None:
    """Re-run the load scenarios while py-spy samples the server; write hot-spot summaries."""
    out.mkdir(parents=True, exist_ok=True)
    for sc in scs:
        if not sc.seconds:
            continue
        raw = out / f"{server.name}-{sc.name}.txt"
        rec = start_record(server.worker_pids()[-1], raw, sc.seconds + 1)
        if rec is None:
            print("py-spy not installed: pip install py-spy", file=sys.stderr)
            return
        await asyncio.sleep(0.5)
        await run_scenario(url, sc, expected, ref)
        try:
            await asyncio.to_thread(rec.wait, 30)
        except subprocess.TimeoutExpired:
            rec.kill()
            rec.wait()
        if raw.exists():
            md = summarise(raw)
            (out / f"{server.name}-{sc.name}.md").write_text(md)
            print(f"\n### py-spy {server.name}, scenario {sc.name}\n\n{md}", file=sys.stderr)


async def main_async(args: argparse.Namespace) -> int:
    """Run the benchmark and print the report."""
    proxy_core, load_core = cores()
    # Children inherit this affinity: nginx shares the load generator's core, and each proxy is
    # re-pinned to the other core by taskset.
    os.sched_setaffinity(0, {load_core})
    # main's `niced` priority is inherited by nginx, wrk and every proxy: on a shared machine,
    # other work yields to the run; with autogrouping, each server's own session gets it below.
    if args.loadgen == "wrk" and wrk_binary() is None:
        raise SystemExit(INSTALL)
    expected = completion_response()
    ref = sse_events()
    scs = [sc for sc in scenarios(args.seconds, args.requests) if sc.name in args.scenarios]
    chosen = choose_targets(args.only, args.workers, args.variant)
    naive = [t for t in chosen if t.kind == "naive" and t.workers == 1]
    results: dict[str, dict[str, Result] | str] = {}
    probes: dict[str, str] = {}
    with (
        NginxUpstream(expected, b"".join(ref), batch=args.batch) as up,
        tempfile.TemporaryDirectory(prefix="compactd-bench-data-") as data,
        contextlib.ExitStack() as stack,
    ):
        # Every proxy is started up front (pinned to the same core, idle until its turn).
        live: dict[str, tuple[str, list[int]]] = {}
        servers: dict[str, PinnedServer] = {}
        for t in chosen:
            if t.kind == "direct":
                live[t.name] = (up.base_url + "/chat/completions", [])
                continue
            try:
                server = stack.enter_context(
                    server_for(t, up.base_url, proxy_core, Path(data), args.config)
                )
            except (RuntimeError, TimeoutError) as exc:
                results[t.name] = f"did not start: {str(exc)[-400:]}"
                print(f"   {t.name} {results[t.name]}", file=sys.stderr)
                continue
            servers[t.name] = server
            if args.nice and server.proc is not None:
                set_autogroup_nice(server.proc.pid, args.nice)
            workers = server.worker_pids()[1:] if t.workers > 1 else server.worker_pids()[-1:]
            live[t.name] = (f"{server.url}/v1/chat/completions", workers)
            if t.kind == "compactd":
                got = await probe(live[t.name][0], large_body())
                probes[t.name] = ", ".join(f"{k}: {v}" for k, v in sorted(got.items()))
        quiet = (args.quiet, args.quiet_wait)
        measured = await interleaved(
            live, scs, args.rounds, expected, ref, up.pids(), args.loadgen, args.batch, quiet
        )
        results = {t.name: measured.get(t.name) or results.get(t.name, "") for t in chosen}
        if args.profile:
            for name, server in servers.items():
                if name.startswith("compactd"):
                    url = live[name][0]
                    await profile_pass(server, url, scs, expected, ref, Path(args.profile))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(render_table(results, scs))
    print(f"Load average at the end (1, 5, 15 min): {load} on {os.cpu_count()} cores.")
    gen = f"wrk for ({WRK_SCENARIOS}), aiohttp for the rest" if args.loadgen == "wrk" else "aiohttp"
    print(f"Load generator: {gen}.\n")
    print(target_checks(results))
    if any(t.workers > 1 for t in chosen):
        variants = [t.name for t in chosen if t.pythonpath and t.workers == 1]
        for base in ("compactd-aiohttp", *variants, *(t.name for t in naive)):
            if table := workers_table(results, base):
                print(f"Workers, {base}:\n\n{table}")
    for name, seen in probes.items():
        print(f"{name} on the 400 KB body: {seen or 'no x-compactd-* headers'}")
    if args.json:
        Path(args.json).write_text(json.dumps(_as_json(results), indent=2))
    return 0


def _as_json(results: dict[str, dict[str, Result] | str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, res in results.items():
        if isinstance(res, str):
            out[name] = res
            continue
        out[name] = {
            k: {"rps": r.rps, "n": r.count, "errors": r.errors, "sse%": r.identical_pct}
            for k, r in res.items()
        }
    return out


def main() -> int:
    """Parse arguments and run the benchmark on uvloop."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of (b), (c), (d)")
    parser.add_argument("--requests", type=int, default=300, help="requests in (a)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (same total)")
    parser.add_argument("--only", default="", help="comma-separated target names")
    parser.add_argument("--scenarios", default="abcd", help="which of (a)-(d) to run")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run compactd (aiohttp) importing `proxy` from DIR first (name it compactd-…)",
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="worker counts, e.g. 1,2: adds compactd-aiohttp-w2 (on every core), and a -w2 of"
        " each naive target chosen",
    )
    parser.add_argument(
        "--config",
        default="",
        help="a compactd config file for every compactd target (e.g. a policy that never compacts)",
    )
    parser.add_argument(
        "--loadgen",
        choices=("aiohttp", "wrk"),
        default="aiohttp",
        help="wrk: Debian's C wrk drives (b)-(d) (cheap enough for --workers 1,2); no TTFB",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="run nginx and wrk SCHED_BATCH: they never preempt a proxy worker on their core",
    )
    parser.add_argument("--nice", type=int, default=0, help="scheduling priority (root: <0)")
    parser.add_argument(
        "--quiet",
        type=float,
        default=0.0,
        metavar="CORES",
        help="before each run wait until other work takes under CORES cores (e.g. 0.2)",
    )
    parser.add_argument(
        "--quiet-wait", type=float, default=60.0, help="most seconds each run waits for --quiet"
    )
    parser.add_argument("--profile", default="", help="directory for py-spy profiles")
    parser.add_argument("--json", default="", help="also write raw figures to this file")
    args = parser.parse_args()
    # This session's autogroup holds the load generator and nginx.
    with niced(args.nice):
        return uvloop.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
