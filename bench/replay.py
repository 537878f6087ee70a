"""What a replayed turn costs, per SDK body shape and tool count, before and after a change.

    .venv/bin/python bench/replay.py [--before /tmp/before] [--rounds 3] [--turns 30]
        [--shapes openai-python,anthropic] [--tools 0,14,128] [--store redis|sqlite]

An agent session (bench/body_shapes.py: the real SDKs' bytes) grows two messages a turn past its
budget, is compacted, then replayed turn after turn, through the real app in-process (create_app,
its lifespan and store; the upstream is an httpx MockTransport). For every request it records
the action, compactd's own `x-compactd-overhead-ms`, the child's CPU time around it (the
in-process client and fake upstream included: the same for every tree) and, on Redis, the
bytes the store moved
(a private redis-server's INFO `total_net_input_bytes` + `total_net_output_bytes`, the INFO's
own bytes taken off; accounting is off so only the request path's store traffic counts).

`--before DIR` runs a second tree (e.g. `git archive fd3fe68 proxy config | tar -x -C DIR`)
in the same way: each round runs every tree in a child process, the tree going first rotating,
so load from elsewhere on a shared machine falls on both alike. The table gives, per tree,
shape and tool count: replayed turns, overhead p50/p99 (ms), CPU ms p50 of a replayed turn,
store bytes per replayed, compacted and passthrough request; then the same per API (the shapes
of one API together, with compactd's own CPU: the event loop thread's time in
`Compactor.read` and `Compactor.decide`) and per action.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
# Appended, not inserted: a child's PYTHONPATH puts the tree it measures first.
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from bench import body_shapes  # noqa: E402
from proxy.app.application import create_app  # noqa: E402
from proxy.chat.compactor import Compactor  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from tests.inprocess import lifespan, reply  # noqa: E402
from tests.store.redis_server import RedisServer  # noqa: E402

BUDGET = 40_000
CAPPED = ["chat.completions", "responses", "messages"]
FIRST_TURN = 300
"""The session's first request: ~300 messages, ~64k tokens, over the budget (compacted);
Anthropic's calibrated budget (its tokenizer counts more) is a little higher."""


def _session(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " * 30}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": f"step {i} [ok] " + "output line from a tool " * 40})
    return msgs


def _timed(spent: list[float], method: Any) -> Any:
    """`method`, adding the event loop thread's CPU time spent in it to `spent`."""

    async def timed(*args: Any, **kw: Any) -> Any:
        t0 = time.thread_time()
        try:
            return await method(*args, **kw)
        finally:
            spent.append(time.thread_time() - t0)

    return timed


