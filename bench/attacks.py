"""Issue 32's attacks, measured in-process: what each costs the gateway and what the client gets.

    .venv/bin/python bench/attacks.py [--rows 1,1b,2,4,7,8,9]   (BENCH_MODELS=20000 for 1b)

Each row runs in a process of its own (peak RSS is per process), against the real app (its
lifespan, an embedded SQLite store) through httpx's ASGI transport, in front of an upstream that
answers at once. Prints one line per row: the status the attacker got, the answer's bytes, the
wall time, the event loop's longest wait for /healthz meanwhile, and the process's peak RSS
growth. Run it from another checkout (PYTHONPATH=<tree>) to measure that tree instead.
Row 3 (slow heads and bodies, the fd cap) needs sockets: tests/security/test_bounded_connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path.cwd()))  # the tree measured: the one it is run from

from proxy.app.application import create_app
from proxy.config import Settings, load_settings
from proxy.store.base import UsageDelta
from proxy.wire.tenant import key_fingerprint
from tests.inprocess import lifespan, reply
from tests.security.conftest import history

ADMIN = "f3b1c9e07a5d42c8b6e1d0a9f7c3b5e2"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.asynccontextmanager
async def _app(**sections: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    def answer(request: httpx.Request) -> httpx.Response:
        return reply()(request)  # nothing of the request is kept

    with tempfile.TemporaryDirectory() as tmp:
        overrides: dict[str, Any] = {
            **sections,
            "upstream": {"url": "http://upstream.test/v1", **sections.get("upstream", {})},
            "server": {"data_dir": tmp, "admin_key": ADMIN, **sections.get("server", {})},
            "store": {"timeout_ms": 20_000},
        }
        app = create_app(
            load_settings(None, env={}, overrides=overrides),
            transport=httpx.MockTransport(answer),
        )
        async with lifespan(app):
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost", timeout=600
            ) as client:
                yield client, app.router.state.services


async def _with_health(client: httpx.AsyncClient, attack: Any) -> tuple[Any, float]:
    """The attack's result, and the event loop's longest stall while it ran (seconds): what a
    /healthz sent meanwhile would have waited at least."""
    del client
    worst = 0.0
    task = asyncio.ensure_future(attack)
    while not task.done():
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        worst = max(worst, time.perf_counter() - t0 - 0.01)
    return await task, worst


async def _compacted(client: httpx.AsyncClient, key: str, tag: str = "") -> list[dict[str, Any]]:
    """Forwarded messages of a compacted conversation (the stand-ins compactd wrote)."""
    body = {"model": "gpt-4o", "messages": history(30, tag)}
    r = await client.post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert r.headers["x-compactd-action"] == "compacted", r.headers
    return body["messages"]


async def row_1() -> dict[str, Any]:
    async with _app() as (client, _):
        attack = client.get(
            "/compactd/v1/savings",
            params={"since": "0001-01-01"},
            headers={"authorization": "Bearer sk-made-up"},
        )
        r, health = await _with_health(client, attack)
    return {"status": r.status_code, "bytes": len(r.content), "loop_stall_s": health}


async def row_1b(models: int) -> dict[str, Any]:
    # A deadline it never meets: this row measures the work (a tree without limits has none).
    roomy = {"limits": {"api_work_timeout_ms": 600_000}} if hasattr(Settings(), "limits") else {}
    async with _app(**roomy) as (client, services):
        day = time.strftime("%Y-%m-%d", time.gmtime())
        counters = {"requests": 1, "action:passthrough": 1, "tokens_before": 10}
        await services.store.add_usage(
            [UsageDelta("t", "default", f"m-{i}", day, counters) for i in range(models)]
        )
        attack = client.get(
            "/compactd/v1/savings",
            params={"by": "policy", "since": "7d"},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        r, health = await _with_health(client, attack)
    return {
        "models": models,
        "status": r.status_code,
        "bytes": len(r.content),
        "loop_stall_s": health,
    }


async def row_2() -> dict[str, Any]:
    async with _app(default_policy={"budget_tokens": 1500}) as (client, _):
        await _compacted(client, "sk-a")
        carrier = next(m for m in await _last_forwarded(client) if "compactd:ref=" in json.dumps(m))
        body = {"messages": [carrier] * 16_000}
        r, health = await _with_health(
            client,
            client.post(
                "/compactd/v1/uncompress", json=body, headers={"authorization": "Bearer sk-a"}
            ),
        )
    return {"status": r.status_code, "bytes": len(r.content), "loop_stall_s": health}


async def _last_forwarded(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The compacted messages of the one stored conversation (its latest checkpoint)."""
    listing = await client.get(
        "/compactd/v1/conversations", headers={"authorization": "Bearer sk-a"}
    )
    conv = listing.json()["data"][0]["conversation"]
    got = await client.get(
        f"/compactd/v1/conversations/{conv}", headers={"authorization": "Bearer sk-a"}
    )
    checkpoints = got.json()["checkpoints"]
    return list(max(checkpoints, key=lambda c: c["covered_through"])["messages"])


