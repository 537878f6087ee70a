"""Markdown rendering of benchmark results and the issue's target checks."""

from __future__ import annotations

import os
from typing import Any

from loadgen import Result, Scenario, percentile

Results = dict[str, dict[str, Result] | str]
MS = 1000.0


def _ms(values: list[float], pct: float) -> float:
    return percentile(values, pct) * MS


# (label, scenario, measure, percentile, added-over-direct); measure is a Result field or a
# property name ("rps", "identical_pct").
ROWS = (
    ("(a) c=1, 2 KB: latency p50 ms", "a", "latencies", 50, False),
    ("(a) added latency p50 ms", "a", "latencies", 50, True),
    ("(a) added latency p99 ms", "a", "latencies", 99, True),
    ("(b) c=32: req/s", "b", "rps", 0, False),
    ("(b) c=32: latency p99 ms", "b", "latencies", 99, False),
    ("(c) 64 streams: req/s", "c", "rps", 0, False),
    ("(c) TTFB p50 ms", "c", "ttfbs", 50, False),
    ("(c) TTFB p99 ms", "c", "ttfbs", 99, False),
    ("(c) added TTFB p50 ms", "c", "ttfbs", 50, True),
    ("(c) added TTFB p99 ms", "c", "ttfbs", 99, True),
    ("(c) SSE events byte-identical %", "c", "identical_pct", 0, False),
    ("(d) 400 KB, c=4: req/s", "d", "rps", 0, False),
    ("(d) latency p50 ms", "d", "latencies", 50, False),
    ("proxy CPU ms/request (a)", "a", "cpu_ms_per_request", 0, False),
    ("proxy CPU ms/request (b)", "b", "cpu_ms_per_request", 0, False),
    ("proxy CPU ms/request (c)", "c", "cpu_ms_per_request", 0, False),
    ("proxy CPU ms/request (d)", "d", "cpu_ms_per_request", 0, False),
    ("load generator CPU ms/request (b)", "b", "client_cpu_ms_per_request", 0, False),
    ("load generator CPU ms/request (c)", "c", "client_cpu_ms_per_request", 0, False),
    ("upstream (nginx) CPU ms/request (b)", "b", "upstream_cpu_ms_per_request", 0, False),
    ("upstream (nginx) CPU ms/request (c)", "c", "upstream_cpu_ms_per_request", 0, False),
    ("other processes' CPU, cores (b)", "b", "other_cores", 0, False),
    ("other processes' CPU, cores (c)", "c", "other_cores", 0, False),
)


def _cell(r: dict[str, Result], direct: dict[str, Result] | None, row: tuple[Any, ...]) -> str:
    _, sc, measure, pct, added = row
    value = getattr(r[sc], measure)
    if measure == "cpu_ms_per_request" and not value:
        return "—"  # direct: there is no proxy process
    if not isinstance(value, list):
        return f"{value:,.0f}" if measure == "rps" else f"{value:.2f}"
    if not value or (added and direct is not None and not getattr(direct[sc], measure)):
        return "—"  # wrk keeps no latencies
    if not added:
        return f"{_ms(value, pct):.2f}"
    if direct is None:
        return "n/a"
    return f"{_ms(value, pct) - _ms(getattr(direct[sc], measure), pct):+.2f}"


def render_table(results: Results, scs: list[Scenario]) -> str:
    """All targets side by side, one metric a row, as a markdown table."""
    direct = results.get("direct")
    d = direct if isinstance(direct, dict) else None
    names = list(results)
    out = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    ran = {sc.name for sc in scs}
    for row in (row for row in ROWS if row[1] in ran):
        cells = [_cell(r, d, row) if isinstance(r, dict) else "—" for r in results.values()]
        out.append(f"| {row[0]} | " + " | ".join(cells) + " |")
    errs = [
        f"{sum(x.errors for x in r.values())} / {sum(x.mismatched_bodies for x in r.values())}"
        if isinstance(r, dict)
        else "—"
        for r in results.values()
    ]
    out.append("| errors / non-identical JSON bodies | " + " | ".join(errs) + " |")
    notes = [f"`{n}`: {r}" for n, r in results.items() if isinstance(r, str)]
    shape = ", ".join(
        f"({s.name}) c={s.concurrency} "
        + (f"{s.requests} req" if s.requests else f"{s.seconds:g}s")
        + f" {len(s.body) / 1000:.1f} KB"
        for s in scs
    )
    return "\n".join([*out, "", f"Scenarios: {shape}.", *notes]) + "\n"


