"""Store latency: p50/p99 of find_checkpoint and save_compaction, Redis and SQLite.

    .venv/bin/python bench/store.py [--redis redis://127.0.0.1:6379/0] [--n 2000] [--concurrency 16]
        [--min-replicas-ack N]      (--redis also takes redis+cluster://h1:p1,h2:p2)

Realistic sizes: a 200-message agent conversation (user ~300 B, assistant ~1.2 KB, tool results
~3 KB: ~300 KB of history) with 5 checkpoints already stored (covered_through 29, 59, …, 149);
find_checkpoint is given all 200 prefix digests, as the proxy does on every request.
save_compaction writes a 30-message compaction (30 originals, 1 ref, a 3-message checkpoint) into
a fresh conversation. Sequential figures are the latency one request sees; the concurrent run
shows the pool and Redis under 16 requests in flight. Redis keys use a random prefix and are
deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from proxy.runtime.digest import message_digest, prefix_digests
from proxy.store.base import Checkpoint, Compaction, Store
from proxy.store.redis.store import RedisStore
from proxy.store.sqlite.store import SqliteStore

TENANT = "0123456789abcdef01234567"
TTL = 30 * 86400


def conversation(n: int = 200) -> list[dict[str, object]]:
    """An agent loop: user, assistant with a tool call, tool result, assistant prose."""
    out: list[dict[str, object]] = [{"role": "system", "content": "You are a coding agent. " * 40}]
    i = 0
    while len(out) < n:
        out.append({"role": "user", "content": f"turn {i}: " + "please look at the file. " * 12})
        call = {"id": f"call_{i}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": f'{{"path": "src/m{i}.py"}}'}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"line {i}\n" * 400})
        out.append({"role": "assistant", "content": f"Done {i}. " + "The change works. " * 70})
        i += 1
    return out[:n]


def compaction(conv: str, msgs: list[dict[str, object]], start: int, k: int) -> Compaction:
    """Messages [start..k] replaced by a 3-message summary (the checkpoint covers [0..k])."""
    digests = [message_digest(m) for m in msgs]
    summary = [{"role": "user", "content": f"[compactd:ref={k:010x} … summary] " + "x" * 1500}]
    cp = Checkpoint(
        tenant=TENANT,
        conversation=conv,
        source_digest=prefix_digests(digests)[k],
        covered_through=k,
        messages=[msgs[0], *summary, {"role": "assistant", "content": "ok"}],
        providers=["trim"],
        created_at=time.time(),
    )
    originals = dict(zip(digests[start : k + 1], msgs[start : k + 1], strict=True))
    return Compaction(cp, originals, {f"{k:010x}": digests[start : k + 1]})


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, label: str, op: str, run: tuple[list[float], float]) -> None:
    xs, cpu = run
    print(
        f"{name:7} {label:13} {op:16} n={len(xs):5}  p50 {statistics.median(xs):6.2f} ms"
        f"  p99 {pct(xs, 0.99):6.2f} ms  max {max(xs):6.2f} ms  client CPU {cpu:5.2f} ms/call"
    )


async def timed(
    n: int, concurrency: int, call: Callable[[int], Awaitable[object]]
) -> tuple[list[float], float]:
    """Per-call latency in ms for n calls, `concurrency` at a time, and this process's CPU ms per
    call (what the store costs the proxy, whatever else the machine is doing)."""
    samples: list[float] = []
    cpu0 = time.process_time()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter_ns()
            await call(i)
            samples.append((time.perf_counter_ns() - t0) / 1e6)

    await asyncio.gather(*(one(i) for i in range(n)))
    return samples, (time.process_time() - cpu0) * 1000 / n


async def bench(name: str, store: Store, n: int, concurrency: int) -> None:
    msgs = conversation()
    pd = prefix_digests([message_digest(m) for m in msgs])
    for k in range(29, 150, 30):
        await store.save_compaction(compaction("c-find", msgs, max(1, k - 29), k), TTL)
    assert (found := await store.find_checkpoint(TENANT, "c-find", pd)) is not None
    assert found.covered_through == 149

    async def find(_: int) -> object:
        return await store.find_checkpoint(TENANT, "c-find", pd)

    saves = [compaction(f"c-save-{uuid.uuid4().hex[:8]}", msgs, 1, 30) for _ in range(n * 2)]

    async def save(i: int) -> object:
        return await store.save_compaction(saves[i], TTL)

    await timed(min(n, 200), 1, find)  # warm-up
    for label, conc in (("sequential", 1), (f"{concurrency} in flight", concurrency)):
        f = await timed(n, conc, find)
        s = await timed(n // 2, conc, lambda i, off=(0 if conc == 1 else n): save(i + off))
        report(name, label, "find_checkpoint", f)
        report(name, label, "save_compaction", s)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--skip-sqlite", action="store_true")
    ap.add_argument("--min-replicas-ack", type=int, default=0)
    args = ap.parse_args()

    prefix = f"compactd-bench-{uuid.uuid4().hex[:8]}:"
    redis_store = await RedisStore.open(
        args.redis,
        timeout_ms=2000,
        pool_size=50,
        prefix=prefix,
        min_replicas_ack=args.min_replicas_ack,
    )
    try:
        # The floor on this machine right now: one bare GET round trip, no store code.
        raw = redis_store._client
        xs = await timed(args.n, 1, lambda _: raw.get(f"{prefix}none"))
        report("redis", "baseline", "one bare GET", xs)
        await bench("redis", redis_store, args.n, args.concurrency)
    finally:
        client = redis_store._client  # cleanup of the bench's own keys
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
        await redis_store.close()
    if not args.skip_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            sqlite_store = await SqliteStore.open(Path(tmp) / "compactd.db", timeout_ms=2000)
            await bench("sqlite", sqlite_store, args.n, args.concurrency)
            await sqlite_store.close()


if __name__ == "__main__":
    asyncio.run(main())
