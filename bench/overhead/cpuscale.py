"""The machine's own two-core scaling, without compactd: a control for `run.py --workers 1,2`.

    flock /work/.bench.lock .venv/bin/python bench/overhead/cpuscale.py [--rounds 20]
        [--seconds 2] [--kinds loop,json] [--nice -20]

The same CPU-bound Python work runs in one process (pinned to one core, the other idle) and in
two at once (one pinned to each core), alternated over --rounds rounds (the lone process's
core alternating too), so load from elsewhere falls on both alike. Each process reports the
units of work it did and the CPU time it used (its own `process_time`): if a unit costs more
CPU when both cores are busy, the machine (shared caches, the host's scheduling of its vCPUs)
makes two busy cores slower than one, whatever runs on them. Kinds of work:

- `loop`: an arithmetic Python loop (the interpreter's dispatch, a tiny working set);
- `mem`: dict lookups scattered over an ~8 MB table (past a core's 2 MB L2: the shared L3 and
  memory);
- `json`: parsing and serializing a ~2 KB chat body with the standard library's `json`, plus a
  sha256 of it (the shape of a proxy's per-request work, a working set of a few hundred KB
  with allocation churn).

Prints, per kind, CPU µs per unit alone and with both cores busy (median over the rounds and
the total), the rise, and the two processes' throughput against one (2.00x is perfect scaling).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from procs import cores, niced  # noqa: E402

BODY = json.dumps(
    {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 8},
            *(
                {"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 30}
                for i in range(8)
            ),
        ],
        "max_tokens": 64,
    }
)


def unit_loop() -> int:
    total = 0
    for i in range(2_000):
        total += i * i % 7
    return total


def unit_json() -> int:
    doc = json.loads(BODY)
    doc["messages"].append({"role": "user", "content": "next"})
    out = json.dumps(doc).encode()
    return len(hashlib.sha256(out).digest())


_TABLE = {i: str(i) for i in range(1 << 16)}  # ~8 MB of dict, keys and values: past L2
_STEP = 40_503


def unit_mem() -> int:
    """2,000 dict lookups scattered over a table larger than a core's own cache."""
    total, k = 0, 1
    for _ in range(2_000):
        k = (k * _STEP + 1) & 0xFFFF
        total += len(_TABLE[k])
    return total


UNITS = {"loop": unit_loop, "json": unit_json, "mem": unit_mem}


def child(kind: str, seconds: float, start_at: float) -> None:
    """Work until `seconds` after `start_at` (wall clock, so two children overlap fully);
    print units done and CPU seconds used."""
    work = UNITS[kind]
    for _ in range(200):  # warm the caches and the allocator before the clock starts
        work()
    while time.time() < start_at:
        time.sleep(0.001)
    cpu0 = time.process_time()
    end = start_at + seconds
    n = 0
    while time.time() < end:
        for _ in range(20):
            work()
        n += 20
    print(json.dumps({"units": n, "cpu": time.process_time() - cpu0}))


def run(kind: str, cpus: list[int], seconds: float) -> list[dict[str, float]]:
    """One phase: a child per listed core, all working over the same wall-clock interval."""
    start_at = time.time() + 0.3
    procs = []
    for core in cpus:
        argv = [sys.executable, __file__, "--child", kind, str(seconds), str(start_at)]
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            preexec_fn=lambda c=core: os.sched_setaffinity(0, {c}),  # noqa: PLW1509
        )
        procs.append(proc)
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=seconds + 30)
        out.append(json.loads(stdout))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0, help="each phase's length")
    parser.add_argument("--kinds", default="loop,mem,json")
    parser.add_argument("--nice", type=int, default=0, help="scheduling priority (root: <0)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, seconds, start_at = args.child
        child(kind, float(seconds), float(start_at))
        return 0
    first, second = cores()
    with niced(args.nice):  # inherited by the children
        rows = []
        for kind in args.kinds.split(","):
            alone: list[tuple[int, float]] = []
            both: list[tuple[int, float]] = []
            for rnd in range(args.rounds):
                lone = first if rnd % 2 == 0 else second
                phases = [("alone", [lone]), ("both", [first, second])]
                if rnd % 4 >= 2:
                    phases.reverse()
                for phase, cpus in phases:
                    res = run(kind, cpus, args.seconds)
                    sink = alone if phase == "alone" else both
                    sink += [(int(r["units"]), float(r["cpu"])) for r in res]
                    per = ", ".join(f"{r['cpu'] / r['units'] * 1e6:.2f}" for r in res)
                    print(f"   {kind} round {rnd + 1} {phase}: µs/unit {per}", file=sys.stderr)
            rows.append(summarise(kind, alone, both, args.seconds))
    print(
        "| work | CPU µs/unit alone, median (total) | both cores busy | rise "
        "| units/s alone | units/s, two processes | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nLoad average at the end: {load} on {os.cpu_count()} cores.")
    return 0


def summarise(
    kind: str, alone: list[tuple[int, float]], both: list[tuple[int, float]], seconds: float
) -> str:
    """One table row: CPU per unit alone and both busy, the rise, the throughput ratio."""

    def per_unit(xs: list[tuple[int, float]]) -> tuple[float, float]:
        med = statistics.median(c / u for u, c in xs) * 1e6
        total = sum(c for _, c in xs) / sum(u for u, _ in xs) * 1e6
        return med, total

    (am, at), (bm, bt) = per_unit(alone), per_unit(both)
    rate1 = sum(u for u, _ in alone) / (len(alone) * seconds)
    rate2 = sum(u for u, _ in both) / (len(both) / 2 * seconds)
    return (
        f"| {kind} | {am:.2f} ({at:.2f}) | {bm:.2f} ({bt:.2f}) | {(bt / at - 1) * 100:+.1f} % "
        f"| {rate1:,.0f} | {rate2:,.0f} | {rate2 / rate1:.2f}x |"
    )


if __name__ == "__main__":
    sys.exit(main())