async def _child(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One tree's measurements (run with that tree's `proxy` first on sys.path)."""
    out: list[dict[str, Any]] = []
    # compactd's own CPU: reading the request and deciding what to send (the thread's time,
    # so not the store's or the event loop's waits; the relay and the client are apart).
    own: list[float] = []
    for name in ("read", "decide"):
        setattr(Compactor, name, _timed(own, getattr(Compactor, name)))
    counters = redis.Redis.from_url(args.redis) if args.store == "redis" else None

    def net() -> tuple[int, int]:
        """(bytes in + out, commands) the server has handled so far."""
        if counters is None:
            return 0, 0
        stats = counters.info("stats")
        moved = int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])
        return moved, int(stats["total_commands_processed"])

    if counters is not None:
        counters.config_resetstat()

    for shape in args.shapes.split(","):
        for tools in [int(t) for t in args.tools.split(",")]:
            with tempfile.TemporaryDirectory() as data:
                store: dict[str, Any] = {"timeout_ms": 20_000}
                if args.store == "redis":
                    store |= {"url": args.redis}
                conversation = f"bench-{uuid.uuid4().hex[:12]}"  # a run of its own on the server
                settings = load_settings(None, env={}, overrides={
                    "upstream": {"url": "http://upstream.test/v1"},
                    "server": {"data_dir": data},
                    "store": store,
                    "accounting": {"enabled": False},
                    "default_policy": {"budget_tokens": BUDGET, "cap_apis": CAPPED},
                })  # fmt: skip
                app = create_app(settings, transport=httpx.MockTransport(reply()))
                async with lifespan(app):
                    transport = httpx.ASGITransport(app=app)
                    async with httpx.AsyncClient(transport=transport, base_url="http://c") as c:
                        for turn in range(FIRST_TURN, FIRST_TURN + 2 * args.turns, 2):
                            raw = body_shapes.body(shape, _session(turn), tools)
                            base = net()
                            probe = net()  # what one INFO itself adds
                            before, cpu = net(), time.process_time()
                            own.clear()
                            r = await c.post(body_shapes.path(shape), content=raw, headers={
                                "authorization": "Bearer sk-bench", "x-api-key": "sk-bench",
                                "content-type": "application/json",
                                "x-compactd-conversation-id": conversation,
                            })  # fmt: skip
                            cpu = time.process_time() - cpu
                            after = net()
                            moved, cmds = (
                                a - b - (p - q)
                                for a, b, p, q in zip(after, before, probe, base, strict=True)
                            )
                            out.append({
                                "shape": shape, "tools": tools,
                                "action": r.headers.get("x-compactd-action", "?"),
                                "overhead_ms": float(r.headers["x-compactd-overhead-ms"]),
                                "store_bytes": moved, "store_cmds": cmds, "cpu_ms": cpu * 1000,
                                "own_ms": sum(own) * 1000,
                            })  # fmt: skip
    if counters is not None:
        stats = counters.info("commandstats")
        scripts = {
            k: v for k, v in stats.items() if k.startswith(("cmdstat_evalsha", "cmdstat_eval"))
        }
        out.append({"shape": "_redis", "commandstats": scripts})
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _report(rows: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| tree | shape | tools | replayed | overhead p50 ms | p99 ms | CPU ms/replayed | "
        "store B/replayed | B/compacted | B/passthrough |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["shape"], r["tools"]) for rs in rows.values() for r in rs if "tools" in r})
    for shape, tools in keys:
        for tree, rs in rows.items():
            mine = [r for r in rs if (r["shape"], r.get("tools")) == (shape, tools)]
            rep = [r["overhead_ms"] for r in mine if r["action"] == "replayed"]
            cpu = [r["cpu_ms"] for r in mine if r["action"] == "replayed"]

            def mean_bytes(action: str, mine: list[dict[str, Any]] = mine) -> str:
                got = [r["store_bytes"] for r in mine if r["action"] == action]
                return f"{statistics.mean(got):,.0f}" if got else "-"

            lines.append(
                f"| {tree} | {shape} | {tools} | {len(rep)} | {_pct(rep, 0.5):.2f} | "
                f"{_pct(rep, 0.99):.2f} | {_pct(cpu, 0.5):.2f} | {mean_bytes('replayed')} | "
                f"{mean_bytes('compacted')} | {mean_bytes('passthrough')} |"
            )
    return "\n".join([*lines, "", _per_api(rows), "", _per_action(rows)])


def _per_api(rows: dict[str, list[dict[str, Any]]]) -> str:
    """Per API and tool count, over its shapes: what a replayed turn costs."""
    lines = [
        "| API | tools | tree | replayed | CPU ms p50 | compactd CPU ms p50 | overhead ms p50 | "
        "store B/replayed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    apis = {"/v1/chat/completions": "chat.completions", "/v1/responses": "responses"}
    apis["/v1/messages"] = "messages"
    keys = sorted(
        {(apis[body_shapes.path(r["shape"])], r["tools"]) for rs in rows.values() for r in rs
         if "tools" in r}
    )  # fmt: skip
    for api, tools in keys:
        for tree, rs in rows.items():
            mine = [
                r for r in rs
                if "tools" in r and r["action"] == "replayed" and r["tools"] == tools
                and apis[body_shapes.path(r["shape"])] == api
            ]  # fmt: skip
            if not mine:
                continue
            cpu = _pct([r["cpu_ms"] for r in mine], 0.5)
            own = _pct([r.get("own_ms", float("nan")) for r in mine], 0.5)
            overhead = _pct([r["overhead_ms"] for r in mine], 0.5)
            moved = statistics.mean(r["store_bytes"] for r in mine)
            lines.append(
                f"| {api} | {tools} | {tree} | {len(mine)} | {cpu:.2f} | {own:.2f} | "
                f"{overhead:.2f} | {moved:,.0f} |"
            )
    return "\n".join(lines)


def _per_action(rows: dict[str, list[dict[str, Any]]]) -> str:
    """Per tree and action, over every shape and tool count: what one request costs."""
    lines = [
        "| tree | action | requests | CPU ms p50 | overhead ms p50 | store commands | "
        "store bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for tree, rs in rows.items():
        for action in ("passthrough", "replayed", "compacted"):
            mine = [r for r in rs if r.get("action") == action]
            if not mine:
                continue
            cmds = statistics.mean(r["store_cmds"] for r in mine)
            moved = statistics.mean(r["store_bytes"] for r in mine)
            cpu = _pct([r["cpu_ms"] for r in mine], 0.5)
            overhead = _pct([r["overhead_ms"] for r in mine], 0.5)
            lines.append(
                f"| {tree} | {action} | {len(mine)} | {cpu:.2f} | {overhead:.2f} | {cmds:.1f} | "
                f"{moved:,.0f} |"
            )
    for tree, rs in rows.items():
        for r in rs:
            if r.get("shape") == "_redis":
                for name, stat in sorted(r["commandstats"].items()):
                    lines.append(f"\n{tree} redis {name}: {stat}")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments; the parent runs rounds of children, a child measures one tree."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", default="")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument(
        "--shapes",
        default="openai-python,openai-node,anthropic,claude-code,codex-responses,codex-cli",
    )
    p.add_argument("--tools", default="0,14,128")
    p.add_argument("--store", choices=["redis", "sqlite"], default="redis")
    p.add_argument("--redis", default="")
    p.add_argument("--child", default="")
    p.add_argument("--save", default="", help="also write the raw rows (JSON) to this file")
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args))))
        return
    trees = {"after": str(ROOT)}
    if args.before:
        trees = {"before": args.before, **trees}
    server = None
    if args.store == "redis" and not args.redis:
        server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-replay-")))
        server.start()
        args.redis = server.url
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    try:
        for n in range(args.rounds):
            order = list(trees)[n % len(trees) :] + list(trees)[: n % len(trees)]
            for tree in order:
                env = {**os.environ, "PYTHONPATH": f"{trees[tree]}:{ROOT}"}
                cmd = [sys.executable, __file__, "--child", tree, "--turns", str(args.turns),
                       "--shapes", args.shapes, "--tools", args.tools, "--store", args.store,
                       "--redis", args.redis]  # fmt: skip
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                rows[tree] += json.loads(done.stdout.strip().splitlines()[-1])
                print(f"round {n + 1} {tree}: done", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
    if args.save:
        Path(args.save).write_text(json.dumps(rows))
    print(_report(rows))


if __name__ == "__main__":
    main()