def target_checks(results: Results) -> str:
    """The issue's targets for compactd (1 worker), each marked met or missed."""
    direct, naive = results.get("direct"), results.get("naive-aiohttp")
    if not isinstance(direct, dict) or not isinstance(naive, dict) or len(direct) < 4:
        return "(targets need all four scenarios for direct and naive-aiohttp)\n"
    lines = []
    for name, r in results.items():
        if not name.startswith("compactd") or not isinstance(r, dict):
            continue
        b_share = r["b"].rps / naive["b"].rps * 100
        c_share = r["c"].rps / naive["c"].rps * 100
        ttfb_p99 = _ms(r["c"].ttfbs, 99) - _ms(direct["c"].ttfbs, 99)
        checks = [
            ("added p50 at c=1 <= 1.0 ms",
             _ms(r["a"].latencies, 50) - _ms(direct["a"].latencies, 50), 1.0, "<="),
            ("c=32 req/s >= 60% of naive-aiohttp", b_share, 60, ">="),
            ("64 streams req/s >= 60% of naive-aiohttp", c_share, 60, ">="),
            ("added TTFB p99 <= 60 ms", ttfb_p99, 60, "<="),
            ("400 KB bodies >= 500 req/s", r["d"].rps, 500, ">="),
            ("SSE events byte-identical = 100%", r["c"].identical_pct, 100, ">="),
        ]  # fmt: skip
        one = results.get("compactd-aiohttp")
        if name.endswith("-w2") and isinstance(one, dict):
            checks = [
                ("c=32 req/s >= 1.8x one worker", r["b"].rps / one["b"].rps, 1.8, ">="),
                ("64 streams req/s >= 1.8x one worker", r["c"].rps / one["c"].rps, 1.8, ">="),
                ("SSE events byte-identical = 100%", r["c"].identical_pct, 100, ">="),
            ]  # fmt: skip
        off = results.get("compactd-no-accounting")
        if name == "compactd-aiohttp" and isinstance(off, dict):
            checks += [
                ("c=32 req/s with accounting >= 95% of without",
                 r["b"].rps / off["b"].rps * 100, 95, ">="),
                ("64 streams req/s with accounting >= 95% of without",
                 r["c"].rps / off["c"].rps * 100, 95, ">="),
            ]  # fmt: skip
        lines.append(f"Targets for {name}:")
        for label, value, bound, op in checks:
            ok = value <= bound if op == "<=" else value >= bound
            lines.append(f"- [{'x' if ok else ' '}] {label}: {value:,.2f}")
    return "\n".join(lines) + "\n"


def describe(r: Result) -> str:
    """One run's figures on one line (printed per round, so a disturbed round shows)."""
    spread = "".join(f", connections per worker {'/'.join(map(str, s))}" for s in r.spreads)
    return (
        f"{r.rps:,.0f} req/s, proxy {r.cpu_ms_per_request:.2f} ms/req, load generator "
        f"{r.client_cpu_ms_per_request:.2f}, nginx {r.upstream_cpu_ms_per_request:.2f}, "
        f"other processes {r.other_cores:.2f} cores, {r.errors} errors{spread}"
    )


def fewest(r: Result) -> str:
    """The fewest connections a worker held in any run (of how many), '-' when not sampled."""
    if not r.spreads:
        return "-"
    low = min(r.spreads, key=min)
    return f"{min(low)} of {sum(low)}"


def workers_table(results: Results, one: str = "compactd-aiohttp") -> str:
    """Each multi-worker compactd against one worker in (b) and (c): req/s (proxy CPU ms per
    request), the ratio, and the ratio the CPU costs allow on this machine's cores.

    With p1, p2 the proxy's CPU per request with one and with N workers and g the load
    generator's and nginx's, one worker serves at most 1 / p1 requests a second (its core) and
    N workers on N cores at most N / (p2 + g): the bound is N p1 / (p2 + g), reached only when no
    other process takes CPU (the "other" column)."""
    base = results.get(one)
    if not isinstance(base, dict):
        return ""
    out = [
        "| scenario | workers | req/s (proxy CPU ms/req) | ratio | CPU bound | "
        "load gen + nginx ms/req | other processes, cores | a worker's fewest connections |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for sc, label in (("b", "(b) c=32"), ("c", "(c) 64 streams")):
        if sc not in base:
            continue
        r1 = base[sc]
        for name, res in results.items():
            if not (name == one or name.startswith(one + "-w")) or not isinstance(res, dict):
                continue
            r = res[sc]
            n = int(name.rsplit("-w", 1)[1]) if name != one else 1
            g = r.client_cpu_ms_per_request + r.upstream_cpu_ms_per_request
            p1, p = r1.cpu_ms_per_request, r.cpu_ms_per_request
            cores = min(n, os.cpu_count() or 1)
            bound = cores * p1 / (p + g) if p + g and n > 1 else 1.0
            ratio = r.rps / r1.rps if r1.rps else 0.0
            out.append(
                f"| {label} | {n} | {r.rps:,.0f} ({p:.2f}) | {ratio:.2f}x | {bound:.2f}x "
                f"| {g:.2f} | {r.other_cores:.2f} | {fewest(r)} |"
            )
    return "\n".join(out) + "\n"
