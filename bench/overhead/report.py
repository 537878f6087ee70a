"""Markdown rendering of benchmark results and the issue's target checks."""

from __future__ import annotations

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
)


def _cell(r: dict[str, Result], direct: dict[str, Result] | None, row: tuple[Any, ...]) -> str:
    _, sc, measure, pct, added = row
    value = getattr(r[sc], measure)
    if measure == "cpu_ms_per_request" and not value:
        return "—"  # direct: there is no proxy process
    if not isinstance(value, list):
        return f"{value:,.0f}" if measure == "rps" else f"{value:.2f}"
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