async def row_4() -> dict[str, Any]:
    secret = "bench-secret"
    good = key_fingerprint(secret.encode(), "sk-admitted")
    sections = {
        "server": {"secret": secret},
        "upstream": {"api_key": "sk-REAL", "allowed_keys": [good]},
    }
    async with _app(**sections) as (client, _):
        made_up = {"authorization": "Bearer sk-made-up"}
        chat = await client.post("/v1/chat/completions", json={"messages": []}, headers=made_up)
        me = await client.get("/compactd/v1/me", headers=made_up)
        savings = await client.get("/compactd/v1/savings", headers=made_up)
    return {"chat": chat.status_code, "me": me.status_code, "savings": savings.status_code}


async def row_7() -> dict[str, Any]:
    async with _app(server={"shared_anonymous_tenant": True}) as (client, _):
        listing = await client.get(
            "/compactd/v1/conversations", headers={"host": "attacker.example"}
        )
    return {"status": listing.status_code}


async def row_8() -> dict[str, Any]:
    async with _app(default_policy={"budget_tokens": 1500}) as (client, _):
        await _compacted(client, "sk-a", " victim")
        carrier = next(m for m in await _last_forwarded(client) if "compactd:ref=" in json.dumps(m))
        ref = json.dumps(carrier).split("compactd:ref=")[1][:10]
        mine = [
            {"role": "system", "content": "another end user"},
            {"role": "user", "content": f"[compactd:ref={ref} dropped]"},
        ]
        r = await client.post(
            "/compactd/v1/uncompress",
            json={"messages": mine, "recursive": True},
            headers={"authorization": "Bearer sk-a"},
        )
    return {"status": r.status_code, "messages_back": len(r.json().get("messages", []))}


async def row_9() -> dict[str, Any]:
    raw = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": ""}] * 1_000_000})
    body = raw.encode()
    async with _app(server={"max_body_bytes": 64 << 20}) as (client, _):
        before = _rss_mb()
        sends = [
            client.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
            for _ in range(8)
        ]
        results, health = await _with_health(client, asyncio.gather(*sends))
    return {
        "body_mb": round(len(body) / 2**20, 1),
        "statuses": sorted({r.status_code for r in results}),
        "peak_rss_growth_mb": round(_rss_mb() - before),
        "loop_stall_s": health,
    }


ROWS = {
    "1": row_1,
    "1b": lambda: row_1b(int(os.environ.get("BENCH_MODELS", "20000"))),
    "2": row_2,
    "4": row_4,
    "7": row_7,
    "8": row_8,
    "9": row_9,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        start, rss = time.perf_counter(), _rss_mb()
        out = asyncio.run(ROWS[args.one]())
        out["wall_s"] = round(time.perf_counter() - start, 2)
        out["peak_rss_mb"] = round(_rss_mb())
        out["start_rss_mb"] = round(rss)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
        return
    for row in args.rows.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--one", row],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path.cwd(),
        )
        last = done.stdout.strip().splitlines()[-1:] or [done.stderr.strip()[-300:]]
        print(f"row {row}: {last[0]}")


if __name__ == "__main__":
    main()
