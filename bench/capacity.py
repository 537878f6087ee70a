"""Several compactd instances on one Redis Cluster: what each request type costs there.

    .venv/bin/python bench/capacity.py [--instances 3] [--conversations 12] [--turns 15]

Starts a local Redis Cluster (3 masters, 3 replicas: tests/store/redis_cluster.py) and N
compactd apps in this process (create_app, each its own lifespan, store and caches; the upstream
an httpx MockTransport). Each conversation is an agent session (openai-python's bytes, 14 tools,
bench/replay.py's session) whose first request is over the budget; its turns go round-robin
over the instances, as a load balancer without affinity sends them, so every instance meets
every conversation. Reports, per action: requests, CPU ms p50 (this process's, around the
request: the in-process client and fake upstream included), compactd's overhead ms p50, and
the store commands and bytes per request summed over the masters (their INFO stats around each
request); then how the run's commands, bytes and memory spread over the masters, Redis memory
per conversation, and what each instance's bounded caches hold. docs/capacity.md uses it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import body_shapes
from bench.replay import BUDGET, FIRST_TURN, _pct, _session
from proxy.app.application import create_app
from proxy.config import load_settings
from tests.inprocess import lifespan, reply
from tests.store.redis_cluster import LocalCluster


def _masters(cluster: LocalCluster) -> dict[int, tuple[int, int, int]]:
    """Per master port: (commands, bytes in + out, used memory)."""
    out = {}
    for port in cluster.master_ports():
        node = cluster.node_by_port(port)
        stats, memory = node.info("stats"), node.info("memory")
        moved = int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])  # type: ignore[call-overload]
        out[port] = (int(stats["total_commands_processed"]), moved, int(memory["used_memory"]))  # type: ignore[call-overload]
    return out


def _delta(a: dict[int, tuple[int, int, int]], b: dict[int, tuple[int, int, int]]) -> list[int]:
    """(commands, bytes, memory) from `a` to `b`, summed over the masters."""
    return [sum(b[p][i] - a[p][i] for p in a) for i in range(3)]


async def run(args: argparse.Namespace, cluster: LocalCluster) -> str:
    """The measured run and its report."""
    rows: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        apps = []
        for i in range(args.instances):
            data = stack.enter_context(tempfile.TemporaryDirectory())
            settings = load_settings(None, env={}, overrides={
                "upstream": {"url": "http://upstream.test/v1"},
                "server": {"data_dir": data, "secret": "bench-capacity"},  # one tenant id for a key
                "store": {"url": cluster.url, "timeout_ms": 20_000},
                "accounting": {"enabled": False},
                "default_policy": {"budget_tokens": BUDGET},
            })  # fmt: skip
            app = create_app(settings, transport=httpx.MockTransport(reply()))
            await stack.enter_async_context(lifespan(app))
            transport = httpx.ASGITransport(app=app)
            client = httpx.AsyncClient(transport=transport, base_url=f"http://i{i}")
            clients.append(await stack.enter_async_context(client))
            apps.append(app)
        empty = _masters(cluster)
        convs = [f"cap-{uuid.uuid4().hex[:12]}" for _ in range(args.conversations)]
        for k in range(args.turns):
            raw = body_shapes.body("openai-python", _session(FIRST_TURN + 2 * k), 14)
            for c, conv in enumerate(convs):
                client = clients[(c + k) % args.instances]
                probe, before, cpu = _masters(cluster), _masters(cluster), time.process_time()
                r = await client.post("/v1/chat/completions", content=raw, headers={
                    "authorization": f"Bearer sk-cap-{c % 4}", "content-type": "application/json",
                    "x-compactd-conversation-id": conv,
                })  # fmt: skip
                cpu = time.process_time() - cpu
                after = _masters(cluster)
                cost = _delta(probe, before)  # what the probe itself adds (INFO on each master)
                cmds, moved, _ = (x - y for x, y in zip(_delta(before, after), cost, strict=True))
                rows.append({"action": r.headers["x-compactd-action"], "cpu_ms": cpu * 1000,
                             "overhead_ms": float(r.headers["x-compactd-overhead-ms"]),
                             "cmds": cmds, "bytes": moved})  # fmt: skip
        full = _masters(cluster)
        caches = [_caches(app) for app in apps]
    return _report(rows, empty, full, args.conversations, caches)


def _caches(app: Any) -> str:
    """What an instance's bounded caches hold after the run (bytes)."""
    compactor = app.router.state.services.compactor
    store = compactor.store
    return (
        f"bodies {compactor.bodies._bytes:,}, prefixes {compactor.splicer.prefixes.size:,}, "
        f"checkpoints {store._decoded._bytes:,}"
    )


def _report(
    rows: list[dict[str, Any]],
    empty: dict[int, tuple[int, int, int]],
    full: dict[int, tuple[int, int, int]],
    conversations: int,
    caches: list[str],
) -> str:
    lines = [
        "| action | requests | CPU ms p50 | overhead ms p50 | store commands | store bytes |",
        "|---|---|---|---|---|---|",
    ]
    for action in ("passthrough", "replayed", "compacted", "error"):
        mine = [r for r in rows if r["action"] == action]
        if mine:
            lines.append(
                f"| {action} | {len(mine)} | {_pct([r['cpu_ms'] for r in mine], 0.5):.2f} | "
                f"{_pct([r['overhead_ms'] for r in mine], 0.5):.2f} | "
                f"{statistics.mean(r['cmds'] for r in mine):.1f} | "
                f"{statistics.mean(r['bytes'] for r in mine):,.0f} |"
            )
    lines += ["", "| master | commands | bytes | memory |", "|---|---|---|---|"]
    for port in sorted(full):
        cmds, moved, mem = (full[port][i] - empty[port][i] for i in range(3))
        lines.append(f"| {port} | {cmds:,} | {moved:,} | {mem:,} |")
    memory = _delta(empty, full)[2]
    lines += ["", f"Redis memory per conversation: {memory / conversations:,.0f} bytes"]
    lines += [f"instance {i} caches: {c}" for i, c in enumerate(caches)]
    return "\n".join(lines)


def main() -> None:
    """Start the cluster, run, print the report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--turns", type=int, default=15)
    args = p.parse_args()
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="bench-capacity-")))
    cluster.start()
    try:
        print(asyncio.run(run(args, cluster)))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
