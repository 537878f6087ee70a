"""Two `compactd serve` processes with two workers each on one store agree on everything.

The same conversations are driven through both instances, alternately and concurrently (the
same request to both at once, as a retrying client behind a load balancer does). Whichever
process and worker serves a request, the same request is forwarded as the same bytes, and a
compaction event leaves one checkpoint, on one Redis, on a Redis Cluster laid out as
docker-compose.cluster.yml lays it out, and on one SQLite file.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from tests.instances import instances
from tests.store.redis_cluster import LocalCluster
from tests.store.redis_server import RedisServer
from tests.store.test_cluster import KEY, history
from tests.upstream import FakeUpstream

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "[default_policy]\nbudget_tokens = 600\n"
TURNS = range(3, 13)
SLOW_MACHINE_TIMEOUT_MS = "3000"
"""A store call that fails open on one instance and not the other would forward different
bytes: the test is about agreement, so a busy machine must not turn into fail-open."""


def compose_env(store_url: str, upstream: str) -> dict[str, str]:
    """compactd's environment in docker-compose.cluster.yml, pointed at local services."""
    spec = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text())
    env = {k: str(v) for k, v in spec["x-compactd"]["environment"].items()}
    env["COMPACTD_STORE_URL"] = store_url
    env["COMPACTD_UPSTREAM_URL"] = upstream
    env["COMPACTD_SECRET"] = "one-secret-for-every-instance"
    env["COMPACTD_STORE_TIMEOUT_MS"] = SLOW_MACHINE_TIMEOUT_MS
    return env


@pytest.fixture(params=["redis", "cluster", "sqlite"])
def store_env(
    request: pytest.FixtureRequest, tmp_path: Path, upstream: tuple[FakeUpstream, str]
) -> dict[str, str]:
    """The environment both instances share: one store, one secret, one upstream."""
    _, base = upstream
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return compose_env(cluster.url, base)
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("private_redis")
        url = server.url
    else:
        url = f"sqlite:///{tmp_path / 'shared' / 'compactd.db'}"
    return {
        "COMPACTD_STORE_URL": url,
        "COMPACTD_UPSTREAM_URL": base,
        "COMPACTD_SECRET": "one-secret-for-every-instance",
        "COMPACTD_STORE_TIMEOUT_MS": SLOW_MACHINE_TIMEOUT_MS,
    }


async def test_two_instances_forward_the_same_bytes_and_leave_one_checkpoint_per_event(
    store_env: dict[str, str], upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    fake, _ = upstream
    config = tmp_path / "compactd.toml"
    config.write_text(CONFIG)
    convs = [f"shared-{i}" for i in range(4)]
    ids = itertools.count()
    forwarded: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    actions: dict[tuple[str, int], list[str]] = defaultdict(list)
    statuses: list[int] = []

    async def send(http: httpx.AsyncClient, url: str, conv: str, turn: int) -> None:
        req = str(next(ids))
        r = await http.post(
            f"{url}/v1/chat/completions",
            content=orjson.dumps({"model": "gpt-4o", "messages": history(turn, conv)}),
            headers={
                "authorization": KEY,
                "content-type": "application/json",
                "x-compactd-conversation-id": conv,
                "x-test-request": req,
            },
        )
        statuses.append(r.status_code)
        actions[conv, turn].append(r.headers.get("x-compactd-action", ""))
        forwarded[conv, turn].update(
            x.body for x in fake.received if x.header("x-test-request") == req
        )

    envs = [store_env, store_env]
    args = ("--config", str(config), "--workers", "2")
    async with instances(tmp_path, envs, *args) as (one, two), httpx.AsyncClient() as http:
        urls = [one.url, two.url]
        for turn in TURNS:
            sends = []
            for i, conv in enumerate(convs):
                if turn % 2:  # concurrently: the same request to both instances at once
                    sends += [send(http, u, conv, turn) for u in urls]
                else:  # alternately: consecutive turns land on different instances
                    sends.append(send(http, urls[(turn + i) % 2], conv, turn))
            await asyncio.gather(*sends)
        for conv, url in itertools.product(convs, urls):  # every last turn replayed on both
            await send(http, url, conv, TURNS[-1])
        infos = [
            (
                await http.get(
                    f"{one.url}/compactd/v1/conversations/{c}", headers={"authorization": KEY}
                )
            ).json()
            for c in convs
        ]
        restored = [
            await http.post(
                f"{two.url}/compactd/v1/uncompress",
                json={"messages": orjson.loads(body)["messages"], "recursive": True},
                headers={"authorization": KEY},
            )
            for bodies in forwarded.values()
            for body in bodies
        ]

    assert set(statuses) == {200}
    assert all(len(bodies) == 1 for bodies in forwarded.values())  # same request, same bytes
    for conv, info in zip(convs, infos, strict=True):
        events = [t for t in TURNS if "compacted" in actions[conv, t]]
        assert len(events) >= 2
        assert info["checkpoint_count"] == len(events)  # one checkpoint per compaction event
    concurrent = [k for k, a in actions.items() if k[1] % 2 and "compacted" in a]
    assert concurrent  # some events were raced by both instances at once
    assert all(r.status_code == 200 and r.json()["missing_ids"] == [] for r in restored)
